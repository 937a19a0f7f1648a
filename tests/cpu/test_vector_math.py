"""The prelude's inline float32 math (it vectorizes where a libm call would not) is as
accurate as it says, over the whole range and at the special values."""
from __future__ import annotations

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import DefineKernel

F32 = torch.finfo(torch.float32)


def _ulps(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    return (got.double() - exact).abs() / (F32.eps * exact.abs().clamp_min(F32.tiny))


@pytest.mark.parametrize("name,fn,max_ulps", [("tanh", torch.tanh, 2.0), ("exp", torch.exp, 1.0), ("erf", torch.erf, 2.0)])
def test_float32_vector_math_accuracy(name, fn, max_ulps):
    gen = torch.Generator().manual_seed(11)
    x = torch.cat([torch.linspace(-20, 20, 400_001), torch.randn(200_000, generator=gen) * 4,
                   torch.exp(torch.linspace(-87, 4, 50_000)), -torch.exp(torch.linspace(-87, 4, 50_000))])
    if name == "exp":
        x = x.clamp(-87, 88)
    program = fxwrap.lower(fn, x)
    (source,) = [line.kernel.source for line in program.lines if isinstance(line, DefineKernel)]
    assert f"fx_{name}(" in source and "#pragma omp simd" in source
    got = program.run(x)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert _ulps(got, fn(x.double())).max().item() <= max_ulps


def test_tanh_special_values():
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-30, -1e-30, 0.55, -0.55, 9.0, 30.0])
    program = fxwrap.lower(torch.tanh, torch.randn(11))
    got = program.run(x)
    got = got[0] if isinstance(got, (tuple, list)) else got
    want = torch.tanh(x)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=2e-7, atol=0)
    assert torch.equal(torch.signbit(got), torch.signbit(want))


@pytest.mark.parametrize("name,fn", [("erf", torch.erf), ("exp", torch.exp), ("sigmoid", torch.sigmoid)])
def test_special_values_and_clamp_edges(name, fn):
    """The clamps and range tests work on the float's bits (fx_clamp_bits, fx_u32min): the
    edges of each range, infinities, both NaN signs and signed zeros give eager's values."""
    edges = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), -float("nan"), 1e-30, -1e-30, 1e-45,
             1.0, -1.0, 1.0000001, -1.0000001, 3.9199998, 3.92, -3.92, 3.9200003, 5.0, -5.0,
             88.72, 88.73, 89.0, 89.5, -87.3, -103.9, -104.0, -104.5, -200.0]
    x = torch.tensor(edges)
    program = fxwrap.lower(fn, torch.randn(len(edges)))
    got = program.run(x)
    got = got[0] if isinstance(got, (tuple, list)) else got
    want = fn(x)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=3e-7, atol=0)
    assert torch.equal(torch.signbit(got[~want.isnan()]), torch.signbit(want[~want.isnan()]))


def test_tanh_is_one_past_the_clamp():
    x = torch.tensor([9.5, 10.0, 30.0, float("inf"), -9.5, -10.0, -30.0, -float("inf")])
    program = fxwrap.lower(torch.tanh, torch.randn(8))
    got = program.run(x)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert torch.equal(got, torch.tanh(x)) and torch.equal(got.abs(), torch.ones(8))
