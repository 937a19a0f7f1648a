"""C++ emitter reductions against eager: inner (row) and outer (column) dims, full
reductions, softmax as three passes, odd sizes, NaN and tie semantics, determinism.

The kernels take their sizes as symbols, so one compile serves every size; the sizes
below drive every code path (serial rows, parallel rows, split r with partials).
"""
from __future__ import annotations

import pytest
import sympy
import torch

from emitter_helpers import (Reduction, Store, acc, buf, build, build_with, cast, const, kernel, ld, op, r0,
                             r1, rand, s0, s1, x0, x1)
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.targets.cstyle import CStyleEmitter

F32, F64, BF16, I64 = torch.float32, torch.float64, torch.bfloat16, torch.int64
BOOL = torch.bool


def _all_reductions(X, P, dtype=F32):
    """Every reduction kind over X (prod over P) and the stores of their results at ``out``."""
    reds = [Reduction("sum", "sum", X, dtype), Reduction("prod", "prod", P, dtype),
            Reduction("max", "max", X, dtype), Reduction("min", "min", X, dtype),
            Reduction("any", "any", op("gt", BOOL, X, const(2.0, dtype)), BOOL),
            Reduction("all", "all", op("gt", BOOL, X, const(-2.9, dtype)), BOOL),
            Reduction("amax", "argmax", X, I64), Reduction("amin", "argmin", X, I64),
            Reduction("wf", "welford", X, dtype)]
    var = op("truediv", dtype, acc("wf", dtype, 1),
             op("sub", dtype, cast(acc("wf", I64, 2), dtype), const(1.0, dtype)))

    def stores(at):
        fl = [acc("sum", dtype), acc("prod", dtype), acc("max", dtype), acc("min", dtype),
              acc("wf", dtype, 0), var, acc("amax", dtype, 1)]
        st = [Store("of", i * at[1] + at[0], v) for i, v in enumerate(fl)]
        st += [Store("ob", i * at[1] + at[0], acc(n, BOOL)) for i, n in enumerate(("any", "all"))]
        st += [Store("oi", i * at[1] + at[0], v) for i, v in
               enumerate([acc("amax", I64, 0), acc("amin", I64, 0), acc("wf", I64, 2)])]
        return st

    return reds, stores


def _check_all(of, ob, oi, x, p, dim):
    n = x.shape[dim]
    scale = x.abs().nansum(dim).max().item() + 1.0
    torch.testing.assert_close(of[0], x.sum(dim), rtol=1e-5, atol=2e-6 * scale, equal_nan=True)
    # float32 round-off of up to 1e5 factors; a dropped factor (~1e-3 off 1) would show
    torch.testing.assert_close(of[1], p.double().prod(dim).float(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(of[2], x.amax(dim), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(of[3], x.amin(dim), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(of[4], x.mean(dim), rtol=1e-5, atol=1e-5, equal_nan=True)
    if n > 1:
        torch.testing.assert_close(of[5], x.var(dim), rtol=1e-4, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(of[6], x.amax(dim), rtol=0, atol=0, equal_nan=True)  # argmax value
    assert torch.equal(ob[0], (x > 2.0).any(dim))
    assert torch.equal(ob[1], (x > -2.9).all(dim))
    assert torch.equal(oi[0], x.argmax(dim))
    assert torch.equal(oi[1], x.argmin(dim))
    assert bool((oi[2] == n).all())


def inner_kernel():
    X, P = ld("x", s1 * x0 + r0), ld("p", s1 * x0 + r0)
    reds, stores = _all_reductions(X, P)
    return kernel("red_inner", [buf("x", (s0, s1)), buf("p", (s0, s1))],
                  [buf("of", (7, s0)), buf("ob", (2, s0), BOOL), buf("oi", (3, s0), I64)],
                  stores((x0, s0)), ranges=(s0,), reduction_ranges=(s1,), reductions=reds,
                  sizes=(s0, s1))


def outer_kernel():
    X, P = ld("x", s1 * r0 + x0), ld("p", s1 * r0 + x0)
    reds, stores = _all_reductions(X, P)
    return kernel("red_outer", [buf("x", (s0, s1)), buf("p", (s0, s1))],
                  [buf("of", (7, s1)), buf("ob", (2, s1), BOOL), buf("oi", (3, s1), I64)],
                  stores((x0, s1)), ranges=(s1,), reduction_ranges=(s0,), reductions=reds,
                  sizes=(s0, s1))


def _inputs(m, n, nan_rows=False, dim=1):
    x = rand((m, n))
    p = 1 + 0.01 * rand((m, n))
    if n > 3:  # ties: the first index must win
        if dim == 1:
            x[:, n // 3] = x[:, 2 * n // 3] = 3.5
            x[:, n // 2] = x[:, n - 1] = -3.5
        else:
            x[m // 3 if m > 3 else 0, :] = 3.5
    if nan_rows:
        x.view(-1)[:: 7] = float("nan")
    return x, p


INNER_SIZES = [(3, 1), (5, 7), (2, 1000), (3, 4097), (1, 20000), (100, 37), (40, 3000), (1, 1)]


@pytest.fixture(scope="module")
def inner():
    return build(inner_kernel())


@pytest.mark.parametrize("m,n", INNER_SIZES)
def test_inner_reductions(inner, m, n):
    launch, src = inner
    for nan_rows in (False, True):
        x, p = _inputs(m, n, nan_rows)
        of, ob, oi = torch.empty(7, m), torch.empty(2, m, dtype=BOOL), torch.empty(3, m, dtype=I64)
        launch(x, p, of, ob, oi, m, n)
        _check_all(of, ob, oi, x, p, 1)


def test_inner_reduction_source_shape(inner):
    _, src = inner
    t = src.text
    assert "rd0_l0[16]" in t and "#pragma omp simd" in t     # vector lanes
    assert "if (nchunks <= 1)" in t and "chunk_size" in t    # split path for few rows
    assert "xbase" not in t                                   # row tiling


OUTER_SIZES = [(1000, 7), (4097, 3), (7, 1000), (1, 5), (3000, 300), (33, 130), (1, 1)]


@pytest.fixture(scope="module")
def outer():
    return build(outer_kernel())


@pytest.mark.parametrize("m,n", OUTER_SIZES)
def test_outer_reductions(outer, m, n):
    """x.sum(0) & co: r walks outer, x inner (contiguous loads), partial rows when split."""
    launch, src = outer
    assert "xbase" in src.text and "xj < xcount" in src.text
    for nan_rows in (False, True):
        x, p = _inputs(m, n, nan_rows, dim=0)
        of, ob, oi = torch.empty(7, n), torch.empty(2, n, dtype=BOOL), torch.empty(3, n, dtype=I64)
        launch(x, p, of, ob, oi, m, n)
        _check_all(of, ob, oi, x, p, 0)


def test_full_reduction_to_scalar_and_determinism():
    """A sum / max / argmax / welford of everything; the split path is bitwise reproducible."""
    X, P = ld("x", r0), ld("p", r0)
    reds, stores = _all_reductions(X, P)
    k = kernel("red_full", [buf("x", (s0,)), buf("p", (s0,))],
               [buf("of", (7,)), buf("ob", (2,), BOOL), buf("oi", (3,), I64)],
               stores((sympy.Integer(0), sympy.Integer(1))), ranges=(), reduction_ranges=(s0,),
               reductions=reds, sizes=(s0,))
    launch, src = build(k)
    for n in (1, 7, 1000, 4097, 100003):
        x, p = rand((1, n)), 1 + 0.001 * rand((1, n))
        x[0, n // 2] = 3.5
        of, ob, oi = torch.empty(7, 1), torch.empty(2, 1, dtype=BOOL), torch.empty(3, 1, dtype=I64)
        launch(x.view(-1), p.view(-1), of, ob, oi, n)
        _check_all(of, ob, oi, x, p, 1)
    # determinism: same bits run to run and whatever the thread count
    n = 1_000_003
    x = torch.randn(n) * 100
    p = torch.ones(n)
    results = []
    threads = torch.get_num_threads()
    try:
        for t in (threads, threads, 1):
            torch.set_num_threads(t)
            of, ob, oi = torch.empty(7, 1), torch.empty(2, 1, dtype=BOOL), torch.empty(3, 1, dtype=I64)
            launch(x, p, of, ob, oi, n)
            results.append(of.clone())
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0].view(torch.int32), results[1].view(torch.int32))
    assert torch.equal(results[0].view(torch.int32), results[2].view(torch.int32))
    # two-level lane sums: error within a few times eager's (about 5e-10 of sum|x| here)
    err = abs(results[0][0, 0].double() - x.double().sum()).item()
    assert err <= 3e-9 * x.abs().sum().item(), err


def test_full_reduction_two_r_vars_transposed():
    """Reduce a transposed (s0, s1) view to a scalar: two r vars, the last one strided."""
    X = ld("x", r1 * s0 + r0)  # logical (s0, s1) over storage (s1, s0)
    reds = [Reduction("sum", "sum", X, F32), Reduction("amax", "argmax", X, I64),
            Reduction("wf", "welford", X, F32)]
    k = kernel("red_full2", [buf("x", (s0, s1), stride=(1, s0))], [buf("o", (3,)), buf("i", (1,), I64)],
               [Store("o", 0, acc("sum", F32)), Store("o", 1, acc("wf", F32, 0)),
                Store("o", 2, acc("wf", F32, 1)), Store("i", 0, acc("amax", I64))],
               reduction_ranges=(s0, s1), reductions=reds, sizes=(s0, s1))
    launch, _ = build(k)
    for m, n in [(3, 5), (300, 301), (1, 9000), (9000, 2)]:
        base = rand((n, m))
        x = base.t()
        o, i = torch.empty(3), torch.empty(1, dtype=I64)
        launch(x, o, i, m, n)
        torch.testing.assert_close(o[0], x.sum(), rtol=1e-5, atol=1e-3)
        torch.testing.assert_close(o[1], x.mean(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(o[2], ((x - x.double().mean().float()) ** 2).sum(), rtol=1e-4, atol=1e-3)
        assert i.item() == x.argmax().item()


def test_reductions_with_two_x_vars():
    """Middle-dim reduce (column tiling with an outer x var) and last-dim reduce of 3-d."""
    C = 3
    # x (s0, s1, C) reduce dim 1 -> (s0, C): r stride C, x1 contiguous -> column tiling
    Xm = ld("x", s1 * C * x0 + C * r0 + x1)
    km = kernel("red_mid", [buf("x", (s0, s1, C))], [buf("o", (s0, C)), buf("i", (s0, C), I64)],
                [Store("o", C * x0 + x1, acc("s", F32)), Store("i", C * x0 + x1, acc("a", I64))],
                ranges=(s0, C), reduction_ranges=(s1,),
                reductions=[Reduction("s", "sum", Xm, F32), Reduction("a", "argmin", Xm, I64)],
                sizes=(s0, s1))
    # x (C, s0, s1) reduce the last dim -> (C, s0): row tiling over two x vars
    Xl = ld("x", s0 * s1 * x0 + s1 * x1 + r0)
    kl = kernel("red_last3", [buf("x", (C, s0, s1))], [buf("o", (C, s0))],
                [Store("o", s0 * x0 + x1, acc("m", F32))], ranges=(C, s0), reduction_ranges=(s1,),
                reductions=[Reduction("m", "max", Xl, F32)], sizes=(s0, s1))
    (lm, sm), (ll, _) = build(km), build(kl)
    assert "xbase" in sm.text
    for m, n in [(2, 5), (7, 3000), (200, 130)]:
        x = rand((m, n, C))
        o, i = torch.empty(m, C), torch.empty(m, C, dtype=I64)
        lm(x, o, i, m, n)
        torch.testing.assert_close(o, x.sum(1), rtol=1e-5, atol=1e-4)
        assert torch.equal(i, x.argmin(1))
        y = rand((C, m, n))
        o2 = torch.empty(C, m)
        ll(y, o2, m, n)
        assert torch.equal(o2, y.amax(2))


def softmax_kernel(column: bool):
    """softmax as max pass, sum-of-exp pass and an epilogue store pass over r."""
    if column:  # softmax over dim 0 of (s0, s1)
        idx, ranges, rr = s1 * r0 + x0, (s1,), (s0,)
    else:
        idx, ranges, rr = s1 * x0 + r0, (s0,), (s1,)
    X = ld("x", idx)
    shifted = op("exp", F32, op("sub", F32, X, acc("amax", F32)))
    reds = [Reduction("amax", "max", X, F32), Reduction("sum", "sum", shifted, F32)]
    stores = [Store("y", idx, op("truediv", F32, shifted, acc("sum", F32))),
              Store("lse", x0, op("add", F32, op("log", F32, acc("sum", F32)), acc("amax", F32)))]
    return kernel("softmax_col" if column else "softmax_row", [buf("x", (s0, s1))],
                  [buf("y", (s0, s1)), buf("lse", ranges)], stores, ranges=ranges,
                  reduction_ranges=rr, reductions=reds, sizes=(s0, s1),
                  origins=("softmax: aten._softmax.default", "logsumexp: aten.logsumexp.default"))


@pytest.mark.parametrize("column", [False, True], ids=["dim-1", "dim-0"])
def test_softmax_three_passes(column):
    launch, src = build(softmax_kernel(column))
    dim = 0 if column else 1
    for m, n in [(4, 7), (64, 1000), (2, 20000), (20000, 2), (1, 1), (513, 77)]:
        x = rand((m, n), low=-10, high=10)
        y, lse = torch.empty(m, n), torch.empty(n if column else m)
        launch(x, y, lse, m, n)
        torch.testing.assert_close(y, torch.softmax(x, dim), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse, torch.logsumexp(x, dim), rtol=1e-5, atol=1e-5)


def test_bf16_and_int_reductions():
    Xb = ld("xb", s1 * x0 + r0, BF16)
    Xi = ld("xi", s1 * x0 + r0, torch.int32)
    Bb = ld("bb", s1 * x0 + r0, BOOL)
    reds = [Reduction("bsum", "sum", cast(Xb, F32), F32), Reduction("bmax", "max", Xb, BF16),
            Reduction("bsum16", "sum", Xb, BF16), Reduction("bwf", "welford", cast(Xb, F32), F32),
            Reduction("isum", "sum", cast(Xi, I64), I64), Reduction("imax", "max", Xi, torch.int32),
            Reduction("imin", "min", Xi, torch.int32), Reduction("iarg", "argmax", Xi, I64),
            Reduction("iprod", "prod", cast(Xi, I64), I64),
            Reduction("bany", "any", Bb, BOOL), Reduction("ball", "all", Bb, BOOL)]
    stores = [Store("ob", x0, cast(acc("bsum", F32), BF16)), Store("ob", s0 + x0, acc("bmax", BF16)),
              Store("ob", 2 * s0 + x0, acc("bsum16", BF16)), Store("ob", 3 * s0 + x0, cast(acc("bwf", F32), BF16)),
              Store("oi", x0, acc("isum", I64)), Store("oi", s0 + x0, cast(acc("imax", torch.int32), I64)),
              Store("oi", 2 * s0 + x0, cast(acc("imin", torch.int32), I64)),
              Store("oi", 3 * s0 + x0, acc("iarg", I64)), Store("oi", 4 * s0 + x0, acc("iprod", I64)),
              Store("obool", x0, acc("bany", BOOL)), Store("obool", s0 + x0, acc("ball", BOOL))]
    k = kernel("red_types", [buf("xb", (s0, s1), BF16), buf("xi", (s0, s1), torch.int32),
                             buf("bb", (s0, s1), BOOL)],
               [buf("ob", (4, s0), BF16), buf("oi", (5, s0), I64), buf("obool", (2, s0), BOOL)],
               stores, ranges=(s0,), reduction_ranges=(s1,), reductions=reds, sizes=(s0, s1))
    launch, _ = build(k)
    for m, n in [(5, 7), (3, 4097), (1, 30000)]:
        xb, xi = rand((m, n), BF16), rand((m, n), torch.int32, -1000, 1000)
        bb = rand((m, n), BOOL)
        bb[0] = True
        if m > 1:
            bb[1] = False
        ob, oi, obool = torch.empty(4, m, dtype=BF16), torch.empty(5, m, dtype=I64), torch.empty(2, m, dtype=BOOL)
        launch(xb, xi, bb, ob, oi, obool, m, n)
        torch.testing.assert_close(ob[0], xb.sum(1), rtol=1e-2, atol=1e-2)
        assert torch.equal(ob[1], xb.amax(1))
        torch.testing.assert_close(ob[2], xb.sum(1), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(ob[3], xb.mean(1), rtol=1e-2, atol=1e-2)
        assert torch.equal(oi[0], xi.sum(1))
        assert torch.equal(oi[1], xi.amax(1).long()) and torch.equal(oi[2], xi.amin(1).long())
        assert torch.equal(oi[3], xi.argmax(1))
        assert torch.equal(oi[4], xi.long().prod(1))  # wraps identically (mod 2**64)
        assert torch.equal(obool[0], bb.any(1)) and torch.equal(obool[1], bb.all(1))


@pytest.mark.parametrize("m,n,column", [(5, 50000, False), (4, 7, False), (3000, 40, True),
                                        (300, 1000, True)])
def test_static_shapes_pick_one_path(m, n, column):
    """Static sizes: the tiling/split choice is made at render time (no run-time branch)."""
    idx = (n * r0 + x0) if column else (n * x0 + r0)
    X = ld("x", idx)
    out = n if column else m
    k = kernel(f"static_{m}_{n}", [buf("x", (m, n))], [buf("o", (2, out)), buf("i", (out,), I64)],
               [Store("o", x0, acc("s", F32)), Store("o", out + x0, acc("w", F32, 1)),
                Store("i", x0, acc("a", I64))],
               ranges=(out,), reduction_ranges=(m if column else n,),
               reductions=[Reduction("s", "sum", X, F32), Reduction("w", "welford", X, F32),
                           Reduction("a", "argmin", X, I64)])
    launch, src = build(k)
    assert "nchunks <= 1" not in src.text and ("xbase" in src.text) == column
    x = rand((m, n))
    o, i = torch.empty(2, out), torch.empty(out, dtype=I64)
    launch(x, o, i)
    dim = 0 if column else 1
    # fp32 sums of up to 50000 randn values in another order than eager's: the sums
    # (|sum| ~ 200, sum|x| ~ 40000) differ by up to ~1e-4 absolute (1.2e-4 seen once)
    torch.testing.assert_close(o[0], x.sum(dim), rtol=1e-5, atol=5e-4)
    torch.testing.assert_close(o[1], x.var(dim) * (x.shape[dim] - 1), rtol=1e-4, atol=1e-3)
    assert torch.equal(i, x.argmin(dim))


class _SerialCpp(CppEmitter):
    """The engine's serial schedule (``CStyleEmitter.render_body``: what the C99 example
    target keeps) in the C++ dialect: one row after the other, a pass per reduction group."""

    def render_body(self, kernel, names):
        return CStyleEmitter.render_body(self, kernel, names)


@pytest.mark.parametrize("which", ["inner", "outer"])
def test_serial_schedule_every_reduction_kind(which):
    k = inner_kernel() if which == "inner" else outer_kernel()
    launch, src = build_with(_SerialCpp(), k)
    assert "#pragma omp" not in src.text.split('extern "C" void')[1]
    for m, n in [(5, 7), (3, 1), (4, 300)]:
        x, p = _inputs(m, n, nan_rows=True, dim=1 if which == "inner" else 0)
        outs = m if which == "inner" else n
        of, ob, oi = torch.empty(7, outs), torch.empty(2, outs, dtype=BOOL), torch.empty(3, outs, dtype=I64)
        launch(x, p, of, ob, oi, m, n)
        _check_all(of, ob, oi, x, p, 1 if which == "inner" else 0)


def test_serial_schedule_softmax_passes_and_scans():
    launch, src = build_with(_SerialCpp(), softmax_kernel(column=False))
    x = rand((6, 33), low=-10, high=10)
    y, lse = torch.empty(6, 33), torch.empty(6)
    launch(x, y, lse, 6, 33)
    torch.testing.assert_close(y, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, torch.logsumexp(x, 1), rtol=1e-5, atol=1e-5)
    X = ld("x", s1 * x0 + r0)
    scans = [Reduction("cs", "cumsum", X, F32), Reduction("cm", "cummax", X, F32)]
    k = kernel("scans", [buf("x", (s0, s1))], [buf("c", (s0, s1)), buf("m", (s0, s1)), buf("i", (s0, s1), I64)],
               [Store("c", s1 * x0 + r0, acc("cs", F32)), Store("m", s1 * x0 + r0, acc("cm", F32, 1)),
                Store("i", s1 * x0 + r0, acc("cm", I64, 0))],
               ranges=(s0,), reduction_ranges=(s1,), reductions=scans, sizes=(s0, s1))
    launch, src = build_with(_SerialCpp(), k)
    x = rand((4, 50))
    x[:, 10] = x[:, 20] = 9.0  # ties: the later index
    c, m, i = torch.empty(4, 50), torch.empty(4, 50), torch.empty(4, 50, dtype=I64)
    launch(x, c, m, i, 4, 50)
    torch.testing.assert_close(c, x.cumsum(1), rtol=1e-5, atol=1e-5)
    expected = x.cummax(1)
    assert torch.equal(m, expected.values) and torch.equal(i, expected.indices)
