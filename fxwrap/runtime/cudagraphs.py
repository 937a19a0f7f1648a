"""``options={"mode": "cudagraphs"}``: record a program once into a CUDA graph, then replay it.

A program whose every input is a CUDA tensor of fixed layout, and which neither
reads a value back to the CPU nor writes into its inputs, runs as::

    first call       run the GraphModule normally (warm-up: kernels load, caches fill)
    second call      copy the inputs into static inputs, capture one run into a graph
    later calls      copy the inputs into the static inputs, replay the graph

The outputs of a replay live in the graph's own memory and the next replay writes
them again.  So a graph is replayed only when no output of its previous replay is
still referenced (by the caller or by autograd, which saves forward outputs for the
backward); otherwise the runner replays another recording of the same program, and
records a new one if every recording is busy (at most ``max_graphs``; past that it
runs the GraphModule, which allocates fresh outputs).

Everything else runs the GraphModule as it is, with the reason logged once:
dynamic sizes (size symbols are program inputs), inputs that are not CUDA tensors,
programs that write into their inputs, and programs whose capture fails (a CPU
synchronization inside, for instance).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from fxwrap.core.symbolic import is_non_overlapping_and_dense
from fxwrap.wrapper_ir.lines import Buffer, SizeInput

log = logging.getLogger("fxwrap")


class _Recording:
    """One captured replay: static inputs, the graph, static outputs.

    A replay hands out fresh tensors over the static outputs' memory, on storages of
    their own that do not own it (so autograd, views and the caller keep those
    storages alive, never the graph's memory).  Weak references to them say whether
    anything still holds an output of the last replay.
    """

    def __init__(self, run: Callable, example: Sequence[torch.Tensor], pool):
        self.inputs = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
                       for t in example]
        for static, t in zip(self.inputs, example):
            static.copy_(t)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            outputs = run(*self.inputs)
        self.tuple_output = isinstance(outputs, (tuple, list))
        self.outputs = list(outputs) if self.tuple_output else [outputs]
        self.handed_out: list[StorageWeakRef] = []

    def busy(self) -> bool:
        """True while an output of the last replay is referenced (by anyone)."""
        return any(not ref.expired() for ref in self.handed_out)

    def replay(self, args: Sequence[torch.Tensor]):
        for static, t in zip(self.inputs, args):
            if static.data_ptr() != t.data_ptr():
                static.copy_(t)
        self.graph.replay()
        storages: dict[int, torch.UntypedStorage] = {}  # one per static storage
        outs = []
        for o in self.outputs:
            if not isinstance(o, torch.Tensor):
                outs.append(o)
                continue
            base = o.untyped_storage()
            if base.data_ptr() not in storages:
                storages[base.data_ptr()] = torch._C._construct_storage_from_data_pointer(
                    base.data_ptr(), o.device, base.nbytes())
            fresh = torch.empty(0, dtype=o.dtype, device=o.device)
            outs.append(fresh.set_(storages[base.data_ptr()], o.storage_offset(), o.size(), o.stride()))
        self.handed_out = [StorageWeakRef(st) for st in storages.values()]
        return tuple(outs) if self.tuple_output else outs[0]


class CudaGraphRunner:
    """Runs ``run`` (a compiled program) through CUDA graphs where that is safe.

    ``synchronize``: waits for the device's queued work (the target's
    ``DeviceInterface.synchronize``, handed down by the compiler: the runtime imports
    no target), called before each recording and after a failed one.
    """

    max_graphs = 4

    def __init__(self, run: Callable, unsafe_reason: str | None, name: str = "program", *,
                 synchronize: Callable[[], None]):
        self.run, self.name = run, name
        self.synchronize = synchronize
        self.fallback_reason = unsafe_reason
        self.calls = 0
        self.recordings: list[_Recording] = []
        self.layout = None
        if unsafe_reason:
            log.info("fxwrap cudagraphs: %s runs without CUDA graphs: %s", name, unsafe_reason)

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        log.warning("fxwrap cudagraphs: %s runs without CUDA graphs from now on: %s", self.name, reason)

    def __call__(self, *args):
        if self.fallback_reason is not None:
            return self.run(*args)
        if not all(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            self._fall_back("an input is not a CUDA tensor")
            return self.run(*args)
        layout = tuple((a.shape, a.stride(), a.dtype, a.device) for a in args)
        if self.layout is None:
            if not all(is_non_overlapping_and_dense(a.shape, a.stride()) for a in args):
                self._fall_back("an input overlaps itself or has gaps (expanded, strided)")
                return self.run(*args)
            self.layout = layout
        elif layout != self.layout:
            self._fall_back("input layouts changed between calls")
            return self.run(*args)
        self.calls += 1
        if self.calls == 1:  # warm-up outside capture
            return self.run(*args)
        for recording in self.recordings:
            if not recording.busy():
                return recording.replay(args)
        if len(self.recordings) >= self.max_graphs:
            return self.run(*args)
        return self._record(args)

    def _record(self, args):
        self.synchronize()
        try:
            # a fresh pool per recording: recordings never share output memory
            recording = _Recording(self.run, args, torch.cuda.graph_pool_handle())
        except RuntimeError as exc:
            self.synchronize()
            self._fall_back(f"capture failed ({str(exc).splitlines()[0]})")
            return self.run(*args)
        self.recordings.append(recording)
        return recording.replay(args)


def graph_safety(program) -> str | None:
    """Why ``program`` must not be captured into a CUDA graph, or None when it may be."""
    if any(isinstance(i, SizeInput) for i in program.inputs):
        return "dynamic sizes (size symbols are program inputs)"
    inputs = [i for i in program.inputs if isinstance(i, Buffer)]
    if any(i.device.type != "cuda" for i in inputs):
        return "an input is not on a CUDA device"
    input_names = {i.name for i in inputs}
    for line in program.lines:
        reason = line.host_readback()
        if reason is not None:
            return reason
        if {b.name for b in line.writes()} & input_names:
            return f"{line.label} writes into a program input"
    return None
