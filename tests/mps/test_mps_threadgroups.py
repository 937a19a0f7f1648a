"""Reductions run one threadgroup of many threads per row; barriers are real barriers."""
from __future__ import annotations

import dataclasses
import pytest
import torch

import fxwrap
from fxwrap.targets.base import Target, WrapperCodegen
from fxwrap.targets.host.device import CpuDevice
from fxwrap.targets.mps_metal.emitter import MetalEmitter
from fxwrap.targets.mps_metal.shim_runner import ShimKernel
from metal_helpers import kernels, lowering_tests_module

_lowerings = lowering_tests_module()


def shim_target(threadgroup_size: int) -> Target:
    return Target("mps_shim", "cpu", CpuDevice(), MetalEmitter, WrapperCodegen,
                  options={"execute": "shim", "threadgroup_size": threadgroup_size})


@pytest.mark.parametrize("threadgroup_size", [32, 96])  # one SIMD group; three
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reductions_run_in_threadgroups(threadgroup_size, dtype):
    """Every reduction lowering, with each row reduced by a team of threads that
    really ran concurrently (the shim reports the team size it ran)."""
    x = _lowerings.make("transposed", dtype, shape=(13, 203))
    programs = []
    f = torch.compile(_lowerings.reductions,
                      backend=fxwrap.Backend(shim_target(threadgroup_size), {"on_program": programs.append}))
    got, want = f(x), _lowerings.reductions(x)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else _lowerings.TOL[dtype]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True, **tol)
    reds = [k for k in kernels(programs) if k.launch.kind == "reduction"]
    assert len(reds) >= 3  # rows, columns and the whole tensor (fused: several reductions per kernel)
    externs = [n.target for p in programs for n in p.graph_module.graph.nodes
               if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target.__name__.split(".")[0] not in ("sym_size", "sym_stride", "sym_storage_offset")]
    assert not externs, externs  # every reduction ran in a kernel
    for k in reds:
        assert k.launch.threadgroup_size == threadgroup_size
        assert k._launcher.shim.team_size == threadgroup_size > 1
        assert "simd_" in k.source and "threadgroup_barrier(mem_flags::mem_threadgroup);" in k.source


def test_nan_and_ties_follow_torch():
    """max/min propagate NaN; argmax/argmin pick the first of equal values (and the first NaN)."""
    x = torch.randint(-3, 4, (9, 150)).float()  # many ties
    x[2, 77] = float("nan")
    x[2, 120] = float("nan")
    x[5, 3] = float("nan")
    fn = lambda x: (x.amax(1), x.amin(1), x.argmax(1), x.argmin(1), x.argmax(0), x.max(), x.sum(1))  # noqa: E731
    f = torch.compile(fn, backend=fxwrap.Backend(shim_target(64)))
    for g, w in zip(f(x), fn(x)):
        torch.testing.assert_close(g, w, equal_nan=True)


# Each thread of a threadgroup writes its slot of threadgroup memory, waits at the
# barrier, then reads the slot its right-hand neighbour wrote.
NEIGHBOUR = """
#include <metal_stdlib>
using namespace metal;

kernel void neighbour(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                      uint gid [[thread_position_in_grid]],
                      uint tid [[thread_position_in_threadgroup]],
                      uint tg [[threads_per_threadgroup]])
{
  threadgroup float slot[64];
  slot[tid] = in[gid] * 2.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[gid] = slot[(tid + 1) % tg] + 1.0f;
}
"""


def test_barrier_has_its_real_meaning():
    tg, groups = 64, 5
    k = ShimKernel(NEIGHBOUR, "neighbour", pointers=2, sizes=0,
                   thread_args=("thread_position_in_grid", "thread_position_in_threadgroup",
                                "threads_per_threadgroup"))
    x = torch.randn(groups * tg)
    want = (x.view(groups, tg).roll(-1, dims=1) * 2 + 1).reshape(-1)

    out = torch.full_like(x, float("nan"))
    k.run([x, out], [], groups, tg, mode="teams")
    assert k.team_size == tg
    torch.testing.assert_close(out, want)

    # The same kernel with the threads of a group run one after another: thread t reads
    # slot t+1 before thread t+1 has written it (it holds the previous group's value).
    seq = torch.full_like(x, float("nan"))
    k.run([x, seq], [], groups, tg, mode="sequential")
    wrong = (seq - want).abs() > 1e-6
    assert wrong.view(groups, tg)[1:, :-1].all()  # every group after the first, every thread but the last
    assert not wrong.view(groups, tg)[:, -1].any()  # the last thread's neighbour (slot 0) was written


class _SmallThreadgroups(CpuDevice):
    """A CPU device whose capabilities cap a threadgroup at 64 threads."""

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), max_threads_per_threadgroup=64)


@pytest.mark.parametrize("threadgroup_size, kernels_expected", [(64, True), (128, False)])
def test_threadgroup_limit_comes_from_the_device_capabilities(threadgroup_size, kernels_expected):
    """A threadgroup larger than the device's ``max_threads_per_threadgroup`` is no kernel
    the device could launch: the reduction runs as an ATen extern call instead."""
    target = Target("mps_shim_small", "cpu", _SmallThreadgroups(), MetalEmitter, WrapperCodegen,
                    options={"execute": "shim", "threadgroup_size": threadgroup_size})
    x = torch.randn(13, 203)
    programs = []
    torch._dynamo.reset()
    f = torch.compile(lambda t: t.sum(1), backend=fxwrap.Backend(target, {"on_program": programs.append}))
    torch.testing.assert_close(f(x), x.sum(1), rtol=1e-4, atol=1e-4)
    reds = [k for k in kernels(programs) if k.launch.kind == "reduction"]
    assert bool(reds) == kernels_expected, programs[0].code()
    if not kernels_expected:
        assert "aten.sum" in programs[0].code()
