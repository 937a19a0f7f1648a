"""The numerics pass (``fxwrap.core.numerics.legalize``): the structure of legalized loop
IR, and hand-made kernels with implicit numerics evaluated by the reference target
against eager, op by op.  ``tests/cpu/test_numerics.py`` runs the C++ and Metal-shim
emitters on the same kernels."""
from __future__ import annotations

import pytest
import torch

import fxwrap
from fxwrap.ir.loops import BOOL_RESULT, EXACT_16BIT, LEAVES, Op, OpCode, ScheduledKernel, Store, format_ssa, walk, xvar
from fxwrap.core.numerics import DEFAULT, LOW_PRECISION, Numerics, holds_exact, legalize, numerics_for
from fxwrap.plugins.manager import get_plugin_manager
from fxwrap.targets.reference.emitter import ReferenceLauncher
from fxwrap.ir.lines import Buffer

BF16, F16, F32, F64, I64, I32, BOOL = (torch.bfloat16, torch.float16, torch.float32, torch.float64,
                                       torch.int64, torch.int32, torch.bool)
N = 64
x0 = xvar(0)


def buf(name, dtype):
    return Buffer(name, (N,), (1,), dtype, torch.device("cpu"))


def ld(name, dtype):
    return Op.load(name, x0, dtype)


def op(name, dtype, *src):
    return Op(name, dtype, src)


def kernel(inputs: dict, stores: dict) -> ScheduledKernel:
    """``stores``: ``{out_name: (value, out_dtype)}``."""
    return ScheduledKernel("k", tuple(buf(n, d) for n, d in inputs.items()),
                           tuple(buf(n, d) for n, (_, d) in stores.items()), (), (N,), (), (),
                           tuple(Store(n, x0, v) for n, (v, _) in stores.items()))


def ssa(k: ScheduledKernel) -> list[str]:
    return format_ssa([s.value for s in k.stores])


def assert_legal(k: ScheduledKernel, numerics: Numerics = DEFAULT) -> None:
    """What every emitter may rely on after the pass."""
    for node in walk(*[s.value for s in k.stores], *[r.value for r in k.reductions]):
        if node.op in LEAVES or node.op == OpCode.CAST:
            if node.op == OpCode.CAST:
                assert node.src[0].dtype != node.dtype, node
            continue
        dts = [s.dtype for s in node.src]
        compute = dts[-1] if node.op in BOOL_RESULT else node.dtype
        if compute in LOW_PRECISION:  # only ops exact in the 16-bit type stay in it
            assert node.op in EXACT_16BIT, node
        else:
            assert numerics.compute_dtype(compute) == compute, node
        want = [BOOL, compute, compute] if node.op == OpCode.WHERE else [compute] * len(dts)
        assert dts == want, node


def test_bf16_add_is_computed_in_float32_and_rounded_back():
    k = kernel({"a": BF16, "b": BF16}, {"o": (op("add", BF16, ld("a", BF16), ld("b", BF16)), BF16)})
    got = legalize(k)
    assert ssa(got) == ["%0 = load.bf16 a[x0]", "%1 = cast.f32 %0", "%2 = load.bf16 b[x0]",
                        "%3 = cast.f32 %2", "%4 = add.f32 %1 %3", "%5 = cast.bf16 %4"]
    assert_legal(got)
    assert legalize(got) is got  # legal IR is left as it is (the same object)


def test_exact_16bit_ops_stay_in_their_type():
    """A ``cat``/``pad`` of bf16 (``where`` over masked loads) needs no rounding: unchanged."""
    a, b, m = ld("a", BF16), ld("b", BF16), ld("m", BOOL)
    k = kernel({"a": BF16, "b": BF16, "m": BOOL},
               {"o": (op("where", BF16, m, op("maximum", BF16, a, op("neg", BF16, b)), b), BF16)})
    assert legalize(k) is k
    mixed = kernel({"a": BF16, "c": F32}, {"o": (op("maximum", BF16, a, ld("c", F32)), BF16)})
    assert ssa(legalize(mixed))[-2:] == ["%3 = maximum.f32 %1 %2", "%4 = cast.bf16 %3"]


def test_chain_rounds_after_every_16bit_op_like_eager():
    a, b = ld("a", F16), ld("b", F16)
    k = kernel({"a": F16, "b": F16}, {"o": (op("exp", F16, op("mul", F16, a, b)), F16)})
    lines = ssa(legalize(k))
    assert lines[4:] == ["%4 = mul.f32 %1 %3", "%5 = cast.f16 %4", "%6 = cast.f32 %5",
                         "%7 = exp.f32 %6", "%8 = cast.f16 %7"]


def test_promotion_comparison_where_and_store_casts_are_explicit():
    a, b, i, c = ld("a", BF16), ld("b", F64), ld("i", I32), ld("c", F32)
    lt = op("lt", BOOL, a, b)                                   # bf16 < f64: compared in f64
    sel = op("where", F32, op("gt", BOOL, i, c), c, i)          # branches of mixed dtype
    shl = op("lshift", I64, i, Op.const(2, I32))               # integer operands promoted
    k = kernel({"a": BF16, "b": F64, "i": I32, "c": F32},
               {"o": (lt, BOOL), "p": (sel, F16), "q": (shl, I64)})
    got = legalize(k)
    assert_legal(got)
    text = "\n".join(ssa(got))
    assert "cast.f64 %0" in text and "lt.bool" in text
    # where(i > c, c, i) stored to an fp16 buffer: the store's rounding is a cast
    assert got.stores[1].value.op == OpCode.CAST and got.stores[1].value.dtype == F16
    assert got.stores[2].value.src[1].dtype == I64


def test_metal_numerics_compute_float64_in_float32():
    session = get_plugin_manager().session(get_plugin_manager().target("mps_shim"))
    numerics = session.numerics
    assert numerics.compute_dtype(F64) == F32 and numerics.compute_dtype(BF16) == F32
    assert numerics_for(get_plugin_manager().session(get_plugin_manager().target("cpu")).kernel_dtypes
                        ).compute_dtype(F64) == F64
    x = ld("x", F32)
    value = op("cast", F32, op("mul", F64, op("cast", F64, x), Op.const(1.1, F64)))
    got = legalize(kernel({"x": F32}, {"o": (value, F32)}), numerics)
    assert ssa(got) == ["%0 = load.f32 x[x0]", "%1 = const.f32 1.100000023841858", "%2 = mul.f32 %0 %1"]
    assert_legal(got, numerics)


def _run_reference(k: ScheduledKernel, inputs: dict) -> dict:
    outs = {b.name: torch.empty(N, dtype=b.dtype) for b in k.outputs}
    ReferenceLauncher(legalize(k))(*[inputs[b.name] for b in k.inputs], *outs.values())
    return outs


def _inputs(g):
    base = torch.randn(N, generator=g, dtype=F64) * 4
    return {"h": base.to(F16), "bf": (base * 3).to(BF16), "d": base * 1.0000001, "f": base.float() / 3,
            "i": torch.randint(-50, 50, (N,), generator=g), "m": torch.rand(N, generator=g) > 0.5,
            "q": (torch.randn(N, generator=g) * 2 + 0.25).to(BF16)}


# (name, value over the loads, output dtype, eager op by op)
def _cases():
    h, bf, d, f, i, m, q = (ld("h", F16), ld("bf", BF16), ld("d", F64), ld("f", F32), ld("i", I64),
                            ld("m", BOOL), ld("q", BF16))
    return [
        ("h_add_mul", op("add", F16, h, op("mul", F16, h, Op.const(0.1, F16))), F16,
         lambda t: t["h"] + t["h"] * torch.tensor(0.1, dtype=F16)),
        ("bf_exp_sq", op("exp", BF16, op("mul", BF16, bf, bf)), BF16, lambda t: torch.exp(t["bf"] * t["bf"])),
        ("bf_div", op("truediv", BF16, bf, q), BF16, lambda t: t["bf"] / t["q"]),
        ("bf_floordiv", op("floordiv", BF16, bf, q), BF16,
         lambda t: torch.div(t["bf"], t["q"], rounding_mode="floor")),
        ("bf_truncdiv", op("truncdiv", BF16, bf, q), BF16,
         lambda t: torch.div(t["bf"], t["q"], rounding_mode="trunc")),
        ("bf_max_where", op("where", BF16, m, op("maximum", BF16, bf, q), op("neg", BF16, q)), BF16,
         lambda t: torch.where(t["m"], torch.maximum(t["bf"], t["q"]), -t["q"])),
        ("cmp_bf_f64", op("lt", BOOL, bf, d), BOOL, lambda t: t["bf"] < t["d"]),
        ("cmp_i_h", op("ge", BOOL, i, h), BOOL, lambda t: t["i"] >= t["h"]),
        ("f64_to_bf", op("cast", BF16, d), BF16, lambda t: t["d"].to(BF16)),
        ("bool_to_h", op("cast", F16, m), F16, lambda t: t["m"].to(F16)),
        ("int_plus_f", op("add", F32, i, f), F32, lambda t: t["i"] + t["f"]),
        ("bool_mul_f64", op("mul", F64, m, d), F64, lambda t: t["m"] * t["d"]),
        ("i_shift_bool", op("lshift", I64, i, m), I64, lambda t: t["i"] << t["m"].long()),
        ("f_store_h", op("add", F32, op("cast", F32, h), Op.const(1e-4, F32)), F16,
         lambda t: (t["h"].float() + 1e-4).half()),
    ]


def numeric_kernel():
    cases = _cases()
    ins = {"h": F16, "bf": BF16, "d": F64, "f": F32, "i": I64, "m": BOOL, "q": BF16}
    return kernel(ins, {name: (v, dt) for name, v, dt, _ in cases}), cases


def test_reference_runs_the_legalized_ir_like_eager():
    k, cases = numeric_kernel()
    assert_legal(legalize(k))
    t = _inputs(torch.Generator().manual_seed(1))
    got = _run_reference(k, t)
    for name, _, dt, fn in cases:
        want = fn(t).to(dt)
        torch.testing.assert_close(got[name], want, rtol=0, atol=0, equal_nan=True, msg=lambda m, n=name: f"{n}: {m}")


def test_reference_rejects_unlegalized_ir():
    k = kernel({"a": BF16}, {"o": (op("add", BF16, ld("a", BF16), ld("a", BF16)), BF16)})
    a = torch.randn(N).to(BF16)
    ReferenceLauncher(legalize(k))(a, torch.empty(N, dtype=BF16))
    with pytest.raises(NotImplementedError, match="not legalized"):
        ReferenceLauncher(k)(a, torch.empty(N, dtype=BF16))


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_lowered_programs_are_already_legal(dtype):
    """The lowerings spell compute dtypes and rounding out themselves: the pass leaves
    their kernels as they are (so kernel sources did not change when it came)."""
    programs = []
    fn = lambda x, y: ((x * y + x.sigmoid()) / 3, x > y, torch.where(x > 0, x, y).sum(-1))  # noqa: E731
    x, y = torch.randn(8, 8).to(dtype), torch.randn(8, 8).to(dtype)
    compiled = torch.compile(fn, backend=fxwrap.Backend("reference", {"on_program": programs.append}))
    for got, want in zip(compiled(x, y), fn(x, y)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    kernels = [line.kernel for p in programs for line in p.lines if type(line).__name__ == "DefineKernel"]
    assert kernels
    for kern in kernels:
        sk = getattr(kern.launch, "kernel", None)  # the reference target's ReferenceLaunch
        if sk is not None:
            assert legalize(sk) is sk
            assert_legal(sk)


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_holds_exact_follows_exact_ops_of_16bit_values(dtype):
    """``holds_exact``: a float32 value that is a 16-bit value for every input (a read-back,
    a constant of the type, an ``EXACT_16BIT`` op of them) -- and nothing else."""
    a = op("cast", F32, ld("a", dtype))                     # a 16-bit load, read back
    b = op("cast", F32, op("cast", dtype, ld("f", F32)))    # a rounding, read back
    rounded_other = op("cast", F32, ld("h", F16 if dtype == BF16 else BF16))
    relu = op("maximum", F32, a, Op.const(0.0, F32))
    cond = op("gt", BOOL, a, b)
    exact = [a, b, relu, op("neg", F32, relu), op("abs", F32, b), op("where", F32, cond, a, op("floor", F32, b)),
             op("minimum", F32, a, Op.const(float("inf"), F32)), Op.const(float("nan"), F32), Op.const(-0.0, F32)]
    inexact = [ld("f", F32), rounded_other, op("add", F32, a, b), op("mul", F32, a, Op.const(0.5, F32)),
               op("maximum", F32, a, Op.const(0.1, F32)), op("where", F32, cond, a, ld("f", F32)),
               op("maximum", F32, a, Op.const(65536.0 * 3 + 1, F32))]
    assert [holds_exact(v, dtype) for v in exact] == [True] * len(exact)
    assert [holds_exact(v, dtype) for v in inexact] == [False] * len(inexact)
    assert not holds_exact(ld("a", dtype), dtype)  # a 16-bit value itself is not a float32 one
    assert not holds_exact(a, F32)                  # exact in float32 means nothing
