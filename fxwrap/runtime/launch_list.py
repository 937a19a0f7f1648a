"""Graph capture on the CPU: a program's launches bound to their tensors, replayed in a loop.

``LaunchListCapture`` is the CPU device's ``GraphCapture`` (``fxwrap.runtime.graph_replay``).
Recording runs the GraphModule once, node by node, and keeps what must run again::

    GraphModule                                    recorded                 replayed
    check_inputs(guard, arg0, arg1)                runs once                -
    buf0 = empty_strided((8, 16), ...)             runs once, kept          -
    buf1 = as_strided(arg0, ...)                   runs once (a view)       -
    fxwrap_pointwise_0(arg1, buf1, buf0)           runs                     launcher(arg1, buf1, buf0)
    torch.mm(buf0, arg2, out=buf2)                 runs                     torch.mm(buf0, arg2, out=buf2)
    buf3 = aten.sort.default(buf2)                 runs, result kept        buf3.copy_(sort(buf2))
    free(buf0)                                     skipped (kept)           -
    s1 = sym_min(1, s0)                            runs once (host sizes)   -

A replay is a loop over pre-bound calls: no FX code per node, no allocation, no view, no
input check (the runner keys each recording on its inputs' sizes and storages).  A recording
holds every buffer of its run alive, as a CUDA graph's private pool does.  A node that gives
the host a value it did not have (``aten._local_scalar_dense``) cannot be replayed: recording
fails with a ``RuntimeError`` naming it, and the runner runs the program plainly.

What it saves (a 2-layer, 64-wide decoder step with a KV cache, 172 Wrapper IR lines, 31
launches, one thread, best of 60 rounds on a loaded 2-core machine): the plain GraphModule
618 us a call, the runner replaying the launch list 330 us, the bare list 201 us.  A partition
of a few launches gains little: the runner's own work per call (keys, input copies, outputs
handed out) is tens of microseconds here.
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxwrap.runtime.direct import empty_strided_cpu, size_of, stride_of, storage_offset
from fxwrap.runtime.guards import check_inputs
from fxwrap.runtime.graph_replay import GraphCapture, partition
from fxwrap.runtime.kernel import Kernel
from fxwrap.runtime.memory import free

#: calls that run once at recording: the input check (the runner keys recordings on the inputs
#: instead), allocations, host size arithmetic, metadata reads (any other call that reads no
#: tensor and returns a host value runs once too)
_ONCE = frozenset({check_inputs, torch.empty_strided, torch.ops.aten.empty_strided.default, torch.empty,
                   size_of, stride_of, storage_offset, operator.getitem,
                   operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
                   operator.neg, operator.pow, operator.truediv, max, min,
                   torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int,
                   torch.ops.aten.sym_storage_offset.default, torch.ops.aten.sym_numel.default}
                  | ({empty_strided_cpu} if empty_strided_cpu is not None else set()))
#: calls dropped from a recording (it keeps every buffer alive; partitions mark nothing)
_SKIPPED = frozenset({free, partition})


def _storages(value) -> set[int]:
    found: set[int] = set()
    for v in (value if isinstance(value, (list, tuple)) else (value,)):
        if isinstance(v, torch.Tensor):
            found.add(v.untyped_storage().data_ptr())
        elif isinstance(v, (list, tuple)):
            found |= _storages(v)
    return found


def _writes(target, kwargs) -> bool:
    if isinstance(target, Kernel) or "out" in kwargs:
        return True
    schema = getattr(target, "_schema", None)
    return schema is not None and any(a.alias_info is not None and a.alias_info.is_write
                                      for a in schema.arguments)


def _copy_into(fn, args, kwargs, results):
    def call():
        fresh = fn(*args, **kwargs)
        for kept, new in zip(results, fresh if isinstance(fresh, (tuple, list)) else (fresh,)):
            if isinstance(kept, torch.Tensor):
                kept.copy_(new)
    return call


class LaunchList:
    """The calls of one recorded run, each bound to its arguments: ``replay()`` calls them."""

    def __init__(self, calls: list[Callable], keep: list):
        self.calls = tuple(calls)
        self.keep = keep  # every tensor of the run (the recording's memory)

    def replay(self) -> None:
        for call in self.calls:
            call()


def record_launches(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> tuple[LaunchList, Any]:
    """Run ``gm`` on ``inputs`` once, node by node; the launch list that repeats it and the
    outputs of the run."""
    env: dict[torch.fx.Node, Any] = {}
    calls: list[Callable] = []
    placeholders = iter(inputs)
    outputs = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders)
            continue
        if node.op == "get_attr":
            value = gm
            for part in node.target.split("."):
                value = getattr(value, part)
            env[node] = value
            continue
        if node.op == "output":
            outputs = torch.fx.node.map_arg(node.args[0], env.__getitem__)
            break
        target = node.target if node.op == "call_function" else getattr(gm, node.target)
        once = not isinstance(target, Kernel) and _hashable(target) and (target in _ONCE or target in _SKIPPED)
        if once and target in _SKIPPED:
            continue
        args = torch.fx.node.map_arg(node.args, env.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
        result = target(*args, **kwargs)
        env[node] = result
        if once:
            continue
        if isinstance(target, Kernel):
            calls.append(functools.partial(target.launcher(), *args))
        elif _writes(target, kwargs) or result is None:
            calls.append(functools.partial(target, *args, **kwargs))
        elif isinstance(result, torch.Tensor) or (isinstance(result, (tuple, list)) and _storages(result)
                                                  and all(r is None or isinstance(r, torch.Tensor) for r in result)):
            if _storages(result) <= _storages((args, tuple(kwargs.values()))):
                continue  # a view (or the memory plan's reuse) of what it reads: metadata only
            calls.append(_copy_into(target, args, kwargs, result if isinstance(result, (tuple, list))
                                    else (result,)))
        elif not _storages((args, tuple(kwargs.values()))):
            continue  # host arithmetic on sizes: the runner keys each recording on their values
        else:
            raise RuntimeError(f"{node.format_node()} gives the host a value ({type(result).__name__}) "
                               "that a recorded launch list cannot replay")
    keep = [v for v in env.values() if isinstance(v, torch.Tensor)]
    return LaunchList(calls, keep), outputs


def _hashable(target) -> bool:
    try:
        hash(target)
    except TypeError:
        return False
    return True


class LaunchListCapture(GraphCapture):
    """A ``GraphCapture`` for any device whose kernels are plain calls: a recording is a
    ``LaunchList`` of a GraphModule's run (what the target's wrapper made of the program, or
    one partition of it), the kernel and extern calls bound to their tensors.  The CPU's
    (``CpuDevice.graph_capture``); a device without a graph API of its own returns one with
    its device type::

        class MyDevice(fxwrap.DeviceInterface):
            device_type = "npu"
            def graph_capture(self):
                return fxwrap.LaunchListCapture("npu")   # records npu tensors only
    """

    records_graph_modules = True

    def __init__(self, device_type: str):
        self.device_type = device_type

    def record(self, run, inputs):
        if not isinstance(run, torch.fx.GraphModule):
            raise RuntimeError(f"the {self.device_type} launch list records a GraphModule, not {type(run).__name__}")
        return record_launches(run, inputs)

    def replay(self, recording: LaunchList) -> None:
        recording.replay()
