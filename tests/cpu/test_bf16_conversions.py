"""bfloat16 conversions of the C++ target (prelude ``fx_float_to_bf16`` / ``fx_bf16_round``,
and ``fx_bf16_bits``, the store of a float that holds a bf16 value): eager's numbers bit for
bit on special values -- round to nearest even at normal and subnormal magnitudes (no
flush to zero, unlike vcvtneps2bf16), overflow to inf, +-inf, -0, NaN -- in pointwise
kernels and in the GEMM template's epilogue.  NaNs are compared as NaN (eager's vectorized
conversion writes 0xFFFF, fxwrap 0x7FC0 or the NaN it was given).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import DefineKernel

BF16 = torch.bfloat16


def bits16(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16).int() & 0xFFFF


def from_bits(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32).to(torch.int16).view(BF16)


def assert_bitwise_as_eager(got: torch.Tensor, want: torch.Tensor):
    assert got.dtype == want.dtype == BF16
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), f"NaN at {(got.isnan() != nan).nonzero().flatten().tolist()}"
    diff = (bits16(got) != bits16(want)) & ~nan
    assert not diff.any(), (f"at {diff.nonzero().flatten().tolist()[:8]}: eager "
                            f"{[hex(v) for v in bits16(want)[diff][:8].tolist()]}, fxwrap "
                            f"{[hex(v) for v in bits16(got)[diff][:8].tolist()]}")


def special_bf16(n: int, seed: int) -> torch.Tensor:
    """``n`` bf16 values: every special kind (zeros, subnormals at both ends, the largest
    finite, infinities, NaNs), then random normal ones of both signs."""
    specials = [0x0000, 0x8000, 0x0001, 0x8001, 0x0003, 0x0002, 0x007F, 0x807F, 0x0080, 0x0081,
                0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x3F80, 0x3F81, 0xBF83]
    rest = torch.randn(n - len(specials), generator=torch.Generator().manual_seed(seed)).to(BF16)
    return torch.cat([from_bits(specials), rest])


def special_float32() -> torch.Tensor:
    """float32 values whose bf16 rounding is a special case: ties (to even, both ways), the
    carry into the exponent, subnormals (kept, rounded), the overflow edge, +-inf, NaN."""
    bits = [0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x3FFF8000, 0xBF808000, 0x00008000, 0x00018000,
            0x0000FFFF, 0x00007FFF, 0x007FFFFF, 0x80018000, 0x7F7F7FFF, 0x7F7F8000, 0xFF7F8000, 0x7F7FFFFF,
            0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0x00000000, 0x80000000]
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


POINTWISE = {
    # name -> (fn of (x, y) bf16, whose store rounds (False: stores a bf16 value exactly))
    "mul_half": (lambda x, y: x * 0.5, True),          # ties at subnormal magnitudes
    "mul_three": (lambda x, y: x * 3, True),           # overflow to inf
    "add": (lambda x, y: x + y, True),
    "chain": (lambda x, y: (x * 0.5 + y) * 3, True),   # an intermediate rounding (fx_bf16_round)
    "relu": (lambda x, y: torch.relu(x), False),
    "neg_abs_max": (lambda x, y: torch.maximum(-x.abs(), y), False),
    "where": (lambda x, y: torch.where(x > y, x, y.floor()), False),
}


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_bf16_special_values_as_eager(name):
    fn, rounds = POINTWISE[name]
    x, y = special_bf16(96, 1), special_bf16(96, 2).flip(0)
    programs: list = []
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=fxwrap.Backend("cpu", {"on_program": programs.append}))
    assert_bitwise_as_eager(compiled(x, y), fn(x, y))
    (source,) = [ln.kernel.source for p in programs for ln in p.lines if isinstance(ln, DefineKernel)]
    body = source[source.index('extern "C"'):]
    # a value the kernel holds exactly is stored as its high half, with no rounding left
    assert ("fx_float_to_bf16(" in body) == rounds and ("fx_bf16_bits(" in body) == (not rounds)
    if not rounds:
        assert "fx_bf16_round(" not in body


def test_float32_to_bf16_cast_special_values_as_eager():
    f = special_float32()
    fn = lambda f: (f * 1.0).to(BF16)  # noqa: E731
    torch._dynamo.reset()
    got = torch.compile(fn, backend=fxwrap.Backend("cpu"))(f)
    assert_bitwise_as_eager(got, fn(f))
    assert bits16(got)[:6].tolist() == [0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x4000, 0xBF80]  # ties to even, the carry


def test_rounded_then_stored_exactly_keeps_nans():
    """A rounding (fx_bf16_round) then a store of its high half (fx_bf16_bits): a NaN whose
    payload is all in the low half (0x7F800001) must stay a NaN, not become inf."""
    f = special_float32()
    fn = lambda f: torch.relu((f * 1.0).to(BF16))  # noqa: E731
    programs: list = []
    torch._dynamo.reset()
    got = torch.compile(fn, backend=fxwrap.Backend("cpu", {"on_program": programs.append}))(f)
    assert_bitwise_as_eager(got, fn(f))
    (source,) = [ln.kernel.source for p in programs for ln in p.lines if isinstance(ln, DefineKernel)]
    body = source[source.index('extern "C"'):]
    assert "fx_bf16_round(" in body and "fx_bf16_bits(" in body


EPILOGUES = {
    "none": lambda y, r: y,
    "relu": lambda y, r: torch.relu(y),
    "relu_add": lambda y, r: torch.relu(y) + r,
    "gelu": lambda y, r: F.gelu(y),
    "gelu_tanh": lambda y, r: F.gelu(y, approximate="tanh"),
    "silu_add": lambda y, r: F.silu(y) + r,
}


@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
def test_template_epilogue_special_values_as_eager(epilogue):
    """The bias and the residual carry the special values (the product of a zero row is
    +0, so a row shows the bias itself): the epilogue's roundings and conversions as eager.
    Where eager's own GELU/SiLU kernels differ from the math, fxwrap keeps the math (as it
    did before): GELU skips +-inf and +-3.4e38 (eager: NaN, NaN, inf and NaN -- an
    overflow inside), and a subnormal GELU/SiLU result may be eager's 0 (eager flushes it).
    The bias has no subnormals: eager's linear (oneDNN) flushes a subnormal result to zero,
    fxwrap's template keeps it; the residual, added by a plain op in eager too, has them."""
    act = EPILOGUES[epilogue]
    n = 40
    b = special_bf16(n, 3)
    b = torch.where((b != 0) & (b.float().abs() < 2 ** -126), torch.ones_like(b), b)
    if epilogue.startswith("gelu"):
        b = torch.where(b.float().abs() > 1e38, torch.ones_like(b), b)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(12, 24, generator=gen).to(BF16)
    x[::3] = 0  # rows whose product is +0: the output is act(bias)
    w = (torch.randn(n, 24, generator=gen) / 5).to(BF16)
    r = special_bf16(12 * n, 5).reshape(12, n)

    def fn(x, w, b, r):
        return act(F.linear(x, w, b), r)

    programs: list = []
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=fxwrap.Backend("cpu", {"templates": "always", "on_program": programs.append}))
    got, want = compiled(x, w, b, r), fn(x, w, b, r)
    assert [ln for p in programs for ln in p.lines if isinstance(ln, DefineKernel) and "_template_" in ln.kernel.name]
    zero_rows = got[::3], want[::3]
    if epilogue in ("none", "relu", "relu_add"):  # exact arithmetic after the product: bit for bit
        assert_bitwise_as_eager(*zero_rows)
    else:  # transcendental: NaN as NaN, infinities as eager, values to a bf16 step or a subnormal
        assert torch.equal(zero_rows[0].isnan(), zero_rows[1].isnan())
        torch.testing.assert_close(*zero_rows, atol=2 ** -126, rtol=2 ** -7, equal_nan=True)
    # every row: NaN where eager has one, the rest as close as the product's summation order allows
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got, want, atol=1e-2, rtol=2 ** -7, equal_nan=True)
