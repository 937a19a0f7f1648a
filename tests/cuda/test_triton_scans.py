"""Scans on the Triton target (``cuda`` on a GPU, ``triton-interpret`` without one): the
OpInfo samples of every scan op in a kernel with eager's numbers; long rows in one launch with
decoupled look-back (cumsum, cumprod, logcumsumexp: plan ``lookback-scan``, its ticket and
status words in a zeroed workspace) or split into chunks whose totals live in a workspace
(cummax/cummin: ``split-scan``); and, on a GPU, the look-back under real concurrency (1 row x
1M and 4 x 300k of each op, repeated calls with exact integer sums, totals-only look-back over
many small chunks) and the 1-row 1M-element cumsum against a copy of the same bytes (issue
18's bar: 70%).

    python -m pytest -q tests/cuda/test_triton_scans.py           # on a GPU machine
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

from triton_helpers import DEVICE, GPU, TARGET_NAME, compiled

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu"))
from scan_helpers import SCAN_OPS, check_scan_op, scan_externs, scan_kernels  # noqa: E402
from triton_helpers import Reduction, Store, acc, build, buf, kernel, ld, r0, x0  # noqa: E402
from fxwrap.targets.cuda_triton.tiling import Planner  # noqa: E402
from fxwrap.ir.lines import CallKernel, ZeroFill  # noqa: E402


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", SCAN_OPS)
def test_opinfo_scans(name, dtype, dynamic):
    if dynamic and not GPU:
        pytest.skip("dynamic shapes through the slow interpreter: tests/cpu/test_scans.py runs cumsum and cummax")
    assert check_scan_op(name, dtype, TARGET_NAME, dynamic=dynamic, device=DEVICE.type) > 0


# GPU: a long-row plan from 32768 elements on; the interpreter from 64
LONG = 1 << 20 if GPU else 300
LONG_FNS = {"cumsum": lambda x: torch.cumsum(x, -1), "logcumsumexp": lambda x: torch.logcumsumexp(x, -1),
            "cummax": lambda x: torch.cummax(x, -1), "cumprod": lambda x: torch.cumprod(1 + x * 1e-3, -1),
            "cumsum-int": lambda x: torch.cumsum((x * 100).to(torch.int32), -1)}
LONG_PLANS = {"cummax": "split-scan"}  # the others: lookback-scan


def _assert_close_to_exact(op: str, fn, x, got) -> None:
    """Integer scans and cummax: eager's numbers exactly.  Float scans: rounding accumulates
    over a long row (and eager's CUDA kernels accumulate bf16 in bf16), so the check is against
    the float64 scan: as close to it as eager, within a factor."""
    want = fn(x)
    if op in ("cumsum-int", "cummax"):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        return
    exact = fn(x.double())
    ours, eagers = (got.double() - exact).abs().max().item(), (want.double() - exact).abs().max().item()
    eps = torch.finfo(got.dtype).eps
    # a product's rounding errors compound (relative ones, one per factor, growing like the
    # square root of the row for random ones): eager's own may be lucky on one seed
    # (300 factors: eager 3.7 eps, fxwrap 16.8 eps at one seed in 300)
    steps = 4 * x.shape[-1] ** 0.5 if op == "cumprod" else 8
    assert ours <= 2 * eagers + steps * eps * exact.abs().max().item(), (op, got.dtype, ours, eagers)


def _plans(programs) -> list[str]:
    return [line.kernel.launch.plan for p in programs for line in p.lines
            if isinstance(line, CallKernel) and "_scan_" in line.kernel.name]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("op", ["cumsum", "logcumsumexp", "cummax", "cumprod", "cumsum-int"])
def test_long_rows(op, dynamic, monkeypatch):
    monkeypatch.setattr(Planner, "lookback_min_elements", 0)  # GPU: the look-back from the split's sizes on
    fn = LONG_FNS[op]
    x = torch.randn(2, LONG, device=DEVICE)
    f, programs = compiled(fn, dynamic=dynamic)
    _assert_close_to_exact(op, fn, x, f(x))
    assert not scan_externs(programs) and scan_kernels(programs)
    assert _plans(programs) == [LONG_PLANS.get(op, "lookback-scan")], _plans(programs)
    calls = [line for p in programs for line in p.lines if isinstance(line, CallKernel)]
    roles = [a.role for c in calls for a in c.kernel.signature]
    assert "workspace" in roles, [c.kernel.signature for c in calls]
    if op == "cummax":
        assert any("split scan" in c.kernel.source for c in calls)
    else:  # the ticket and status words start at zero: a ZeroFill line before the launch
        assert any(isinstance(line, ZeroFill) for p in programs for line in p.lines)
        assert any("look-back scan" in c.kernel.source for c in calls)


def test_two_scans_of_one_kernel_share_the_workspace(monkeypatch):
    """A hand-built kernel with two scans (float32: one packed word per chunk; int64: three)
    and one ticket: each scan's status words in their own area of the one workspace."""
    monkeypatch.setattr(Planner, "lookback_min_elements", 0)
    rows, n = 3, (1 << 17 if GPU else 300)
    k = kernel("scans2", [buf("a", (rows, n)), buf("b", (rows, n), torch.int64)],
               [buf("o", (rows, n)), buf("p", (rows, n), torch.int64)],
               [Store("o", n * x0 + r0, acc("acc0", torch.float32)), Store("p", n * x0 + r0, acc("acc1", torch.int64))],
               ranges=(rows,), reduction_ranges=(n,),
               reductions=[Reduction("acc0", "cumsum", ld("a", n * x0 + r0), torch.float32),
                           Reduction("acc1", "cumsum", ld("b", n * x0 + r0, torch.int64), torch.int64)])
    launcher, src = build(k)
    assert src.launch.plan == "lookback-scan"
    chunk = dict(src.launch.config)["RBLOCK"]
    (ws,) = src.workspaces
    assert ws.zeroed and ws.dtype == torch.int64 and int(ws.numel) == 1 + (1 + 3) * rows * -(-n // chunk)
    a = torch.randn(rows, n, device=DEVICE)
    b = torch.randint(-1000, 1000, (rows, n), device=DEVICE)
    o, p = torch.empty_like(a), torch.empty_like(b)
    launcher(a, b, o, p)
    _assert_close_to_exact("cumsum", lambda t: torch.cumsum(t, 1), a, o)
    torch.testing.assert_close(p, torch.cumsum(b, 1), rtol=0, atol=0)


# -- the look-back under real concurrency (GPU) -----------------------------------------

needs_gpu = pytest.mark.skipif(not GPU, reason="the look-back's concurrency needs a GPU (the interpreter runs "
                                               "programs one after another: tests/cpu/test_lookback_scan.py)")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 1 << 20), (4, 300_000)], ids=["1x1M", "4x300k"])
@pytest.mark.parametrize("op", ["cumsum", "cumprod", "logcumsumexp", "cumsum-int"])
def test_lookback_on_gpu(op, shape, dtype, monkeypatch):
    monkeypatch.setattr(Planner, "lookback_min_elements", 0)
    if op == "cumsum-int" and dtype != torch.float32:
        pytest.skip("one integer case")
    fn = LONG_FNS[op]
    torch._dynamo.reset()
    f, programs = compiled(fn)
    for _ in range(3):  # fresh inputs, the same program
        x = torch.randn(*shape, device=DEVICE).to(dtype)
        _assert_close_to_exact(op, fn, x, f(x))
    assert _plans(programs) == ["lookback-scan"], _plans(programs)


@needs_gpu
def test_lookback_integer_sums_are_exact_on_every_call(monkeypatch):
    """Integer sums do not depend on how the look-back groups the totals: 200 calls of a 1M
    cumsum, each equal to eager's bit for bit (a race in the status words shows up here)."""
    monkeypatch.setattr(Planner, "lookback_min_elements", 0)
    fn = LONG_FNS["cumsum-int"]
    torch._dynamo.reset()
    f, programs = compiled(fn)
    x = torch.randn(4, 1 << 20, device=DEVICE)
    want = fn(x)
    bad = sum(int(not torch.equal(f(x), want)) for _ in range(200))
    assert bad == 0, f"{bad} of 200 calls differ"
    assert _plans(programs) == ["lookback-scan"]


@needs_gpu
@pytest.mark.parametrize("op", ["cumsum", "cumsum-int", "logcumsumexp"])
def test_lookback_over_totals_only(op, monkeypatch):
    """No program publishes its inclusive prefix: every look-back walks over the totals of all
    the chunks before it (chunks of 1024: up to 1024 of them per row, 32 per step)."""
    monkeypatch.setattr(Planner, "lookback_publish_prefix", False)
    monkeypatch.setattr(Planner, "lookback_min_elements", 0)
    monkeypatch.setattr(Planner, "lookback_max_chunk", 1024)
    fn = LONG_FNS[op]
    torch._dynamo.reset()
    f, programs = compiled(fn)
    x = torch.randn(2, 1 << 20, device=DEVICE)
    for _ in range(5):
        _assert_close_to_exact(op, fn, x, f(x))
    (launch,) = [line.kernel.launch for p in programs for line in p.lines if isinstance(line, CallKernel)]
    assert launch.plan == "lookback-scan" and dict(launch.config)["PUBLISH_PREFIX"] == 0
    assert dict(launch.config)["RBLOCK"] == 1024


@pytest.mark.skipif(not GPU, reason="a bandwidth measurement: needs a GPU (benchmarks/scans.py measures it)")
def test_one_row_1m_cumsum_bandwidth():
    """Reported, not asserted (timings on a shared machine): the fraction of the copy
    bandwidth the 1-row 1M-element float32 cumsum reaches; the bar is 0.70."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "benchmarks"))
    import scans
    r = scans.measure("cumsum", 1, 1 << 20, torch.float32, "cuda")
    print(f"\n1x1M cumsum ({r['plan']}): fxwrap {r['scan_us']:.1f} us, copy {r['copy_us']:.1f} us, eager {r['eager_us']:.1f} us, "
          f"fraction of copy {r['fraction_of_copy']:.2f}")
    assert r["fraction_of_copy"] > 0.0 and r["plan"] == "split-scan", r


@needs_gpu
def test_long_row_plan_by_size():
    """The two-launch split scan up to ``lookback_min_elements`` (it was faster on the H200
    there), the one-launch look-back from there on."""
    fn = LONG_FNS["cumsum"]
    for n, plan in ((1 << 20, "split-scan"), (Planner.lookback_min_elements, "lookback-scan")):
        torch._dynamo.reset()
        f, programs = compiled(fn)
        x = torch.randn(1, n, device=DEVICE)
        _assert_close_to_exact("cumsum", fn, x, f(x))
        assert _plans(programs) == [plan], (n, _plans(programs))
