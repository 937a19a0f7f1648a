"""Scans on the Triton target (``cuda`` on a GPU, ``triton-interpret`` without one): the
OpInfo samples of every scan op in a kernel with eager's numbers, long rows split into
chunks whose totals live in a workspace (an ``Allocate`` line of the program), and, on a GPU,
the 1-row 1M-element cumsum against a copy of the same bytes (issue 18's bar: 70%)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from triton_helpers import DEVICE, GPU, TARGET_NAME, compiled

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu"))
from scan_helpers import SCAN_OPS, check_scan_op, scan_externs, scan_kernels  # noqa: E402
from fxwrap.wrapper_ir.lines import CallKernel  # noqa: E402


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", SCAN_OPS)
def test_opinfo_scans(name, dtype, dynamic):
    if dynamic and not GPU:
        pytest.skip("dynamic shapes through the slow interpreter: tests/cpu/test_scans.py runs cumsum and cummax")
    assert check_scan_op(name, dtype, TARGET_NAME, dynamic=dynamic, device=DEVICE.type) > 0


# GPU: a split from 32768 elements on; the interpreter splits from 64
LONG = 1 << 20 if GPU else 300


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("op", ["cumsum", "logcumsumexp", "cummax", "cumprod"])
def test_long_rows_split(op, dynamic):
    fns = {"cumsum": lambda x: torch.cumsum(x, -1), "logcumsumexp": lambda x: torch.logcumsumexp(x, -1),
           "cummax": lambda x: torch.cummax(x, -1), "cumprod": lambda x: torch.cumprod(1 + x * 1e-3, -1)}
    fn = fns[op]
    x = torch.randn(2, LONG, device=DEVICE)
    f, programs = compiled(fn, dynamic=dynamic)
    got, want = f(x), fn(x)
    if op == "cummax":
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    else:  # rounding accumulates over a long row: as close to the float64 scan as eager, within a factor
        exact = fn(x.double())
        ours, eagers = (got.double() - exact).abs().max().item(), (want.double() - exact).abs().max().item()
        assert ours <= 2 * eagers + 8 * torch.finfo(torch.float32).eps * exact.abs().max().item(), (ours, eagers)
    assert not scan_externs(programs) and scan_kernels(programs)
    calls = [line for p in programs for line in p.lines if isinstance(line, CallKernel)]
    roles = [a.role for c in calls for a in c.kernel.signature]
    assert "workspace" in roles, [c.kernel.signature for c in calls]
    assert any("split scan" in c.kernel.source for c in calls)


@pytest.mark.skipif(not GPU, reason="a bandwidth measurement: needs a GPU (benchmarks/scans.py measures it)")
def test_one_row_1m_cumsum_bandwidth():
    """Reported, not asserted (timings on a shared machine): the fraction of the copy
    bandwidth the 1-row 1M-element float32 cumsum reaches; the bar is 0.70."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "benchmarks"))
    import scans
    r = scans.measure("cumsum", 1, 1 << 20, torch.float32, "cuda")
    print(f"\n1x1M cumsum: fxwrap {r['scan_us']:.1f} us, copy {r['copy_us']:.1f} us, eager {r['eager_us']:.1f} us, "
          f"fraction of copy {r['fraction_of_copy']:.2f}")
    assert r["fraction_of_copy"] > 0.0
