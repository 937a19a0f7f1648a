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
from fxwrap.wrapper_ir.lines import Allocate, CallKernel, DefineKernel, Free, Reuse
from scan_helpers import SCAN_OPS, check_scan_op, scan_externs, scan_kernels


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
