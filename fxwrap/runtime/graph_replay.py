"""Record a program once, replay it: the graph-capture runner every device shares.

``torch.compile(mode="reduce-overhead")`` (or fxwrap's ``mode="cudagraphs"``) on a target
whose device declares graph capture (``DeviceInterface.graph_capture()`` returns a
``GraphCapture``) runs each program as::

    first call at a size     run the GraphModule plainly (warm-up: kernels load, caches fill)
    next call                record one run (GraphCapture.record), hand out its outputs
    later calls              copy the inputs that are not static into the recording's own
                             inputs, replay, copy back the inputs the program writes

The rules, the same on every device:

* **Static inputs** (parameters and buffers: AOTAutograd's ``static_input_indices``) are used
  in place: the recording reads and writes their own memory, nothing is copied.  Their data
  pointers are part of the recording's key, so a static input whose storage moved (a
  parameter swapped, a cache re-allocated) makes a new recording: never a stale read.
* **Mutation**: a write into a static input (a KV cache's ``index_copy_``, batch norm's
  running statistics) is part of the recording and happens in place.  A write into any other
  input happens on the recording's copy and is copied back into the caller's tensor after
  each replay.  Neither turns graphs off.
* **Sizes**: one recording per distinct key (each non-static tensor's sizes and strides, each
  scalar input's value, each static input's data pointer), at most ``max_recordings``
  per program; past that, plain runs.  Every decision is logged to ``fxwrap.capture``.
* **Outputs** of a replay live in the recording's memory and the next replay writes them
  again: a recording is replayed only when nothing references an output of its previous
  replay (the caller, or autograd's saved activations); otherwise another recording of
  the same key is used or made.
* **Partitions**: the Wrapper IR pass ``fxwrap.wrapper_ir.partitions`` splits a program at
  what cannot be captured (a value read back to the host, an input or op off the device) with
  ``PartitionBoundary`` lines, whose FX nodes call :func:`partition`.  :func:`capture_runner`
  splits the GraphModule there; the capturable partitions each get a runner, the others run
  as they are.

A device implements :class:`GraphCapture` (CUDA: ``fxwrap.runtime.cuda_capture``, one
``torch.cuda.CUDAGraph`` per recording; CPU: ``fxwrap.runtime.launch_list``, the program's
launches bound to their tensors).  This module imports only torch.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxwrap.runtime.kernel import Kernel

log = logging.getLogger("fxwrap.capture")


class GraphCapture:
    """What a device implements to record a run of a program and replay it.

    ``record(run, inputs)`` runs ``run(*inputs)`` once in a way that can be repeated and
    returns ``(recording, outputs)``; when it returns, the run's effects are done (CUDA:
    capture, then one replay).  ``replay(recording)`` repeats it: same input and output
    memory, same work.  A recording owns the memory of the outputs and temporaries of its
    run (CUDA: a private graph pool).  ``synchronize()`` waits for the device's queued work.
    ``device_type``: the device whose tensors a recording may take (others make the runner
    run plainly).  ``records_graph_modules``: ``record`` takes the program's GraphModule (or a
    partition of it), not whatever callable the target's wrapper made of it (the CPU launch
    list reads its nodes)::

        class MyCapture(GraphCapture):
            device_type = "mydev"
            def record(self, run, inputs):
                graph = mydev.Graph()
                with mydev.capture(graph):
                    outputs = run(*inputs)
                graph.launch()
                return graph, outputs
            def replay(self, recording):
                recording.launch()
    """

    device_type: str = ""
    records_graph_modules: bool = False

    def record(self, run: Callable, inputs: Sequence[Any]) -> tuple[Any, Any]:
        raise NotImplementedError

    def replay(self, recording: Any) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        return None


def partition(index: int, capture: bool, reason: str = "") -> None:
    """``partition(1, False, "aten._local_scalar_dense.default reads a value back to the CPU")``:
    the FX form of a ``PartitionBoundary`` line; the lines up to the next one are partition
    ``index``, recorded when ``capture``.  A no-op when the GraphModule runs as it is."""
    if isinstance(index, torch.fx.Proxy):  # FX re-tracing on unpickle
        return index.tracer.create_proxy("call_function", partition, (index, capture, reason), {})
    return None


torch.fx.node.has_side_effect(partition)

#: calls whose result shares its first argument's storage (views, the memory plan's reuse)
_VIEW_CALLS = {torch.as_strided, torch.ops.aten.as_strided.default}


def _is_view(node: torch.fx.Node) -> bool:
    target = node.target
    if target in _VIEW_CALLS or getattr(target, "__name__", "") == "view_of":
        return True
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None and not r.alias_info.is_write
                                      for r in schema.returns)


def _written_args(node: torch.fx.Node) -> list:
    """The argument values ``node`` writes into: a kernel's output, in-out and workspace
    arguments; an op's ``Tensor(a!)`` arguments (``out=``, ``copy_``'s ``self``)."""
    target = node.target
    if isinstance(target, Kernel):
        return [a for arg, a in zip(target.signature, node.args)
                if getattr(arg, "role", "input") in ("output", "inout", "workspace")]
    schema = getattr(target, "_schema", None)
    if schema is None:
        return [node.kwargs["out"]] if "out" in node.kwargs else []
    written = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if i < len(node.args) and not arg.kwarg_only:
            written.append(node.args[i])
        elif arg.name in node.kwargs:
            written.append(node.kwargs[arg.name])
    return written


def written_inputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """The positions of ``gm``'s inputs that it writes into (through views of them too)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    root: dict[torch.fx.Node, torch.fx.Node] = {p: p for p in placeholders}
    written: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if _is_view(node) and node.args and isinstance(node.args[0], torch.fx.Node):
            root[node] = root.get(node.args[0], node.args[0])
        for value in _written_args(node):
            for leaf in torch.fx.node.map_aggregate(value, lambda v: v) if isinstance(value, (list, tuple)) \
                    else (value,):
                if isinstance(leaf, torch.fx.Node) and root.get(leaf, leaf).op == "placeholder":
                    written.add(root.get(leaf, leaf))
    return tuple(i for i, p in enumerate(placeholders) if p in written)


def _unowned(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s memory on a storage that does not own it (as a device graph
    holds a pointer): recording a static input so keeps no tensor of the caller alive (a
    backward's saved activation would keep the forward's recording busy for ever).  The
    runner replays only while an input with that data pointer is passed (its key)."""
    base = t.untyped_storage()
    storage = torch._C._construct_storage_from_data_pointer(base.data_ptr(), t.device, base.nbytes())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.size(), t.stride())


class _Recording:
    """One recorded run: its own copies of the non-static inputs, the device's recording,
    the outputs (in the recording's memory), the storages last handed out."""

    def __init__(self, capture: GraphCapture, run: Callable, args: Sequence[Any], copied: Sequence[int],
                 static: Sequence[int]):
        self.inputs = list(args)
        for i in static:  # the memory, not the tensor: a recording must not keep a caller's tensor alive
            self.inputs[i] = _unowned(args[i])
        for i in copied:
            t = args[i]
            self.inputs[i] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            self.inputs[i].copy_(t)
        self.copied = tuple(copied)
        self.handle, outputs = capture.record(run, self.inputs)
        self.tuple_output = isinstance(outputs, (tuple, list))
        self.outputs = list(outputs) if self.tuple_output else [outputs]
        self.handed_out: list[torch.UntypedStorage] = []
        self.plan: _HandOutPlan | None = None

    def busy(self) -> bool:
        """True while an output of the last run is referenced (by anyone): a storage handed
        out is used by more than the reference kept here (a tensor, a view, autograd)."""
        return any(torch._C._storage_Use_Count(storage._cdata) > 1 for storage in self.handed_out)

    def hand_out(self):
        """The outputs as fresh tensors on storages of their own that do not own the memory
        (so autograd, views and the caller keep those alive, never the recording's)."""
        if self.plan is None:
            self.plan = _HandOutPlan.of(self.outputs)
        storages = [torch._C._construct_storage_from_data_pointer(*memory) for memory in self.plan.memories]
        outs = [o if layout is None else layout.tensor(storages[layout.memory])
                for o, layout in zip(self.outputs, self.plan.layouts)]
        self.handed_out = storages
        return tuple(outs) if self.tuple_output else outs[0]


@dataclass(frozen=True)
class _HandOutPlan:
    """What ``hand_out`` makes on each replay, read once per recording: the distinct memories
    the outputs live in (data pointer, device, bytes) and each output's layout over one of
    them (None: not a tensor, handed out as it is)."""

    memories: tuple
    layouts: tuple

    @classmethod
    def of(cls, outputs) -> "_HandOutPlan":
        memories: dict[int, int] = {}
        listed: list[tuple] = []
        layouts = []
        for o in outputs:
            if not isinstance(o, torch.Tensor):
                layouts.append(None)
                continue
            storage = o.untyped_storage()
            index = memories.setdefault(storage.data_ptr(), len(listed))
            if index == len(listed):
                listed.append((storage.data_ptr(), o.device, storage.nbytes()))
            layouts.append(_OutputLayout.of(o, index))
        return cls(tuple(listed), tuple(layouts))


# torch's CUDA builds make a tensor over a storage from a layout in one C++ call (what
# Inductor's CUDA-graph trees hand their outputs out with); a plain ``set_`` elsewhere.
_CUDA_TENSOR_OVER = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)


@dataclass(frozen=True)
class _OutputLayout:
    """How a recorded output is laid out over its memory (``_HandOutPlan.memories[memory]``):
    each replay makes a tensor of it over a storage that does not own the memory.  Handing out
    ~80 outputs of a captured training step with ``torch.empty(0).set_`` and a weak reference
    a storage cost 0.83 ms of host time a call on the H200 host; the CUDA path is one C++
    call an output."""

    memory: int
    dtype: torch.dtype
    device: torch.device
    storage_offset: int
    size: tuple
    stride: tuple
    metadata: dict | None  # the layout as the CUDA constructor reads it (CUDA outputs only)

    @classmethod
    def of(cls, t: torch.Tensor, memory: int) -> "_OutputLayout":
        storage = t.untyped_storage()
        layout = dict(dtype=t.dtype, device=t.device, storage_offset=t.storage_offset(), size=tuple(t.size()),
                      stride=tuple(t.stride()))
        fast = _CUDA_TENSOR_OVER is not None and t.device.type == "cuda"
        metadata = dict(layout, data_ptr=storage.data_ptr(), nbytes=storage.nbytes()) if fast else None
        return cls(memory, **layout, metadata=metadata)

    def tensor(self, storage: torch.UntypedStorage) -> torch.Tensor:
        if self.metadata is not None:
            return _CUDA_TENSOR_OVER(self.metadata, storage)
        return torch.empty(0, dtype=self.dtype, device=self.device).set_(storage, self.storage_offset, self.size,
                                                                         self.stride)


class GraphReplayRunner:
    """Runs ``run`` (a program's GraphModule, or one partition of it) through ``capture``.

    ``static``: positions of the inputs used in place (parameters, buffers); ``written``:
    positions of the inputs the program writes into (``written_inputs``); the written ones
    that are not static are copied back after each replay.  ``reason``: why the program
    must run plainly (None: it may be recorded).  See the module docstring for the rules::

        runner = GraphReplayRunner(gm, CudaGraphCapture(), static=(0, 1), written=(1,))
        runner(w, cache, x)      # warm-up: plain
        runner(w, cache, x)      # recorded: w and cache in place, x copied in
        runner(w, cache, x2)     # replayed: x2 copied in; cache written in place
    """

    max_recordings = 8

    def __init__(self, run: Callable, capture: GraphCapture, *, static: Sequence[int] = (),
                 written: Sequence[int] = (), reason: str | None = None, name: str = "program"):
        self.run, self.capture, self.name = run, capture, name
        self.__name__ = "graph_replay"  # how an FX node calling the runner names it
        self.static = tuple(sorted(set(static)))
        self.written = tuple(sorted(set(written)))
        self.copied_back = tuple(i for i in self.written if i not in self.static)
        self._others: tuple[int, ...] | None = None  # the positions of the inputs that are not static
        self.fallback_reason = reason
        self.recordings: dict[tuple, list[_Recording]] = {}
        self.warmed: set[tuple] = set()
        self.refused: set[tuple] = set()
        self.count = 0  # recordings made
        self.replays = 0
        if reason:
            log.info("%s runs without graphs: %s", name, reason)

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        log.warning("%s runs without graphs from now on: %s", self.name, reason)

    def _keys(self, args) -> tuple[tuple, tuple]:
        """(sizes key: each non-static tensor's sizes, strides and dtype, each other input's
        value; storages key: each static input's data pointer).  A static input's sizes are
        no part of it: dynamo's guards fix them, or they are size inputs (in the sizes key)."""
        if self._others is None or len(self._others) + len(self.static) != len(args):
            self._others = tuple(i for i in range(len(args)) if i not in self.static)
        sizes = []
        for i in self._others:
            a = args[i]
            sizes.append((a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a)
        return tuple(sizes), tuple([args[i].data_ptr() for i in self.static])

    def _off_device(self, args) -> bool:
        kind = self.capture.device_type
        return any(isinstance(a, torch.Tensor) and a.device.type != kind for a in args)

    def __call__(self, *args):
        if self.fallback_reason is not None:
            return self.run(*args)
        sizes, storages = self._keys(args)
        try:
            seen = sizes in self.warmed
        except TypeError:  # an input that is no tensor and no hashable value (a list)
            self._fall_back("an input is neither a tensor nor a hashable value")
            return self.run(*args)
        if not seen:  # the first run at these sizes: plain (kernels load, caches fill)
            if self._off_device(args):
                self._fall_back(f"an input is not a {self.capture.device_type} tensor")
                return self.run(*args)
            self.warmed.add(sizes)
            log.debug("%s: warm-up run at new sizes", self.name)
            return self.run(*args)
        key = (sizes, storages)
        recordings = self.recordings.get(key, ())
        for recording in recordings:
            if not recording.busy():
                return self._replay(recording, args)
        if self.count >= self.max_recordings:
            if key not in self.refused:
                self.refused.add(key)
                log.info("%s runs plainly at these sizes/storages: %d recordings made already "
                         "(GraphReplayRunner.max_recordings)", self.name, self.count)
            return self.run(*args)
        return self._record(key, args)

    def _record(self, key, args):
        moved = any(k[0] == key[0] for k in self.recordings)
        log.info("%s: recording %d (%s)", self.name, self.count + 1,
                 "the outputs of the last replay are still referenced" if key in self.recordings else
                 "a static input's storage changed" if moved else "new sizes")
        self.capture.synchronize()
        copied = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in self.static]
        try:
            recording = _Recording(self.capture, self.run, args, copied, self.static)
        except RuntimeError as exc:
            self.capture.synchronize()
            self._fall_back(f"recording failed ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
            return self.run(*args)
        self.count += 1
        self.recordings.setdefault(key, []).append(recording)
        self._copy_back(recording, args)
        return recording.hand_out()

    def _replay(self, recording: _Recording, args):
        inputs = recording.inputs
        for i in recording.copied:
            inputs[i].copy_(args[i])
        self.capture.replay(recording.handle)
        self.replays += 1
        self._copy_back(recording, args)
        return recording.hand_out()

    def _copy_back(self, recording: _Recording, args) -> None:
        for i in self.copied_back:
            args[i].copy_(recording.inputs[i])


def replay_runners(runner) -> list[GraphReplayRunner]:
    """The ``GraphReplayRunner``s of a program's runner: itself, or those its partitions call
    (``capture_runner``); empty for a program that runs without graph capture."""
    if isinstance(runner, GraphReplayRunner):
        return [runner]
    graph = getattr(runner, "graph", None)
    return [] if graph is None else [n.target for n in graph.nodes if isinstance(n.target, GraphReplayRunner)]


def _partition_of(gm: torch.fx.GraphModule) -> tuple[dict[torch.fx.Node, int], dict[int, tuple[bool, str]]]:
    """Each node's partition (from the ``partition`` nodes) and each partition's decision."""
    of: dict[torch.fx.Node, int] = {}
    decisions: dict[int, tuple[bool, str]] = {}
    current = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is partition:
            current = node.args[0]
            decisions[current] = (bool(node.args[1]), node.args[2] if len(node.args) > 2 else "")
        of[node] = current
    return of, decisions


def capture_runner(run: Callable, gm: torch.fx.GraphModule, capture: GraphCapture, *,
                   static: Sequence[int] = (), name: str = "program") -> Callable:
    """``run`` (what the target made of ``gm``: ``gm`` or a GraphModule copy of it, same
    inputs) recorded and replayed through ``capture``, partition by partition.

    Without ``partition`` nodes: one runner over the whole program.  With them: ``gm`` split
    at them (``torch.fx.passes.split_module``); each partition marked for capture gets a
    ``GraphReplayRunner`` of its own (its static inputs: the program's static inputs it
    takes), the others run as they are."""
    if capture.records_graph_modules and not isinstance(run, torch.fx.GraphModule):
        log.info("%s: the device records the program's GraphModule, not the wrapper's %s",
                 name, type(run).__name__)
        run = gm
    of, decisions = _partition_of(gm)
    if not decisions:
        return GraphReplayRunner(run, capture, static=static, written=written_inputs(gm), name=name)
    if len(decisions) == 1:
        (capturable, reason), = decisions.values()
        return GraphReplayRunner(run, capture, static=static, written=written_inputs(gm), name=name,
                                 reason=None if capturable else reason)
    source = run if isinstance(run, torch.fx.GraphModule) else gm
    if source is not gm:
        of, _ = _partition_of(source)
    split = torch.fx.passes.split_module.split_module(source, source, lambda node: of[node],
                                                      keep_original_order=True)
    placeholders = [n for n in split.graph.nodes if n.op == "placeholder"]
    static_nodes = {placeholders[i] for i in static if i < len(placeholders)}
    for node in list(split.graph.nodes):
        if node.op != "call_module":
            continue
        index = int(node.target.rsplit("_", 1)[-1])
        capturable, reason = decisions.get(index, (False, "no decision"))
        label = f"{name} partition {index}"
        if not capturable:
            log.info("%s runs plainly: %s", label, reason)
            continue
        sub = getattr(split, node.target)
        runner = GraphReplayRunner(sub, capture, name=label, written=written_inputs(sub),
                                   static=[j for j, a in enumerate(node.args) if a in static_nodes])
        with split.graph.inserting_before(node):
            call = split.graph.call_function(runner, tuple(node.args), dict(node.kwargs))
        node.replace_all_uses_with(call)
        split.graph.erase_node(node)
        log.info("%s is recorded and replayed", label)
    split.recompile()
    return split


