"""The Triton target's single-launch look-back scan (plan ``lookback-scan``) on triton-interpret:
chunks of 16 elements and look-back windows of 4 status words (the interpreter's planner
settings), so rows of a few hundred elements take many chunks and several look-back steps.

The interpreter runs the programs one after another in ticket order, so these tests check the
arithmetic, not the concurrency: with ``Planner.lookback_publish_prefix`` off, no program
publishes its inclusive prefix and every look-back walks over its predecessors' totals to the
row's start (what a program sees on a GPU when its predecessors are still looking back).  The
concurrency runs on a GPU: tests/cuda/test_triton_scans.py."""
from __future__ import annotations

import json
import threading

import pytest
import torch

import fxwrap
from fxwrap.targets.cuda_triton.tiling import Planner
from fxwrap.ir.lines import Allocate, CallKernel, DefineKernel, ZeroFill
from fxwrap.runtime.launch import TritonLaunch
from scan_helpers import scan_externs
from shared_helpers import in_two_processes

TARGET = "triton-interpret"
CHUNK, WINDOW = Planner.lookback_chunk_interpret, Planner.lookback_window_interpret

OPS = {
    "cumsum": lambda x: torch.cumsum(x, -1),
    "cumprod": lambda x: torch.cumprod(1 + x * 0.05, -1),
    "logcumsumexp": lambda x: torch.logcumsumexp(x, -1),
}
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=5e-2)}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(params=[True, False], ids=["prefixes", "totals-only"])
def publish_prefix(request, monkeypatch):
    monkeypatch.setattr(Planner, "lookback_publish_prefix", request.param)
    return request.param


def _compile(fn, dynamic=False):
    programs: list = []
    f = torch.compile(fn, backend="fxwrap", dynamic=dynamic, options={"target": TARGET, "on_program": programs.append})
    return f, programs


def _launches(programs) -> list[TritonLaunch]:
    return [line.kernel.launch for p in programs for line in p.lines if isinstance(line, CallKernel)]


def _assert_lookback(programs, chunks: int, publish: bool = True) -> None:
    """One look-back launch per scan, over one program per (row, chunk), with the planner's
    interpreter chunk and window; the scan is no ATen call."""
    launches = [launch for launch in _launches(programs) if launch.symbol.startswith("fxwrap_scan")]
    assert launches and all(launch.plan == "lookback-scan" for launch in launches), launches
    for launch in launches:
        cfg = dict(launch.config)
        assert (cfg["RBLOCK"], cfg["LOOKBACK"], cfg["PUBLISH_PREFIX"]) == (CHUNK, WINDOW, int(publish)), cfg
    assert chunks > 2 * WINDOW  # several look-back steps for the last chunks
    assert not scan_externs(programs)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_lookback_scan_matches_eager(op, dtype, dynamic, publish_prefix):
    fn = OPS[op]
    f, programs = _compile(fn, dynamic)
    # (one row too: the row index of its stores is a broadcast zero)
    for rows, n in ((3, 300), (2, 257)) if dynamic else ((3, 300), (1, 300)):
        x = torch.randn(rows, n).to(dtype)
        torch.testing.assert_close(f(x), fn(x), **TOL[dtype])
    _assert_lookback(programs, -(-300 // CHUNK), publish_prefix)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_int_and_bool_cumsum_take_three_words_per_chunk(dynamic, publish_prefix):
    """int64 running states (integer and bool inputs) do not fit beside a flag in one word: their
    chunks publish flag, total and prefix in three (exact numbers: integer sums)."""
    def f(x):
        return torch.cumsum((x * 100).to(torch.int32), 1), torch.cumsum(x > 0, 1)
    g, programs = _compile(f, dynamic)
    x = torch.randn(3, 300)
    got, want = g(x), f(x)
    assert got[0].dtype == got[1].dtype == torch.int64
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    _assert_lookback(programs, -(-300 // CHUNK), publish_prefix)
    if not dynamic:
        ws = [arg for p in programs for call in p.lines if isinstance(call, CallKernel)
              for a, arg in zip(call.kernel.signature, call.args) if a.role == "workspace"]
        assert sorted(int(b.size[0]) for b in ws) == [1 + 3 * 3 * 19] * 2, ws


def test_float64_cumprod_and_nan_inf(publish_prefix):
    """float64 states take the three-word layout too; NaN and infinities cross the chunks as
    in eager (a NaN in a chunk's total reaches every later chunk through the look-back)."""
    x = torch.randn(2, 300, dtype=torch.float64)
    y = torch.randn(3, 300)
    y[0, 40], y[1, 100], y[2, 7], y[2, 200] = float("inf"), float("nan"), float("-inf"), float("inf")

    def f(x, y):
        return torch.cumprod(1 + x * 0.05, 1), torch.cumsum(y, 1), torch.logcumsumexp(y, 1)
    g, programs = _compile(f)
    got, want = g(x, y), f(x, y)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-5, atol=1e-5)
    _assert_lookback(programs, -(-300 // CHUNK), publish_prefix)


def test_prologue_and_epilogue_fuse_into_the_lookback_scan():
    def f(x):
        return torch.cumsum(x * 2, 1).sigmoid() + 1
    x = torch.randn(4, 200)
    p = fxwrap.lower(f, x, options={"target": TARGET})
    torch.testing.assert_close(p.run(x), f(x))
    calls = [line for line in p.lines if isinstance(line, CallKernel)]
    assert len(calls) == 1 and calls[0].kernel.launch.plan == "lookback-scan", p.code()


def test_workspace_is_a_zeroed_planned_buffer():
    """The ticket and the status words: one int64 workspace, allocated and zero-filled by the
    program right before the launch, passed as the kernel's workspace argument, freed after
    it and counted in peak_bytes."""
    x = torch.randn(3, 300)
    p = fxwrap.lower(lambda x: torch.cumsum(x, 1), x, options={"target": TARGET})
    torch.testing.assert_close(p.run(x), torch.cumsum(x, 1))
    lines = list(p.lines)
    (call,) = [line for line in lines if isinstance(line, CallKernel)]
    (ws,) = [arg for a, arg in zip(call.kernel.signature, call.args) if a.role == "workspace"]
    chunks = -(-300 // CHUNK)
    assert (int(ws.size[0]), ws.dtype) == (1 + 3 * chunks, torch.int64)
    # Allocate, ZeroFill, then (after the kernel's definition) the launch
    before = [line for line in lines[:lines.index(call)] if not isinstance(line, DefineKernel)]
    assert isinstance(before[-1], ZeroFill) and before[-1].buf == ws, p.code()
    assert isinstance(before[-2], Allocate) and before[-2].buf == ws, p.code()
    assert "zero_(" in p.code() and "look-back scan" in call.kernel.source
    assert p.peak_bytes == 3 * 300 * 4 + (1 + 3 * chunks) * 8, (p.peak_bytes, p.code())


def test_source_is_deterministic():
    """Two processes that share nothing (hash seeds, caches) render the same look-back scan."""
    code = ("import json, torch, fxwrap\n"
            "from fxwrap.ir.lines import DefineKernel\n"
            f"p = fxwrap.lower(lambda x: torch.logcumsumexp(x, 1), torch.randn(2, 300), target={TARGET!r})\n"
            "print(json.dumps([line.kernel.source for line in p.lines if isinstance(line, DefineKernel)]))\n")
    first, second = in_two_processes(code)
    sources = json.loads(first)
    assert first == second and sources
    assert "tl.atomic_add(ws_ptr0, 1" in sources[0] and "while _scan0_end > 0:" in sources[0]


@pytest.mark.parametrize("case", ["cummax", "deterministic", "lookback-off", "short-rows", "many-rows"])
def test_other_scans_keep_their_plan(case, monkeypatch):
    """cummax/cummin (value and index: no one-word status) and every scan under
    ``torch.use_deterministic_algorithms`` (a fixed combine order) keep the two-launch split
    scan, as do all with ``Planner.scan_lookback`` off; short rows and many rows keep one program
    per row.  Every one with eager's numbers."""
    fn, shape, plan = OPS["cumsum"], (3, 300), "split-scan"
    if case == "cummax":
        fn = lambda x: torch.cummax(x, 1)  # noqa: E731
    elif case == "deterministic":
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
    elif case == "lookback-off":
        monkeypatch.setattr(Planner, "scan_lookback", False)
    elif case == "short-rows":
        shape, plan = (3, 40), "scan"
    else:
        shape, plan = (Planner.split_max_programs, 70), "scan"
    x = torch.randn(*shape)
    try:
        p = fxwrap.lower(fn, x, options={"target": TARGET})
    finally:
        if case == "deterministic":
            torch.use_deterministic_algorithms(previous)
    torch.testing.assert_close(p.run(x), fn(x), rtol=1e-5, atol=1e-4)
    plans = [line.kernel.launch.plan for line in p.lines if isinstance(line, CallKernel)]
    assert plans == [plan], (plans, p.code())


def _word(value: torch.Tensor, flag: int) -> int:
    """A packed status word: the float32 value's bits above its flag."""
    bits = int(value.to(torch.float32).reshape(1).view(torch.int32)[0])
    return (bits << 32) | flag


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=["packed-fp32", "three-words-int64"])
@pytest.mark.parametrize("prefix_at", [None, 16, 14, 11, 0], ids=lambda c: f"prefix-at-{c}")
def test_one_chunk_looks_back_over_a_mix_of_totals_and_prefixes(prefix_at, dtype):
    """What a program sees on a GPU, set up by hand: the last chunk of a row (ticket 18 of 19)
    runs alone over status words where its predecessors published their totals and one of them
    (or none) its inclusive prefix: in the first look-back window (chunk 16), at its far end
    (14), in a later window (11), at the row's start (0).  The chunk's outputs are eager's;
    the look-back stops at that prefix: words beyond it, wrong totals or not yet published
    ones (zero), change nothing and are not waited for."""
    n = 300
    x = torch.randn(1, n) if dtype == torch.float32 else torch.randint(-1000, 1000, (1, n))
    p = fxwrap.lower(lambda x: torch.cumsum(x, 1), x, options={"target": TARGET})
    (kernel,) = [line.kernel for line in p.lines if isinstance(line, DefineKernel)]
    launch = kernel.launch
    from fxwrap.targets.cuda_triton.launcher import load_module
    fn = getattr(load_module(kernel.source, launch.symbol, True), launch.symbol)
    chunks, last = -(-n // CHUNK), -(-n // CHUNK) - 1
    state = x.to(torch.float32 if dtype == torch.float32 else torch.int64)[0]
    total = [state[c * CHUNK:(c + 1) * CHUNK].sum() for c in range(chunks)]
    prefix = [state[:(c + 1) * CHUNK].sum() for c in range(chunks)]
    words = 1 if dtype == torch.float32 else 3
    ws = torch.zeros(1 + words * chunks, dtype=torch.int64)
    ws[0] = last  # the next ticket: this program's chunk is the row's last
    for c in range(last):
        is_prefix = c == prefix_at
        if prefix_at is not None and c < prefix_at:
            if c % 2 == 0:
                continue  # beyond the prefix, not published yet: nothing to wait for
            value, flag = total[c] + 1000, 1  # beyond the prefix: never combined
        else:
            value, flag = (prefix[c], 2) if is_prefix else (total[c], 1)
        if words == 1:
            ws[1 + c] = _word(value, flag)
        else:
            ws[1 + 3 * c], ws[1 + 3 * c + flag] = flag, int(value)
    out = torch.zeros_like(x, dtype=torch.float32 if dtype == torch.float32 else torch.int64)
    # (a look-back that waited for a word it does not need would spin for ever: run it aside)
    run = threading.Thread(target=lambda: fn[(1,)](x, out, ws, **{k: v for k, v in launch.config if k.isupper()}),
                           daemon=True)
    run.start()
    run.join(timeout=120)
    assert not run.is_alive(), "the look-back waits for a status word beyond the nearest prefix"
    want = torch.cumsum(x, 1)
    torch.testing.assert_close(out[0, last * CHUNK:], want[0, last * CHUNK:], rtol=1e-5, atol=1e-4)
    assert not out[0, :last * CHUNK].any()  # one chunk ran
