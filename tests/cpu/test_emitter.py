"""C++ emitter: every loop-IR op against eager PyTorch, pointwise layouts, index math.

Each test builds ``ScheduledKernel``s by hand, renders and compiles them, runs them on
fresh random tensors and compares with the eager computation.  To keep compiles few,
one kernel holds many ops: row ``i`` of an output is op ``i`` applied to the inputs.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import sympy
import torch
from torch.utils._sympy.functions import CeilDiv, FloorDiv, Max, Min, ModularIndexing, PythonMod

from emitter_helpers import (Store, acc, buf, build, cast, const, emitter, kernel, ld, op, rand,
                             s0, s1, x0, x1)
from fxwrap.ir.loops import BINARY, UNARY, Op, Reduction
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.targets.cstyle import CStyleEmitter, EmitError

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
N = 1031  # odd: exercises the vector tails

FLOAT_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2,
    "expm1": torch.expm1, "log": torch.log, "log2": torch.log2, "log10": torch.log10,
    "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin,
    "cos": torch.cos, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
    "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "erf": torch.erf,
    "erfc": torch.erfc, "erfinv": torch.erfinv, "floor": torch.floor, "ceil": torch.ceil,
    "round": torch.round, "trunc": torch.trunc, "sigmoid": torch.sigmoid, "sign": torch.sign,
    "reciprocal": torch.reciprocal,
}
PREDICATES = {"isnan": torch.isnan, "isinf": torch.isinf, "signbit": torch.signbit,
              "logical_not": torch.logical_not}
FLOAT_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.div,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "mod": torch.remainder, "fmod": torch.fmod, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "atan2": torch.atan2,
    "copysign": torch.copysign,
}
COMPARE = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq,
           "ne": torch.ne, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
           "logical_xor": torch.logical_xor}
INT_UNARY = {"neg": torch.neg, "abs": torch.abs, "sign": torch.sign,
             "bitwise_not": torch.bitwise_not, "floor": torch.floor, "ceil": torch.ceil,
             "round": torch.round, "trunc": torch.trunc}
INT_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "mod": torch.remainder, "fmod": torch.fmod, "maximum": torch.maximum,
    "minimum": torch.minimum, "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
}

SPECIALS = [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, float("inf"), float("-inf"),
            float("nan"), 0.999, -0.999, 1e-30, 3.0, -7.25, 1e-3]


def test_tables_cover_the_ir():
    """Every op of fxwrap.ir.loops has a rendering, and these tests exercise all of them."""
    tested = (set(FLOAT_UNARY) | set(PREDICATES) | set(FLOAT_BINARY) | set(COMPARE)
              | set(INT_UNARY) | set(INT_BINARY) | {"lshift", "rshift", "pow", "cast", "where"})
    assert UNARY | BINARY <= tested
    assert UNARY | BINARY - {"cast"} <= set(CppEmitter.code_for_op) | {"cast"}


def _float_inputs(dtype):
    x = rand(N, F64)
    x[: len(SPECIALS)] = torch.tensor(SPECIALS, dtype=F64)
    a, b = rand(N, F64), rand(N, F64)
    k = len(SPECIALS)
    sp = torch.tensor(SPECIALS, dtype=F64)
    a[:k], b[:k] = sp, sp.roll(3)
    a[k:2 * k], b[k:2 * k] = sp.roll(5), sp
    # exact multiples and halves: the edges of floor/trunc division and remainder
    b[2 * k:3 * k] = torch.tensor([0.5, -0.5, 2.0, -3.0, 0.1, 7.0] * 3)[:k].double()
    a[2 * k:3 * k] = b[2 * k:3 * k] * torch.arange(-9, 9)[:k].double()
    return x.to(dtype), a.to(dtype), b.to(dtype)


@pytest.mark.parametrize("dtype", [F32, F64, BF16])
def test_float_ops_match_eager(dtype):
    un, bi = list(FLOAT_UNARY), list(FLOAT_BINARY)
    pr, cm = list(PREDICATES), list(COMPARE)
    X, A, B = (ld(n, x0, dtype) for n in ("x", "a", "b"))
    stores = [Store("fu", i * N + x0, op(n, dtype, X)) for i, n in enumerate(un)]
    stores += [Store("fb", i * N + x0, op(n, dtype, A, B)) for i, n in enumerate(bi)]
    stores += [Store("pr", i * N + x0, op(n, torch.bool, X)) for i, n in enumerate(pr)]
    stores += [Store("cm", i * N + x0, op(n, torch.bool, A, B)) for i, n in enumerate(cm)]
    outs = [buf("fu", (len(un), N), dtype), buf("fb", (len(bi), N), dtype),
            buf("pr", (len(pr), N), torch.bool), buf("cm", (len(cm), N), torch.bool)]
    if dtype == BF16:
        # the lowering's spelling: upcast, compute in float32, round back on the way out
        def up(o):
            return cast(o, F32)
        stores += [Store("fu2", i * N + x0, cast(op(n, F32, up(X)), BF16)) for i, n in enumerate(un)]
        stores += [Store("fb2", i * N + x0, cast(op(n, F32, up(A), up(B)), BF16))
                   for i, n in enumerate(bi)]
        outs += [buf("fu2", (len(un), N), BF16), buf("fb2", (len(bi), N), BF16)]
    k = kernel(f"ops_{str(dtype)[6:]}", [buf(n, (N,), dtype) for n in "xab"], outs, stores, ranges=(N,))
    launch, src = build(k)
    x, a, b = _float_inputs(dtype)
    got = [torch.empty(tuple(int(d) for d in o.size), dtype=o.dtype) for o in outs]
    launch(x, a, b, *got)
    for i, n in enumerate(un):
        want = FLOAT_UNARY[n](x)
        torch.testing.assert_close(got[0][i], want, equal_nan=True, msg=lambda m, n=n: f"{n}: {m}")
        if dtype == BF16:
            want = FLOAT_UNARY[n](x.float()).to(BF16)
            torch.testing.assert_close(got[4][i], want, equal_nan=True, msg=lambda m, n=n: f"{n}: {m}")
    for i, n in enumerate(bi):
        want = FLOAT_BINARY[n](a, b)
        torch.testing.assert_close(got[1][i], want, equal_nan=True, msg=lambda m, n=n: f"{n}: {m}")
        if dtype == BF16:  # computed in float32: float32 semantics, rounded once
            want = FLOAT_BINARY[n](a.float(), b.float()).to(BF16)
            torch.testing.assert_close(got[5][i], want, equal_nan=True, msg=lambda m, n=n: f"{n}: {m}")
    for i, n in enumerate(pr):
        assert torch.equal(got[2][i], PREDICATES[n](x)), n
    for i, n in enumerate(cm):
        assert torch.equal(got[3][i], COMPARE[n](a, b)), n
    # the division family is exact (same algorithm as eager), not just close
    for n in ("floordiv", "truncdiv", "mod", "fmod"):
        want = FLOAT_BINARY[n](a, b)
        same = (got[1][bi.index(n)] == want) | (want.isnan() & got[1][bi.index(n)].isnan())
        assert bool(same.all()), n
    # rounding-type ops are exact too (round is half to even)
    for n in ("floor", "ceil", "round", "trunc", "sign", "neg", "abs"):
        want, have = FLOAT_UNARY[n](x), got[0][un.index(n)]
        assert bool(((have == want) | (want.isnan() & have.isnan())).all()), n


def test_erfinv_accuracy_float64():
    """erfinv (own implementation) against torch at float64 tolerance, tails included."""
    y = torch.cat([torch.linspace(-1, 1, 2001, dtype=F64)[1:-1],
                   1 - torch.logspace(-15, -1, 50, dtype=F64), -(1 - torch.logspace(-15, -1, 50, dtype=F64)),
                   torch.logspace(-300, -1, 50, dtype=F64), torch.tensor([0.0, -0.0, 1.0, -1.0, 1.5, float("nan")], dtype=F64)])
    n = y.numel()
    k = kernel("erfinv64", [buf("y", (n,), F64)], [buf("o", (n,), F64)],
               [Store("o", x0, op("erfinv", F64, ld("y", x0, F64)))], ranges=(n,))
    launch, _ = build(k)
    out = torch.empty(n, dtype=F64)
    launch(y, out)
    torch.testing.assert_close(out, torch.erfinv(y), rtol=1e-13, atol=1e-300, equal_nan=True)
    assert torch.equal(out[-6:-2].signbit(), torch.tensor([False, True, False, True]))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_int_ops_match_eager(dtype):
    un, bi, cm = list(INT_UNARY), list(INT_BINARY), list(COMPARE)
    A, B, E, S = (ld(n, x0, dtype) for n in ("a", "b", "e", "sh"))
    stores = [Store("iu", i * N + x0, op(n, dtype, A)) for i, n in enumerate(un)]
    stores += [Store("ib", i * N + x0, op(n, dtype, A, B)) for i, n in enumerate(bi)]
    stores += [Store("ib", (len(bi) + 0) * N + x0, op("pow", dtype, A, E)),
               Store("ib", (len(bi) + 1) * N + x0, op("lshift", dtype, A, S)),
               Store("ib", (len(bi) + 2) * N + x0, op("rshift", dtype, A, S))]
    stores += [Store("cm", i * N + x0, op(n, torch.bool, A, B)) for i, n in enumerate(cm)]
    stores += [Store("pr", i * N + x0, op(n, torch.bool, A)) for i, n in enumerate(PREDICATES)]
    outs = [buf("iu", (len(un), N), dtype), buf("ib", (len(bi) + 3, N), dtype),
            buf("cm", (len(cm), N), torch.bool), buf("pr", (len(PREDICATES), N), torch.bool)]
    ins = [buf(n, (N,), dtype) for n in ("a", "b", "e", "sh")]
    launch, _ = build(kernel(f"iops_{str(dtype)[6:]}", ins, outs, stores, ranges=(N,)))
    signed = dtype.is_signed
    bits = torch.iinfo(dtype).bits
    big = 100 if bits == 8 else 100000
    a = rand(N, dtype, -big if signed else 0, big)
    b = rand(N, dtype, -20 if signed else 1, 20)
    b[b == 0] = 3
    e = rand(N, dtype, -3 if signed else 0, 9)
    sh = rand(N, dtype, -2 if signed else 0, bits + 2)
    got = [torch.empty(tuple(int(d) for d in o.size), dtype=o.dtype) for o in outs]
    launch(a, b, e, sh, *got)
    for i, n in enumerate(un):
        assert torch.equal(got[0][i], INT_UNARY[n](a)), n
    for i, n in enumerate(bi):
        assert torch.equal(got[1][i], INT_BINARY[n](a, b)), n
    assert torch.equal(got[1][len(bi)], torch.pow(a, e)), "pow"
    assert torch.equal(got[1][len(bi) + 1], torch.bitwise_left_shift(a, sh)), "lshift"
    assert torch.equal(got[1][len(bi) + 2], torch.bitwise_right_shift(a, sh)), "rshift"
    for i, n in enumerate(cm):
        assert torch.equal(got[2][i], COMPARE[n](a, b)), n
    for i, n in enumerate(PREDICATES):
        assert torch.equal(got[3][i], PREDICATES[n](a)), n


def test_int_division_by_zero_does_not_trap():
    """Eager raises; a kernel cannot, so it yields 0 (and never kills the process)."""
    I64 = torch.int64
    A, B = ld("a", x0, I64), ld("b", x0, I64)
    names = ["floordiv", "truncdiv", "mod", "fmod"]
    k = kernel("idiv0", [buf("a", (8,), I64), buf("b", (8,), I64)], [buf("o", (4, 8), I64)],
               [Store("o", i * 8 + x0, op(n, I64, A, B)) for i, n in enumerate(names)], ranges=(8,))
    launch, _ = build(k)
    a = torch.tensor([5, -5, 7, 0, -(2 ** 63), -(2 ** 63), 9, -9])
    b = torch.tensor([0, 0, 0, 0, -1, 0, -1, -1])
    out = torch.full((4, 8), 99, dtype=I64)
    launch(a, b, out)
    nz = b != 0
    assert bool((out[:, ~nz] == 0).all())
    assert out[:, nz].tolist() == [[-(2 ** 63), -9, 9], [-(2 ** 63), -9, 9], [0, 0, 0], [0, 0, 0]]


def test_bool_ops_match_eager():
    BOOL = torch.bool
    P, Q = ld("p", x0, BOOL), ld("q", x0, BOOL)
    FA, FB = ld("fa", x0, F32), ld("fb", x0, F32)
    rows = {
        "logical_and": (op("logical_and", BOOL, P, Q), torch.logical_and),
        "logical_or": (op("logical_or", BOOL, P, Q), torch.logical_or),
        "logical_xor": (op("logical_xor", BOOL, P, Q), torch.logical_xor),
        "logical_not": (op("logical_not", BOOL, P), lambda p, q: torch.logical_not(p)),
        "bitwise_and": (op("bitwise_and", BOOL, P, Q), torch.bitwise_and),
        "bitwise_or": (op("bitwise_or", BOOL, P, Q), torch.bitwise_or),
        "bitwise_xor": (op("bitwise_xor", BOOL, P, Q), torch.bitwise_xor),
        "bitwise_not": (op("bitwise_not", BOOL, P), lambda p, q: torch.bitwise_not(p)),
        "eq": (op("eq", BOOL, P, Q), torch.eq), "ne": (op("ne", BOOL, P, Q), torch.ne),
        "add": (op("add", BOOL, P, Q), torch.add), "mul": (op("mul", BOOL, P, Q), torch.mul),
        "maximum": (op("maximum", BOOL, P, Q), torch.maximum),
        "minimum": (op("minimum", BOOL, P, Q), torch.minimum),
        "lt": (op("lt", BOOL, P, Q), torch.lt),
    }
    names = list(rows)
    stores = [Store("o", i * N + x0, rows[n][0]) for i, n in enumerate(names)]
    stores += [Store("o", len(names) * N + x0, cast(FA, BOOL)),
               Store("w", x0, op("where", F32, P, FA, FB)),
               Store("w", N + x0, cast(P, F32)),
               Store("w", 2 * N + x0, op("where", F32, op("lt", BOOL, FA, FB), FA, const(-1.5)))]
    k = kernel("boolops", [buf("p", (N,), BOOL), buf("q", (N,), BOOL), buf("fa", (N,)), buf("fb", (N,))],
               [buf("o", (len(names) + 1, N), BOOL), buf("w", (3, N))], stores, ranges=(N,))
    launch, _ = build(k)
    p, q, fa, fb = rand(N, BOOL), rand(N, BOOL), rand(N), rand(N)
    fa[::7] = 0.0
    fa[3] = float("nan")
    o, w = torch.empty(len(names) + 1, N, dtype=BOOL), torch.empty(3, N)
    launch(p, q, fa, fb, o, w)
    for i, n in enumerate(names):
        assert torch.equal(o[i], rows[n][1](p, q)), n
    assert torch.equal(o[len(names)], fa.to(BOOL))
    torch.testing.assert_close(w[0], torch.where(p, fa, fb), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(w[1], p.float())
    torch.testing.assert_close(w[2], torch.where(fa < fb, fa, torch.tensor(-1.5)), rtol=0, atol=0,
                               equal_nan=True)


CASTS = [  # (input, destination dtype)
    ("f32", torch.int64), ("f32", torch.int32), ("f32", torch.int8), ("f32", torch.uint8),
    ("f32", torch.bool), ("f32", F64), ("f32", BF16), ("f32", F16), ("f64", F32), ("f64", BF16),
    ("f64", F16), ("f64", torch.int64), ("bf16", F32), ("bf16", F16), ("bf16", torch.int32),
    ("f16", F32), ("f16", BF16), ("i64", F32), ("i64", BF16), ("i64", torch.int8),
    ("i64", torch.uint8), ("i64", F64), ("u8", torch.int64), ("u8", F32), ("bool", F32),
    ("bool", torch.int64), ("i32", F16),
]
SRC = {"f32": F32, "f64": F64, "bf16": BF16, "f16": F16, "i64": torch.int64, "u8": torch.uint8,
       "bool": torch.bool, "i32": torch.int32}


def test_casts_and_16bit_storage():
    stores, outs = [], []
    for i, (src, dst) in enumerate(CASTS):
        stores.append(Store(f"o{i}", x0, cast(ld(src, x0, SRC[src]), dst)))
        outs.append(buf(f"o{i}", (N,), dst))
    # arithmetic in 16-bit dtypes: computed in float32, rounded once per op
    H, Bf = ld("f16", x0, F16), ld("bf16", x0, BF16)
    extra = [("h_add", op("add", F16, H, op("mul", F16, H, const(0.1, F16))), F16),
             ("b_mul", op("mul", BF16, Bf, const(0.1, BF16)), BF16),
             ("b_exp", op("exp", BF16, op("mul", BF16, Bf, Bf)), BF16),
             ("h_store_f32", op("add", F32, cast(H, F32), const(1e-4)), F16)]
    for name, value, dt in extra:
        stores.append(Store(name, x0, value))
        outs.append(buf(name, (N,), dt))
    ins = [buf(n, (N,), SRC[n]) for n in SRC]
    launch, _ = build(kernel("casts", ins, outs, stores, ranges=(N,)))
    t = {"f32": rand(N, F32, -100, 100), "f64": rand(N, F64, -100, 100) * 1.0000001,
         "bf16": rand(N, BF16, -100, 100), "f16": rand(N, F16, -8, 8),
         "i64": rand(N, torch.int64, -100000, 100000), "u8": rand(N, torch.uint8, 0, 255),
         "bool": rand(N, torch.bool), "i32": rand(N, torch.int32, -5000, 5000)}
    t["f32"][:6] = torch.tensor([-3.7, 300.5, -0.0, 0.0, 1e-40, 65519.0])
    t["f64"][:4] = torch.tensor([1.0 + 2 ** -9 + 2 ** -40, -(1.0 + 2 ** -9 + 2 ** -40),
                                 1.0 + 2 ** -12 + 2 ** -30, 2.0 ** -20], dtype=F64)
    got = [torch.empty(N, dtype=o.dtype) for o in outs]
    launch(*[t[n] for n in SRC], *got)
    for i, (src, dst) in enumerate(CASTS):
        want = t[src].to(dst)
        assert torch.equal(got[i], want), f"{src} -> {dst}: {got[i][:8]} vs {want[:8]}"
    h, bf = t["f16"], t["bf16"]
    want = [h + h * torch.tensor(0.1, dtype=F16), bf * torch.tensor(0.1, dtype=BF16),
            torch.exp(bf * bf), (h.float() + 1e-4).half()]
    for j, w in enumerate(want):
        torch.testing.assert_close(got[len(CASTS) + j], w, rtol=0, atol=0,
                                   msg=lambda m, j=j: f"{extra[j][0]}: {m}")


def test_soft_half_conversions_are_exact():
    """The fp16 fallback (no _Float16): every half -> float, and float -> half rounding."""
    em = emitter()
    k = kernel("soft_half", [buf("h", (65536,), F16), buf("f", (s0,), F32)],
               [buf("hf", (65536,), F32), buf("fh", (s0,), F16)],
               [Store("hf", x0, cast(ld("h", x0, F16), F32)),
                Store("fh", x0, cast(ld("f", x0, F32), F16))], ranges=(65536,), sizes=(s0,))
    # the second store covers only 65536 floats; a hand loop adds the rest (s0 of them)
    text = em.render(k).text
    loop = text.rindex("}")
    text = (text[:loop] + "  for (int64_t i = 0; i < s0; ++i) out_ptr1[i] = fx_float_to_half(in_ptr1[i]);\n"
            + text[loop:])
    assert "fx_float_to_half" in text
    from fxwrap.targets.host.compiler import default_compiler
    from fxwrap.targets.host.loader import c_function, load_library, make_launcher
    path = default_compiler().compile(text, extra_flags=("-DFX_SOFT_HALF",))
    fn = c_function(load_library(path), "soft_half", 4, 1)
    launch = make_launcher(fn, 4, 1)
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(F16)
    g = torch.Generator().manual_seed(0)
    f = torch.randint(-2 ** 31, 2 ** 31, (200000,), generator=g, dtype=torch.int64).to(torch.int32).view(F32)
    f = f[(f.abs() < 70000) | f.isnan() | f.isinf()]
    edges = torch.tensor([65504.0, 65519.996, 65520.0, 65536.0, 2.0 ** -24, 2.0 ** -25,
                          1.5 * 2.0 ** -25, 2.0 ** -25 * 1.0000001, 2.0 ** -14, 2.0 ** -14 * (1 - 2 ** -12),
                          -2.0 ** -24, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 0.0, -0.0,
                          float("inf"), float("-inf"), float("nan")], dtype=F32)
    f = torch.cat([edges, f, torch.linspace(-70000, 70000, 100001)])
    hf, fh = torch.empty(65536), torch.empty(f.numel(), dtype=F16)
    launch(bits, f, hf, fh, f.numel())
    want = bits.float()
    assert torch.equal(hf.isnan(), want.isnan())
    assert torch.equal(hf[~want.isnan()].view(torch.int32), want[~want.isnan()].view(torch.int32))
    want_h = f.half()
    nan = want_h.isnan()
    assert torch.equal(fh.isnan(), nan)
    assert torch.equal(fh[~nan].view(torch.int16), want_h[~nan].view(torch.int16))


def test_pointwise_strided_inputs():
    """Transposed, sliced (storage offset), broadcast (stride 0) and scalar inputs."""
    M, K = 37, 29
    a_t = buf("a_t", (M, K), stride=(1, M))                         # (K, M).t()
    b_s = buf("b_s", (M, K), stride=(2 * K + 1, 2))                  # base[:, 1::2]
    c_b = buf("c_b", (M, K), stride=(0, 1))                          # (K,) expanded
    sc = buf("sc", (1,))
    out = buf("out", (M, K))
    idx = {n: b.stride[0] * x0 + b.stride[1] * x1 for n, b in
           (("a_t", a_t), ("b_s", b_s), ("c_b", c_b))}
    v = op("sub", F32, op("add", F32, ld("a_t", idx["a_t"]),
                          op("mul", F32, ld("b_s", idx["b_s"]), ld("c_b", idx["c_b"]))),
           ld("sc", 0))
    launch, src = build(kernel("strided", [a_t, b_s, c_b, sc], [out],
                               [Store("out", K * x0 + x1, v)], ranges=(M, K)))
    base_a = rand((K, M))
    base_b = rand((M, 2 * K + 1))
    c = rand(K)
    s = rand(1)
    at, bs, cb = base_a.t(), base_b[:, 1::2], c.expand(M, K)
    assert bs.storage_offset() == 1 and cb.stride() == (0, 1)
    o = torch.empty(M, K)
    launch(at, bs, cb, s, o)
    torch.testing.assert_close(o, at + bs * cb - s, rtol=0, atol=0)
    # a scalar load is hoisted out of the loops; the store is contiguous -> simd
    body = src.text[src.text.index('extern "C"'):]
    assert body.index("in_ptr3[0]") < body.index("for (")
    assert "#pragma omp simd" in body


def test_size_symbols_two_sizes():
    """ranges (s0, 64) and (s0, s1): one compiled kernel, several sizes (incl. parallel)."""
    k = kernel("dyn", [buf("x", (s0, s1))], [buf("y", (s0, s1))],
               [Store("y", s1 * x0 + x1, op("mul", F32, op("maximum", F32, ld("x", s1 * x0 + x1), const(0.0)),
                                            const(2.0)))], ranges=(s0, s1), sizes=(s0, s1))
    launch, src = build(k)
    assert "const int64_t s0, const int64_t s1" in src.text
    for m, n in [(3, 64), (1000, 64), (5, 3000), (2, 1), (1, 1)]:
        x = rand((m, n))
        y = torch.full((m, n), float("nan"))
        launch(x, y, m, n)
        assert torch.equal(y, torch.relu(x) * 2), (m, n)
    k2 = kernel("dyn64", [buf("x", (s0, 64))], [buf("y", (s0, 64))],
                [Store("y", 64 * x0 + x1, op("exp", F32, ld("x", 64 * x0 + x1)))],
                ranges=(s0, 64), sizes=(s0,))
    launch2, src2 = build(k2)
    assert "if (64*s0 >= 32768)" in src2.text
    for m in (3, 2000):
        x = rand((m, 64))
        y = torch.empty(m, 64)
        launch2(x, y, m)
        torch.testing.assert_close(y, torch.exp(x))


def test_index_math_and_masked_load():
    """FloorDiv / ModularIndexing / Mod / Max / Min / CeilDiv, incl. negative operands."""
    I64 = torch.int64
    n = 40
    exprs = [FloorDiv(x0 - 5, 3), FloorDiv(x0, 3), ModularIndexing(x0, 3, 4), PythonMod(x0 - 7, 5),
             Max(x0 - 3, 0), Min(x0 + 2, n - 1), CeilDiv(x0, 4), 3 * x0 - 2 * FloorDiv(x0, 7)]
    py = [lambda i: (i - 5) // 3, lambda i: i // 3, lambda i: (i // 3) % 4, lambda i: (i - 7) % 5,
          lambda i: max(i - 3, 0), lambda i: min(i + 2, n - 1), lambda i: -(-i // 4),
          lambda i: 3 * i - 2 * (i // 7)]
    stores = [Store("o", i * n + x0, Op.index(e)) for i, e in enumerate(exprs)]
    # gather through index math: a transpose of a (5, 8) tensor, read as flat (40,)
    stores.append(Store("g", x0, ld("x", ModularIndexing(x0, 1, 5) * 8 + FloorDiv(x0, 5))))
    # masked load: reads x[i - 1] only where i > 0 (index -1 is never touched)
    mask = op("gt", torch.bool, Op.index(x0), const(0, I64))
    stores.append(Store("g", n + x0, ld("x", x0 - 1, mask=mask)))
    # an index value as float (iota)
    stores.append(Store("g", 2 * n + x0, Op.index(2 * x0 + 1, F32)))
    launch, src = build(kernel("idx", [buf("x", (n,))], [buf("o", (len(exprs), n), I64), buf("g", (3, n))],
                               stores, ranges=(n,)))
    text = src.text
    assert "fx_ifloordiv(x0 - 5, 3)" in text and "x0 / 3" in text
    x = rand(n)
    o, g = torch.empty(len(exprs), n, dtype=I64), torch.empty(3, n)
    launch(x, o, g)
    for i, f in enumerate(py):
        assert o[i].tolist() == [f(j) for j in range(n)], exprs[i]
    assert torch.equal(g[0], x.view(5, 8).t().reshape(-1))
    assert torch.equal(g[1], torch.cat([torch.zeros(1), x[:-1]]))
    assert torch.equal(g[2], torch.arange(n, dtype=F32) * 2 + 1)


def test_index_printer():
    em = CppEmitter()
    assert em.render_index(64 * x0 + x1) == "64*x0 + x1"
    assert em.render_index(s0 * x0 + x1 - 1) == "s0*x0 + x1 - 1"
    assert em.render_index(FloorDiv(x0, s0)) == "x0 / s0"
    assert em.render_index(ModularIndexing(x0 + 3, 2, s0)) == "((x0 + 3) / 2) % s0"
    assert em.render_index(Max(x0, s0, 3)) == "fx_imax(3, fx_imax(s0, x0))"
    assert em.render_index(x0 ** 2) == "x0*x0"
    assert em.render_index(FloorDiv(x0 - s0, 2)) == "fx_ifloordiv(-s0 + x0, 2)"
    assert em.render_index(sympy.Integer(-(2 ** 63))) == "-9223372036854775807LL - 1"
    with pytest.raises(EmitError, match="cannot be rendered on target .*run as ATen extern calls"):
        em.render_index(sympy.sqrt(x0))


class SerialCpp(CppEmitter):
    """The engine's own serial schedule (what the C99 example keeps), in the C++ dialect."""

    def render_body(self, kernel, names):
        return CStyleEmitter.render_body(self, kernel, names)


def test_serial_body_of_the_base_emitter():
    k = kernel("grid", [buf("x", (s0, 3))], [buf("y", (s0, 3))],
               [Store("y", 3 * x0 + x1, op("add", F32, op("sigmoid", F32, ld("x", 3 * x0 + x1)),
                                          const(1.0)))], ranges=(s0, 3), sizes=(s0,))
    em = SerialCpp()
    src = em.render(k)
    body = src.text.split('extern "C" void')[1]
    assert "for (int64_t x0 = 0; x0 < s0; ++x0)" in body and "#pragma omp" not in body
    launch = em.load(src)
    x = rand((11, 3))
    y = torch.empty(11, 3)
    launch(x, y, 11)
    torch.testing.assert_close(y, torch.sigmoid(x) + 1)


def test_render_is_deterministic_across_processes():
    """Same kernel -> byte-identical source, in this process and under another hash seed."""
    from test_emitter_reductions import softmax_kernel  # a kernel with every code path
    em = CppEmitter()
    k = softmax_kernel(column=False)
    a, b = em.render(k), CppEmitter().render(k)
    assert a.text == b.text and a.signature == b.signature and a.launch == b.launch
    assert a.text.startswith("// fxwrap kernel softmax_row\n"
                             "// from: softmax, logsumexp (aten._softmax.default, aten.logsumexp.default)\n")
    code = textwrap.dedent("""
        import sys; sys.path.insert(0, %r)
        from test_emitter_reductions import softmax_kernel
        from fxwrap.targets.cpu_cpp.emitter import CppEmitter
        sys.stdout.write(CppEmitter().render(softmax_kernel(column=False)).text)
    """ % os.path.dirname(__file__))
    env = dict(os.environ, PYTHONHASHSEED="12345")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           check=True).stdout
    assert other == a.text


def test_errors_name_the_op_and_the_way_out():
    em = CppEmitter()
    with pytest.raises(ValueError, match="frobnicate.*not a loop-IR op.*extern"):
        Op("frobnicate", F32, (ld("x", x0),))  # an unknown op fails where it is built

    class NoErf(CppEmitter):
        code_for_op = {name: fn for name, fn in CppEmitter.code_for_op.items() if name != "erf"}
    unrendered = kernel("unrendered", [buf("x", (4,))], [buf("y", (4,))],
                        [Store("y", x0, op("erf", F32, ld("x", x0)))], ranges=(4,))
    with pytest.raises(EmitError, match="'erf'.*NoErf.code_for_op"):
        NoErf().render(unrendered)
    early = kernel("early", [buf("x", (4, 4))], [buf("y", (4,))],
                   [Store("y", x0, acc("a1", F32))], ranges=(4,), reduction_ranges=(4,),
                   reductions=[Reduction("a0", "sum", op("add", F32, ld("x", 4 * x0 + sympy.Symbol("r0", integer=True, nonnegative=True)),
                                                         acc("a1", F32)), F32),
                               Reduction("a1", "max", ld("x", x0), F32)])
    with pytest.raises(EmitError, match="not an earlier reduction"):
        em.render(early)
    wrong = kernel("wrong", [buf("x", (4,))], [buf("y", (4,))],
                   [Store("z", x0, ld("x", x0))], ranges=(4,))
    with pytest.raises(EmitError, match="not one of its outputs"):
        em.render(wrong)
