"""``fxwrap.profile``: time each kernel and extern launch of a program.

    program = fxwrap.lower(model, x)
    report = fxwrap.profile(program, x, warmup=3, iters=20)
    print(report)
    fxwrap.profile: inference program on target cpu, 20 calls of 1.95 ms (launches: 1.90 ms, 97.4%)
    name                 kind    calls  total ms  share  GB/s   provenance
    aten.mm.out          extern     20     21.10  54.1%  12.4   mm: aten.mm.default at model.py:12 in forward
    fxwrap_pointwise_0   kernel     20      9.03  23.2%  37.5   from: gelu
    ...
    report.to_chrome_trace("trace.json")        # chrome://tracing or ui.perfetto.dev

The program's GraphModule runs under an FX interpreter that times every launch: the
host clock on a CPU, a pair of CUDA events around each launch on a GPU (read once per
call, after a synchronization).  Everything else the program does (allocations, frees,
views, the input guard) is the ``overhead`` line: the measured call time (the program
run as usual, ``iters`` times) less the launches.  Bytes per launch are the sizes of the
tensors it is given (inputs and outputs, each storage once); GB/s is bytes over time.

What to pass: a ``Program`` (``fxwrap.lower(fn, *args)``; ``args`` are then ``fn``'s own
arguments, as for ``program.run``), a ``Program`` collected with
``options={"on_program": programs.append}`` from ``torch.compile`` (``args`` are then the
graph inputs, parameters included, in ``program.inputs`` order), or any other callable, a
``torch.compile``'d one included: it is lowered again with ``fxwrap.lower(fn, *args,
target=..., options=...)`` (its original function, one graph) and that program is timed;
for a ``torch.compile``'d callable the target and options are those it was compiled with
(``compiled_options``), unless ``profile`` is given others.
"""
from __future__ import annotations

import dataclasses
import json
import operator
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.fx

from fxwrap import registration
from fxwrap.api import Backend, dynamo_backend, lower
from fxwrap.programs.program import Program
from fxwrap.plugins.debug_modes import provenance
from fxwrap.runtime.kernel import Kernel
from fxwrap.targets.base import DeviceInterface

#: what a program calls to manage memory, sizes, checks and device context: not launches
_BOOKKEEPING_MODULES = ("fxwrap.",)  # runtime helpers, direct calls, target prologues
_BOOKKEEPING = frozenset({torch.empty_strided, torch.as_strided, torch.ops.aten.sym_size.int,
                          torch.ops.aten.sym_stride.int, torch.ops.aten.sym_storage_offset.default,
                          torch.ops.aten.sym_numel.default})


def launch_kind(node: torch.fx.Node) -> str | None:
    """``"kernel"``, ``"extern"``, or None for a node that launches nothing (an allocation,
    a view, a free, size arithmetic, the input guard, a debug check)."""
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, Kernel):
        return "kernel"
    if target in _BOOKKEEPING or getattr(target, "__module__", "") == operator.__name__:
        return None
    if str(getattr(target, "__module__", "")).startswith(_BOOKKEEPING_MODULES):
        return None
    return "extern"


def _launch_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, Kernel):
        return target.name
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    return f"{getattr(target, '__module__', '') or ''}.{getattr(target, '__name__', target)}".lstrip(".")


def _bytes_moved(args, kwargs, result) -> int:
    """Bytes of every distinct tensor a launch is given or returns (each storage span once)."""
    seen, total = set(), 0

    def visit(value):
        nonlocal total
        if isinstance(value, torch.Tensor):
            key = (value.data_ptr(), value.numel(), value.dtype)
            if key not in seen:
                seen.add(key)
                total += value.numel() * value.element_size()
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)

    visit((args, kwargs, result))
    return total


@dataclass
class LaunchTiming:
    """One launch of a program: its ``name`` (a kernel's, or an extern's op), ``kind``
    (``"kernel"`` / ``"extern"``), the FX ``node`` name, ``provenance`` (what it computes),
    ``calls`` timed, ``total_s`` over them, ``bytes`` moved per call."""

    name: str
    kind: str
    node: str
    provenance: str
    calls: int = 0
    total_s: float = 0.0
    bytes: int = 0
    starts_s: list[float] = field(default_factory=list, repr=False)  # each call's start, from its call's start
    durations_s: list[float] = field(default_factory=list, repr=False)

    @property
    def per_call_s(self) -> float:
        """The median of its timed calls (robust to the spikes of a shared machine)."""
        if self.durations_s:
            return statistics.median(self.durations_s)
        return self.total_s / self.calls if self.calls else 0.0

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.per_call_s / 1e9 if self.per_call_s else 0.0


@dataclass
class ProfileReport:
    """What ``fxwrap.profile`` measured: ``launches`` (one ``LaunchTiming`` per kernel or
    extern launch of the program, in program order), ``call_s`` (one call of the program
    run as usual, the median of ``iters``; each one in ``call_durations_s``), ``iters``,
    ``device`` and the program's ``kind`` and ``target``.  ``str(report)`` is the table (slowest first); ``to_chrome_trace(path)``
    writes the timed calls as a Chrome trace."""

    launches: list[LaunchTiming]
    call_s: float
    iters: int
    device: str
    kind: str
    target: str
    call_starts_s: list[float] = field(default_factory=list, repr=False)
    call_durations_s: list[float] = field(default_factory=list, repr=False)

    @property
    def launch_s(self) -> float:
        """Time in launches per call (the sum over every launch)."""
        return sum(t.per_call_s for t in self.launches)

    @property
    def overhead_s(self) -> float:
        """Per call: the measured call time less the launches (allocation, frees, guard)."""
        return self.call_s - self.launch_s

    def table(self) -> str:
        rows = sorted(self.launches, key=lambda t: (-t.total_s, t.node))
        name_w = max([len("name"), *(len(t.name) for t in rows)])
        head = (f"fxwrap.profile: {self.kind} program on target {self.target} ({self.device}), {self.iters} calls "
                f"of {self.call_s * 1e3:.3f} ms (launches: {self.launch_s * 1e3:.3f} ms, "
                f"{100 * self.launch_s / self.call_s if self.call_s else 0:.1f}%)")
        lines = [head, f"{'name':<{name_w}}  {'kind':<6} {'calls':>5} {'total ms':>9} {'share':>6} "
                       f"{'GB/s':>7}  provenance"]
        for t in rows:
            share = 100 * t.per_call_s / self.call_s if self.call_s else 0.0
            lines.append(f"{t.name:<{name_w}}  {t.kind:<6} {t.calls:>5} {t.total_s * 1e3:>9.3f} {share:>5.1f}% "
                         f"{t.gb_per_s:>7.1f}  {t.provenance}")
        share = 100 * self.overhead_s / self.call_s if self.call_s else 0.0
        lines.append(f"{'(overhead)':<{name_w}}  {'':<6} {self.iters:>5} {self.overhead_s * self.iters * 1e3:>9.3f} "
                     f"{share:>5.1f}%")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write the timed calls (one ``X`` event per launch, microseconds) as Chrome trace
        JSON, for chrome://tracing or https://ui.perfetto.dev; returns the path."""
        events = []
        for call, call_start in enumerate(self.call_starts_s):
            for t in self.launches:
                if call < len(t.starts_s):
                    events.append({"name": t.name, "cat": t.kind, "ph": "X", "pid": 0, "tid": 0,
                                   "ts": round((call_start + t.starts_s[call]) * 1e6, 3),
                                   "dur": round(t.durations_s[call] * 1e6, 3),
                                   "args": {"node": t.node, "provenance": t.provenance, "bytes": t.bytes,
                                            "call": call}})
        events.sort(key=lambda e: (e["ts"], e["name"]))
        trace = {"traceEvents": events, "displayTimeUnit": "ms",
                 "otherData": {"fxwrap": f"{self.kind} program on target {self.target}"}}
        path = Path(path)
        path.write_text(json.dumps(trace, indent=1))
        return path


class _TimedInterpreter(torch.fx.Interpreter):
    """Runs a program's GraphModule, timing each launch (``launch_kind`` not None)."""

    def __init__(self, gm: torch.fx.GraphModule, device: DeviceInterface, named_by: torch.fx.GraphModule):
        super().__init__(gm)
        self.device = device
        self.evented = device.timing_event() is not None  # else the host clock
        self.rows: dict[torch.fx.Node, LaunchTiming] = {}
        # the runner may be a copy with other call targets (``runtime.direct``): launches are
        # named after the program's own GraphModule (same node names), ``aten.mm.out`` not ``torch.mm``
        original = {node.name: node for node in named_by.graph.nodes}
        for node in gm.graph.nodes:
            kind = launch_kind(node)
            if kind is not None:
                named = original.get(node.name, node)
                self.rows[node] = LaunchTiming(_launch_name(named), kind, node.name, provenance(named))
        self.marks: list = []  # (node, start, end) of the current call
        self.first = None  # the first timed call's start (a clock value or a CUDA event)
        self.call_starts: list[float] = []  # each timed call's start, from the first's

    def run_node(self, n):
        row = self.rows.get(n)
        if row is None:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        start = self._mark()
        result = n.target(*args, **kwargs)
        end = self._mark()
        row.bytes = _bytes_moved(args, kwargs, result)
        self.marks.append((n, start, end))
        return result

    def _mark(self):
        """Now: a recorded device event (``DeviceInterface.timing_event``) or the host clock."""
        if not self.evented:
            return time.perf_counter()
        event = self.device.timing_event()
        event.record()
        return event

    def _seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.evented else end - start

    def timed_call(self, graph_inputs) -> None:
        self.marks = []
        origin = self._mark()
        self.run(*graph_inputs)
        self.device.synchronize()
        if self.first is None:
            self.first = origin
        self.call_starts.append(self._seconds(self.first, origin))
        for node, start, end in self.marks:
            row = self.rows[node]
            offset, duration = self._seconds(origin, start), self._seconds(start, end)
            row.calls += 1
            row.total_s += duration
            row.starts_s.append(offset)
            row.durations_s.append(duration)


def _graph_inputs(program: Program, args: Sequence) -> list:
    if program.arguments is not None:
        return list(program.arguments(tuple(args)))
    return list(args)


def compiled_options(compiled: Callable) -> dict | None:
    """The fxwrap options (``"target"`` among them) that ``compiled`` -- a callable from
    ``torch.compile(fn, backend="fxwrap", options=...)`` or ``fxwrap.compile(fn, target)``
    -- was compiled with; None for one that is not compiled with fxwrap.

        >>> m = torch.nn.Linear(2, 2)
        >>> compiled_options(torch.compile(m, backend="fxwrap", options={"target": "reference"}))
        {'target': 'reference'}

    Read off the chain of backends dynamo wraps around the one given to torch.compile
    (each holds the next as ``_torchdynamo_orig_backend``; torch.compile's wrapper holds
    the backend as ``compiler_fn`` with ``kwargs`` options and mode)."""
    context = getattr(compiled, "dynamo_ctx", None)  # an OptimizedModule
    if context is None:  # a compiled function: its context is in the wrapper's closure
        cells = getattr(compiled, "__closure__", None) or ()
        context = next((c.cell_contents for c in cells
                        if isinstance(c.cell_contents, torch._dynamo.eval_frame.OptimizeContext)), None)
    backend, seen = getattr(context, "callback", None), set()
    while backend is not None and id(backend) not in seen:
        seen.add(id(backend))
        if isinstance(backend, Backend):
            options = backend.options
            return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
                    if f.name != "on_program"}
        compiler_fn = getattr(backend, "compiler_fn", None)
        if compiler_fn is dynamo_backend or compiler_fn is registration.dynamo_backend:  # backend="fxwrap"
            kwargs = getattr(backend, "kwargs", None) or {}
            options = dict(kwargs.get("options") or {})
            if kwargs.get("mode") not in (None, "default"):
                options.setdefault("mode", kwargs["mode"])
            return options
        backend = compiler_fn if isinstance(compiler_fn, Backend) else \
            getattr(backend, "_torchdynamo_orig_backend", None)
    return None


def profile(program_or_fn: Program | Callable, *args, warmup: int = 3, iters: int = 10,
            target: str | None = None, options: dict | None = None) -> ProfileReport:
    """Time every kernel and extern launch of a program; see the module docstring for what
    to pass.  ``warmup`` untimed calls first, then ``iters`` timed ones of each kind,
    interleaved: the program as usual (the call time), then under the timing interpreter."""
    if isinstance(program_or_fn, Program):
        program = program_or_fn
    elif hasattr(program_or_fn, "forward") and hasattr(program_or_fn, "backward") and \
            isinstance(getattr(program_or_fn, "forward"), Program):
        raise TypeError("fxwrap.profile times one program: pass programs.forward or programs.backward "
                        "(the backward with its graph inputs, in program.inputs order)")
    elif callable(program_or_fn):
        fn = getattr(program_or_fn, "_torchdynamo_orig_callable", None) or \
            getattr(program_or_fn, "_orig_mod", None) or program_or_fn
        compiled = dict(compiled_options(program_or_fn) or {})  # what torch.compile was given
        compiled.update(options or {})
        target = target if target is not None else compiled.pop("target", None)
        compiled.pop("target", None)
        program = lower(fn, *args, target=target, options=compiled)
    else:
        raise TypeError(f"fxwrap.profile needs a Program (fxwrap.lower) or a callable, got "
                        f"{type(program_or_fn).__name__}")
    if iters < 1 or warmup < 0:
        raise ValueError(f"fxwrap.profile: iters={iters} must be >= 1 and warmup={warmup} >= 0")
    graph_inputs = _graph_inputs(program, args)
    device = program.target.device
    runner_gm = program.runner if isinstance(program.runner, torch.fx.GraphModule) else program.graph_module
    interpreter = _TimedInterpreter(runner_gm, device, program.graph_module)
    sync = device.synchronize
    with torch.no_grad():
        for _ in range(warmup):
            program(*graph_inputs)
            interpreter.run(*graph_inputs)
        sync()
        calls = []
        for _ in range(iters):  # interleaved, so that both see the same machine load
            started = time.perf_counter()
            program(*graph_inputs)
            sync()
            calls.append(time.perf_counter() - started)
            interpreter.timed_call(graph_inputs)
        call_s = statistics.median(calls)  # as each launch's per-call time: medians
    launches = list(interpreter.rows.values())
    return ProfileReport(launches, call_s, iters, program.target.device_type, program.kind, program.target.name,
                         interpreter.call_starts, calls)
