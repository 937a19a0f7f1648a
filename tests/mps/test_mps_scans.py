"""Scans on the Metal target through its C++ shim (``mps_shim``): every OpInfo sample of the
scan ops in a kernel (one thread per row) with eager's numbers, fp32 and bf16, static and
dynamic shapes; few long rows as one threadgroup per row with the chunk totals in a workspace
(tests/cpu/test_scans.py has the other targets)."""
from __future__ import annotations

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import CallKernel
from scan_helpers import SCAN_OPS, check_float_scan, check_scan_op, scan_fn, scan_input, workspaces


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", SCAN_OPS)
def test_opinfo_scan_in_a_metal_kernel(name, dtype, dynamic):
    assert check_scan_op(name, dtype, "mps_shim", dynamic) > 0


# -- few long rows: one threadgroup per row, chunk totals in a workspace (mps_metal/scan.py) ------

_LONG = 40001  # 157 chunks of 255 elements


def _shim_target(threadgroup_size: int):
    from fxwrap.targets.base import Target, WrapperCodegen
    from fxwrap.targets.host.device import CpuDevice
    from fxwrap.targets.mps_metal.emitter import MetalEmitter
    return Target("mps_shim", "cpu", CpuDevice(), MetalEmitter, WrapperCodegen,
                  options={"execute": "shim", "threadgroup_size": threadgroup_size})


def _lower(fn, x, threadgroup_size: int):
    programs: list = []
    compiled = torch.compile(fn, backend=fxwrap.Backend(_shim_target(threadgroup_size),
                                                        {"on_program": programs.append, "cache": False}))
    return compiled(x), programs[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=["fp32", "bf16", "int64"])
@pytest.mark.parametrize("name", SCAN_OPS)
def test_metal_split_scan(name, dtype):
    """3 rows of 40001: one threadgroup per row (a grouped launch with barriers), the chunk
    totals in workspaces of 3 * 157 states; eager's numbers (cummax/cummin and integers
    exactly), and the same bits with 32 and 96 threads per threadgroup (the chunks do not
    depend on it)."""
    if not dtype.is_floating_point and name == "logcumsumexp":
        pytest.skip("logcumsumexp has no integer kernel in eager")
    x = scan_input(name, (3, _LONG), dtype)
    fn = scan_fn(name)
    got, p = _lower(fn, x, 32)
    torch._dynamo.reset()
    again, p96 = _lower(fn, x, 96)
    torch._dynamo.reset()
    assert [line.kernel.launch.threadgroup_size for line in p96.lines if isinstance(line, CallKernel)] == [96]
    for g, a in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(again)):
        assert torch.equal(g.view(torch.uint8) if g.is_floating_point() else g,
                           a.view(torch.uint8) if a.is_floating_point() else a)
    (kernel,) = [line.kernel for line in p.lines if isinstance(line, CallKernel)]
    assert kernel.launch.kind == "reduction" and kernel.launch.sync and kernel.launch.grid == "3"
    extreme = name in ("cummax", "cummin")
    state = str(torch.float32 if dtype.is_floating_point else torch.int64)
    assert sorted(workspaces(p)) == sorted([(3 * 157, state)] + ([(3 * 157, "torch.int64")] if extreme else []))
    want = fn(x)
    if extreme:
        assert torch.equal(got[1], want[1])
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
    elif dtype.is_floating_point:
        check_float_scan(got, x, name, 1)
    else:
        assert torch.equal(got, want)


def test_metal_many_or_short_rows_stay_one_thread_per_row():
    for shape in [(300, 5000), (4, 4095)]:
        x = torch.randn(shape)
        got, p = _lower(lambda t: torch.cumsum(t, 1), x, 32)
        torch._dynamo.reset()
        check_float_scan(got, x, "cumsum", 1)
        (kernel,) = [line.kernel for line in p.lines if isinstance(line, CallKernel)]
        assert kernel.launch.kind == "pointwise" and not workspaces(p), shape
