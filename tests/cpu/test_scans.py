"""Scans (cumsum, cumprod, logcumsumexp, cummax, cummin) as kernels: every OpInfo sample on
the cpu, reference and triton-interpret targets, fp32 and bf16, static and dynamic shapes;
fusion of a pointwise prologue and epilogue; the long-row split scan of the Triton target with
its partials in a workspace (an ``Allocate`` line, planned, in ``peak_bytes``); no kernel
source allocates memory itself."""
from __future__ import annotations

import re

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import Allocate, CallKernel, DefineKernel, Free, Reuse
from scan_helpers import (SCAN_OPS, check_float_scan, check_scan_op, scan_externs, scan_fn, scan_input, scan_kernels,
                          workspaces)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", SCAN_OPS)
@pytest.mark.parametrize("target", ["cpu", "reference"])
def test_opinfo_scan_in_a_kernel(target, name, dtype, dynamic):
    assert check_scan_op(name, dtype, target, dynamic) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", SCAN_OPS)
def test_opinfo_scan_triton_interpret(name, dtype):
    assert check_scan_op(name, dtype, "triton-interpret", dynamic=False) > 0


@pytest.mark.parametrize("name", ["cumsum", "cummax"])
def test_opinfo_scan_triton_interpret_dynamic(name):
    assert check_scan_op(name, torch.float32, "triton-interpret", dynamic=True) > 0


def _lower(fn, *args, target="cpu"):
    return fxwrap.lower(fn, *args, options={"target": target})


def _kernel_sources(program) -> list[str]:
    return [line.kernel.source for line in program.lines if isinstance(line, DefineKernel)]


@pytest.mark.parametrize("target", ["cpu", "reference", "triton-interpret", "mps_shim"])
def test_prologue_and_epilogue_fuse_into_the_scan(target):
    def f(x):
        return torch.cumsum(x * 2, 1).sigmoid() + 1
    x = torch.randn(6, 50)
    p = _lower(f, x, target=target)
    torch.testing.assert_close(p.run(x), f(x))
    calls = [line for line in p.lines if isinstance(line, CallKernel)]
    assert len(calls) == 1 and "_scan_" in calls[0].kernel.name, p.code()


@pytest.mark.parametrize("target", ["cpu", "reference", "triton-interpret"])
def test_int_and_bool_cumsum_give_int64(target):
    def f(x):
        return torch.cumsum(x > 0, 1), torch.cumsum((x * 10).to(torch.int32), 0)
    x = torch.randn(5, 40)
    p = _lower(f, x, target=target)
    got, want = p.run(x), f(x)
    assert got[0].dtype == got[1].dtype == torch.int64
    torch.testing.assert_close(got, want)
    assert not scan_externs([p]) and len(scan_kernels([p])) == 2


@pytest.mark.parametrize("target", ["cpu", "reference", "triton-interpret", "mps_shim"])
def test_nan_and_ties(target):
    x = torch.tensor([[1.0, 3.0, 3.0, float("nan"), 2.0, float("nan"), 5.0, -1.0]])
    y = torch.tensor([[float("-inf"), float("-inf"), 2.0, float("inf"), float("inf"), 1.0, float("nan"), 0.0]])

    def f(x, y):
        return torch.cummax(x, 1), torch.cummin(-x, 1), torch.logcumsumexp(y, 1), torch.cumsum(y, 1)
    p = _lower(f, x, y, target=target)
    got, want = p.run(x, y), f(x, y)
    for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        torch.testing.assert_close(g, w, equal_nan=True)
    assert not scan_externs([p])


def test_split_scan_workspace_is_a_planned_buffer(monkeypatch):
    """A long row on triton-interpret (its planner splits rows of 64 elements and more, in
    chunks of 32; the look-back plan off, so the cumsum splits too: test_lookback_scan.py
    covers that plan): the chunk totals live in a workspace the program allocates and frees,
    counted in peak_bytes; the numbers are eager's."""
    from fxwrap.targets.cuda_triton.tiling import Planner
    monkeypatch.setattr(Planner, "scan_lookback", False)

    def f(x):
        return torch.cumsum(x, 1), torch.cummax(x, 1)
    x = torch.randn(3, 300)
    p = _lower(f, x, target="triton-interpret")
    got, want = p.run(x), f(x)
    torch.testing.assert_close(got, want)
    ws = [arg for call in p.lines if isinstance(call, CallKernel)
          for a, arg in zip(call.kernel.signature, call.args) if a.role == "workspace"]
    chunks = -(-300 // 32)
    # cumsum: one float per (row, chunk); cummax: a float and an int64 per (row, chunk)
    assert sorted((int(b.size[0]), str(b.dtype)) for b in ws) == sorted(
        [(3 * chunks, "torch.float32"), (3 * chunks, "torch.float32"), (3 * chunks, "torch.int64")]), p.code()
    # each is an Allocate (or the reuse of a dead workspace of its size: the planner's) and is freed
    allocated = {line.buf.name for line in p.lines if isinstance(line, Allocate)}
    reused = {line.new.name for line in p.lines if isinstance(line, Reuse)}
    freed = {line.buf.name for line in p.lines if isinstance(line, Free)}
    assert all(b.name in allocated | reused for b in ws) and reused & {b.name for b in ws}, p.code()
    assert {b.name for b in ws[1:]} <= freed, p.code()
    # the kernels share one plan: the cumsum and the cummax run in two kernels, one after the
    # other; the peak is every output (3*300 floats, 3*300 floats + 3*300 int64) plus the
    # workspace of the kernel running last (its float and int64 chunk states)
    outputs = 3 * 300 * (4 + 4 + 8)
    assert p.peak_bytes == outputs + 3 * chunks * (4 + 8), (p.peak_bytes, p.code())


def test_split_scan_dynamic_sizes():
    def f(x):
        return torch.logcumsumexp(x, -1) * 2
    p = torch.compile(f, backend="fxwrap", dynamic=True, options={"target": "triton-interpret"})
    for n in (130, 257):
        x = torch.randn(2, n)
        torch.testing.assert_close(p(x), f(x))


_ALLOCATING = re.compile(r"\bnew\s+[A-Za-z_]|\bmalloc\s*\(|\bfx_array\b|torch\.empty|\bcudaMalloc")


@pytest.mark.parametrize("target", ["cpu", "triton-interpret", "mps_shim"])
def test_no_kernel_source_allocates(target):
    def f(x, y):
        return (torch.cumsum(x, 1), torch.cummax(y, 0).values, x.sum(0), (x * 2).softmax(-1),
                y.sum(0), torch.logcumsumexp(y, 1))
    x, y = torch.randn(16, 70), torch.randn(4000, 8)
    p = _lower(f, x, y, target=target)
    # (sums of 4000 terms and a 70-term scan: the summation order moves them by ~1e-5)
    torch.testing.assert_close(p.run(x, y), f(x, y), rtol=1e-4, atol=1e-4)
    for src in _kernel_sources(p):
        body = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("//", "#")))
        assert not _ALLOCATING.search(body), src


# -- the C++ target's split scan of few long rows (targets/cpu_cpp/scan.py) ---------------------

_LONG = 40001  # 11 chunks of 4000 (the last of 1 element): tasks of 4 + 4 interleaved, then 3 one by one


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32],
                         ids=["fp32", "bf16", "int64", "int32"])
@pytest.mark.parametrize("name", SCAN_OPS)
def test_cpu_split_scan_numbers(name, dtype):
    """Every scan op and dtype over 3 rows of 40001: a split scan (the workspace of chunk
    totals: ceil(40001 / 4000) = 11 per row, one per state), eager's numbers; cummax/cummin
    (ties, a NaN) and integer scans exactly."""
    if not dtype.is_floating_point and name == "logcumsumexp":
        pytest.skip("logcumsumexp has no integer kernel in eager")
    x = scan_input(name, (3, _LONG), dtype)
    fn = scan_fn(name)
    p = _lower(fn, x)
    got, want = p.run(x), fn(x)
    # a chunk total per row and chunk, of the running state's dtype: float32 for float dtypes,
    # int64 for an integer sum or product, the values' own for cummax/cummin (plus an int64 index)
    extreme = name in ("cummax", "cummin")
    state_dtype = str(torch.float32 if dtype.is_floating_point else dtype if extreme else torch.int64)
    states = [(3 * 11, state_dtype)] + ([(3 * 11, "torch.int64")] if extreme else [])
    assert sorted(workspaces(p)) == sorted(states), p.code()
    if extreme:
        assert torch.equal(got[1], want[1]), (got[1] != want[1]).nonzero()[:5]
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
    elif dtype.is_floating_point:
        check_float_scan(got, x, name, 1)
    else:
        assert got.dtype == want.dtype == torch.int64 and torch.equal(got, want)


def test_cpu_split_scan_plan():
    """The split rule: fewer than 64 rows of at least 32768 elements split (chunk totals in a
    workspace, the source's split branch); many rows or short rows run one task per row (no
    workspace); the kernel's source says which."""
    def f(x):
        return torch.cumsum(x * 2, 1)
    for shape, split in [((2, 40000), True), ((63, 32768), True), ((64, 40000), False), ((8, 32767), False),
                         ((300, 50), False)]:
        x = torch.randn(shape)
        p = _lower(f, x)
        check_float_scan(p.run(x), x * 2, "cumsum", 1)
        (src,) = _kernel_sources(p)
        assert ("// split scan: chunks" in src) == split and ("nchunks" in src) == split, (shape, src)
        assert workspaces(p) == ([(shape[0] * -(-shape[1] // 4000), "torch.float32")] if split else []), shape


@pytest.mark.parametrize("name", ["cumsum", "cummax"])
def test_cpu_split_scan_not_last_dim(name):
    """A scan over an outer dim (rows are the other dims' elements, ``r0`` strided): split."""
    for shape, dim in [((_LONG, 3), 0), ((2, _LONG, 3), 1)]:
        x = scan_input(name, shape, torch.float32)
        fn = scan_fn(name, dim)
        p = _lower(fn, x)
        rows = 3 if dim == 0 else 6
        assert (rows * 11, "torch.float32") in workspaces(p), p.code()
        got = p.run(x)
        if name == "cummax":
            assert torch.equal(got[1], fn(x)[1])
            torch.testing.assert_close(got[0], fn(x)[0], rtol=0, atol=0, equal_nan=True)
        else:
            check_float_scan(got, x, name, dim)


def test_cpu_split_scan_dynamic_shapes():
    """dynamic=True: one kernel with both plans behind a test of the sizes; the workspace's
    size is the same rule as a sympy expression (0 elements where the rows run one by one)."""
    programs: list = []

    def f(x):
        return tuple(torch.cummax(x * 2, 1)) + (torch.cumsum(x, 1),)
    g = torch.compile(f, backend="fxwrap", dynamic=True, options={"target": "cpu", "on_program": programs.append})
    for shape in [(2, 40000), (3, 50001), (100, 50), (70, 40000), (1, 33000)]:
        x = torch.randn(shape)
        got, want = g(x), f(x)
        assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0]), shape
        check_float_scan(got[2], x, "cumsum", 1)
    p = programs[0]  # (a second program: dynamo specializes the 1-row input)
    srcs = _kernel_sources(p)
    assert srcs and all("// split scan: chunks" in s and "if (" in s for s in srcs if "_scan_" in s), p.code()
    (out,) = [line.buf for line in p.lines if isinstance(line, Allocate) and line.buf.dtype == torch.int64
              and len(line.buf.size) == 2]
    rows, n = out.size
    ws = [line.buf.size[0] for line in p.lines if isinstance(line, Allocate) and len(line.buf.size) == 1]
    assert ws and all(not isinstance(e, int) and e.free_symbols for e in ws), p.code()
    for r, length, want_numel in [(2, 40000, 20), (3, 50001, 39), (100, 50, 0), (70, 40000, 0), (8, 32767, 0)]:
        assert {int(e.subs({rows: r, n: length})) for e in ws} == {want_numel}, (r, length)


def test_cpu_split_scan_workspace_is_a_planned_buffer():
    """The chunk totals of the cpu split scan are Allocate (or Reuse) lines, freed after the
    kernel, in peak_bytes: every output of the two scan kernels plus the workspaces of the one
    running last (cummax: a float and an int64 per chunk of each row)."""
    def f(x):
        return torch.cumsum(x, 1), torch.cummax(x, 1)
    x = torch.randn(3, _LONG)
    p = _lower(f, x)
    got, want = p.run(x), f(x)
    assert torch.equal(got[1][1], want[1][1]) and torch.equal(got[1][0], want[1][0])
    ws = [arg for call in p.lines if isinstance(call, CallKernel)
          for a, arg in zip(call.kernel.signature, call.args) if a.role == "workspace"]
    assert sorted((int(b.size[0]), str(b.dtype)) for b in ws) == [
        (33, "torch.float32"), (33, "torch.float32"), (33, "torch.int64")], p.code()
    allocated = {line.buf.name for line in p.lines if isinstance(line, Allocate)}
    reused = {line.new.name for line in p.lines if isinstance(line, Reuse)}
    freed = {line.buf.name for line in p.lines if isinstance(line, Free)}
    assert all(b.name in allocated | reused for b in ws) and {b.name for b in ws[1:]} <= freed, p.code()
    outputs = 3 * _LONG * (4 + 4 + 8)
    assert p.peak_bytes == outputs + 33 * (4 + 8), (p.peak_bytes, p.code())


@pytest.mark.parametrize("name", SCAN_OPS)
def test_cpu_split_scan_small_chunks(name, monkeypatch):
    """The split scan's edges with tiny chunks (3 elements, 4 per task, from rows of 8): rows
    of every length from one chunk to several tasks, a short last chunk, a partial last task,
    NaNs and ties at chunk boundaries."""
    from fxwrap.targets.cpu_cpp.emitter import CppEmitter
    monkeypatch.setattr(CppEmitter, "scan_chunk", 3)
    monkeypatch.setattr(CppEmitter, "scan_split_min_length", 8)
    fn = scan_fn(name)
    for n in (8, 12, 13, 24, 25, 50):
        x = scan_input(name, (2, n), torch.float32)
        if name in ("cummax", "cummin"):
            x[0, 2::3] = 5.0  # ties on chunk boundaries
            x[1, 3] = float("nan")
        p = fxwrap.lower(fn, x, options={"target": "cpu", "cache": False})
        assert workspaces(p) and workspaces(p)[0][0] == 2 * -(-n // 3), (n, p.code())
        got, want = p.run(x), fn(x)
        if name in ("cummax", "cummin"):
            assert torch.equal(got[1], want[1]), (n, got[1], want[1])
            torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "logcumsumexp"])
def test_cpu_scan_accumulate_in_double_is_eager_bit_for_bit(name, monkeypatch):
    """Eager's CPU cumsum/cumprod/logcumsumexp of float32 accumulate in double; with
    ``CppEmitter.scan_accumulate = {float32: float64}`` fxwrap does too and gives its numbers
    bit for bit per row, and to within one float32 ulp split (its chunk totals combine in
    double in another order, which rounds to float32 differently, rarely)."""
    from fxwrap.targets.cpu_cpp.emitter import CppEmitter
    monkeypatch.setattr(CppEmitter, "scan_accumulate", {torch.float32: torch.float64})
    fn = scan_fn(name)
    for shape in [(3, _LONG), (100, 300)]:
        x = scan_input(name, shape, torch.float32)
        p = fxwrap.lower(fn, x, options={"target": "cpu", "cache": False})
        assert bool(workspaces(p)) == (shape[0] < 64), p.code()
        got, want = p.run(x), fn(x)
        if shape[0] < 64:  # split: the chunks' double totals combine in another order than
            # eager's running sum; rounding that to float32 can differ by one ulp, rarely
            torch.testing.assert_close(got, want, rtol=torch.finfo(torch.float32).eps, atol=1e-30)
        else:
            assert torch.equal(got, want), shape
