"""The user-facing entry points: ``compile``, ``lower``, ``Backend``, ``Program``.

    >>> model = torch.compile(model, backend="fxwrap")           # registered by entry point
    >>> model = fxwrap.compile(model, target="cpu")               # same, explicit target
    >>> prog = fxwrap.lower(lambda x: x.sin() + 1, torch.randn(8))
    >>> print(prog.code())
    def forward(arg0):
        # sin: aten.sin.default
        buf0 = empty_strided((8,), (1,), dtype=torch.float32, device='cpu')
        aten.sin.out(arg0, out=buf0)
        ...
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fxwrap.arguments import ArgumentMap, OutputMap
from fxwrap.core import logs
from fxwrap.core.capture import capture_backend, report_output_strides, saved_activation_outputs
from fxwrap.core import patterns
from fxwrap.core.layout import channels_last_convolutions, follow_input_layouts, has_channels_last_convolution
from fxwrap.core.matmul_padding import pad_matmul_columns
from fxwrap.core.memory import MemoryPlan, describe_plan, plan_memory
from fxwrap.dump import ProgramDump
from fxwrap.graph_cache import GraphCompile
from fxwrap.plugins.manager import get_plugin_manager
from fxwrap.plugins.session import MODES, CompileOptions, CompileSession
from fxwrap.program_cache import ProgramCache, cache_enabled, program_key
from fxwrap.runtime.boxed import ListCall
from fxwrap.runtime.cudagraphs import CudaGraphRunner
from fxwrap.targets.base import Target
from fxwrap.wrapper_ir.build import build_lines
from fxwrap.wrapper_ir.build_kernels import KernelBuilder
from fxwrap.wrapper_ir.cudagraph_safety import graph_safety
from fxwrap.wrapper_ir.fx import annotated_code, input_guard_of, to_graph_module
from fxwrap.ir.lines import Buffer, Line, Return, SizeInput
from fxwrap.wrapper_ir.printer import program_source

log = logging.getLogger("fxwrap")

OPTION_NAMES = frozenset(CompileOptions.names())


@dataclass
class Program:
    """One compiled graph (an inference, forward or backward graph).

    ``lines`` is the Wrapper IR, ``graph_module`` its FX form, ``code()`` the
    printed program, ``peak_bytes`` the memory plan's peak (at ``hints``: the
    value of every size symbol when the graph was compiled), and calling the
    Program runs what the target's wrapper made of the graph.
    """

    kind: str
    target: Target
    inputs: list[Buffer | SizeInput]
    lines: list[Line]
    graph_module: torch.fx.GraphModule
    memory: MemoryPlan
    runner: Callable = field(repr=False)
    constants: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    hints: dict = field(default_factory=dict, repr=False)
    arguments: ArgumentMap | None = field(default=None, repr=False)
    outputs: OutputMap | None = field(default=None, repr=False)

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes

    @property
    def input_guard(self):
        """The ``fxwrap.runtime.guards.InputGuard`` the GraphModule checks its inputs with."""
        return input_guard_of(self.graph_module)

    def code(self) -> str:
        return program_source(self.inputs, self.lines)

    @property
    def output_strides(self) -> list[tuple[int, ...] | None]:
        """The strides of each output the program returns; None for a non-tensor output
        or one whose strides depend on size symbols."""
        returned = next((line for line in reversed(self.lines) if isinstance(line, Return)), None)
        strides = []
        for value in (returned.values if returned is not None else ()):
            stride = value.stride if isinstance(value, Buffer) else None
            static = stride is not None and all(getattr(s, "is_Integer", isinstance(s, int)) for s in stride)
            strides.append(tuple(int(s) for s in stride) if static else None)
        return strides

    def __call__(self, *graph_inputs):
        """Run with the graph's inputs, in ``inputs`` order (dynamo's, not the function's)."""
        return self.runner(*graph_inputs)

    def save(self, path: str | os.PathLike) -> None:
        """Write the program to ``path``: one file that ``fxwrap.load(path)`` runs without
        the compiler (``fxwrap.artifacts``)."""
        from fxwrap.artifacts import save
        save(self, path)

    def __reduce__(self):
        # pickle stores what save() writes; pickle.loads gives a LoadedProgram
        from fxwrap.artifacts import dumps, loads
        return (loads, (dumps(self),))

    def __copy__(self) -> "Program":
        return replace(self)

    def run(self, *args):
        """Run with the lowered function's own positional arguments (``lower`` programs):
        ``fxwrap.lower(f, x, w).run(x2, w2)``; parameters and sizes are filled in, and the
        result has the function's own structure (a tensor, a tuple, a dict ...).

        Raises ``TypeError`` for a missing or extra argument and
        ``fxwrap.InputMismatchError`` for an input the program was not compiled for (see
        ``fxwrap.runtime.guards``) or a Python scalar other than one baked in.
        """
        if self.arguments is None:
            raise TypeError(f"this {self.kind} program has no argument map (only inference and forward "
                            "programs made by fxwrap.lower have one); call it with its graph inputs, "
                            "in program.inputs order")
        with torch.no_grad():  # a compiled graph: autograd is AOTAutograd's business, not the caller's
            outputs = self.runner(*self.arguments(args))
        return outputs if self.outputs is None else self.outputs(outputs, args)


def compile_session(target: Target, options: CompileOptions | dict | None = None) -> CompileSession:
    """The process-wide plugin manager's session for ``target``, with ``options``."""
    if not isinstance(options, CompileOptions):
        options = CompileOptions.from_dict(options)
    return get_plugin_manager().session(target).configured(options)


def compile_aten_graph(gm: torch.fx.GraphModule, target: Target | CompileSession, kind: str = "inference",
                       options: CompileOptions | dict | None = None,
                       example_inputs: Sequence[Any] | None = None) -> Program:
    """ATen graph -> Wrapper IR -> memory plan -> GraphModule -> target's runner.

    ``target``: a ``Target`` (compiled with the process-wide plugin manager's session
    for it, and ``options``) or a ``CompileSession`` (with its own options).  With the
    whole-program cache on (``options.cache``), a program saved by an earlier process
    for the same graph, options, target and versions is loaded instead.
    ``example_inputs``: AOTAutograd's example inputs; a backward graph is compiled for
    their strides (those the compiled forward returns its saved activations in)."""
    logs.configure()
    session = target if isinstance(target, CompileSession) else compile_session(target, options)
    target, options = session.target, session.options
    timer = logs.PhaseTimer(f"{kind} program")
    channels_last = session.capabilities.get("convolution_layout") == "channels_last"
    saved_outputs = saved_activation_outputs(gm) if kind == "forward" else None
    if kind == "backward" and example_inputs is not None:
        with timer.phase("layout"):
            # the forward's saved activations come channels-last: so do its convolution backwards
            follow_input_layouts(gm, example_inputs, channels_last and _restrided_channels_last(gm, example_inputs))
    cache = key = None
    if cache_enabled(options):
        # which forward outputs keep the channels-last layout is no part of the graph's text
        key_kind = kind if saved_outputs is None else f"{kind} saving {saved_outputs.start}:{saved_outputs.stop}"
        cache, key = ProgramCache(), program_key(gm, session, key_kind)
        program = cache.load(key, session)
        if program is not None:
            return program
    dump = ProgramDump.start(options.debug_dir, gm, kind)  # None unless a debug dump was asked for
    if channels_last and kind in ("inference", "forward") and _takes_layout_pass(gm, kind, saved_outputs, session):
        with timer.phase("layout"):
            channels_last_convolutions(gm, saved_outputs=saved_outputs or ())
    alignment = session.capabilities.get("matmul_alignment_bytes")
    if alignment and kind in ("inference", "forward") and session.generates_kernels and options.kernels:
        with timer.phase("layout"):
            pad_matmul_columns(gm, alignment)
    if session.generates_kernels and options.kernels and options.templates != "off":
        with timer.phase("patterns"):
            rewrite_patterns(gm, session)
    if session.generates_kernels and options.kernels:
        built = KernelBuilder(gm, session, timer=timer, label=f"{kind} program").run()
    else:
        with timer.phase("lowering"):
            built = build_lines(gm, target.name, reuse=options.reuse, wrapper_passes=session.wrapper_passes)
    with timer.phase("memory plan"):
        plan = plan_memory(built.lines, built.hints, reuse=options.reuse)
    lines = plan.lines
    if logs.enabled("memory"):
        logs.logger("memory").debug("%s program: %s", kind, describe_plan(plan, built.hints))
    with timer.phase("wrapper passes"):
        for wrapper_pass in session.wrapper_passes:
            lines = list(wrapper_pass(lines))
    with timer.phase("fx"):
        graph_module = to_graph_module(built.inputs, lines, built.constants, built.fake_values)
    with timer.phase("wrapper"):
        program = finish_program(Program(kind, target, built.inputs, lines, graph_module, plan, None,
                                         built.constants, built.hints), session)
    if logs.enabled("wrapper"):
        logs.logger("wrapper").debug("%s program (target %s):\n%s", kind, target.name, program.code())
    if logs.enabled("fx"):
        logs.logger("fx").debug("%s GraphModule:\n%s", kind, annotated_code(graph_module))
    if logs.enabled("timing"):
        logs.logger("timing").debug("%s", timer.summary())
    if dump is not None:
        dump.write(program, built, timer)
    if cache is not None:
        cache.store(key, program)
    return program


def _takes_layout_pass(gm: torch.fx.GraphModule, kind: str, saved_outputs: range | None, session) -> bool:
    """Whether an inference or forward graph goes channels-last.  A forward graph only where
    AOTAutograd says which outputs are saved activations and every input is of static shape:
    the backward graph is compiled for the strides the forward reports, which must be numbers."""
    if kind == "inference":
        return True
    if not session.capabilities.get("training_convolution_layout") == "channels_last":
        log.info("channels-last layout not applied to the forward graph: the device does not ask for "
                 "it in training (capabilities()['training_convolution_layout'])")
        return False
    if not has_channels_last_convolution(gm):
        return False
    if saved_outputs is None:
        log.info("channels-last layout not applied to the forward graph: no AOTAutograd metadata "
                 "says which outputs are saved for the backward")
        return False
    dynamic = [n.name for n in gm.graph.nodes if n.op == "placeholder"
               and isinstance(v := n.meta.get("val"), (torch.Tensor, torch.SymInt))
               and not all(isinstance(s, int) for s in (v.shape if isinstance(v, torch.Tensor) else (v,)))]
    if dynamic:
        log.info("channels-last layout not applied to the forward graph: inputs %s have symbolic "
                 "sizes, and the backward graph needs the saved activations' strides as numbers",
                 ", ".join(dynamic))
        return False
    return True


def _restrided_channels_last(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether one of a backward graph's inputs comes channels-last where it was traced
    otherwise: the forward graph went channels-last, and the backward follows."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, given in zip(placeholders, example_inputs):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and isinstance(given, torch.Tensor) and given.dim() == 4 \
                and given.stride() != val.stride() and given.is_contiguous(memory_format=torch.channels_last):
            return True
    return False


def rewrite_patterns(gm: torch.fx.GraphModule, session: CompileSession) -> None:
    """The ATen-graph rewrites of ``fxwrap.core.patterns`` that the session's templates ask
    for: the dequantize-and-linear pattern becomes ``_weight_int8pack_mm`` where a template
    of the session computes that op and asks for the rewrite (``Template.pattern_refusal``),
    and only where ATen's own kernel of it (the template's fallback and rival) runs on the
    device and is exact for the shapes, or where the template promises to compute every
    call it asks for (``Template.pattern_guarantee``: then it is the op's only kernel)."""
    templates = [t for t in session.active_templates if patterns.INT8_MM in t.ops]
    if not templates:
        return

    def allow(x, w, scale) -> bool:
        aten_ok = patterns.aten_int8_mm_refusal(x.dtype, x.shape[-1], x.device.type, x.is_contiguous()) is None
        return any(t.pattern_refusal(patterns.INT8_MM, (x, w, scale)) is None and (aten_ok or t.pattern_guarantee)
                   for t in templates)

    patterns.int8_weight_only_linears(gm, allow)


def finish_program(program: Program, session: CompileSession) -> Program:
    """Give ``program`` (compiled, or loaded from the program cache) its runner: the
    target's wrapper of its GraphModule, recorded into CUDA graphs where the options
    ask for them (``cuda_graphs``: mode "cudagraphs", "reduce-overhead", "max-autotune")."""
    target, kind, graph_module = session.target, program.kind, program.graph_module
    runner = target.wrapper(target).compile_graph(graph_module)
    program.runner = runner
    if session.options.cuda_graphs and target.device_type == "cuda":
        program.runner = CudaGraphRunner(runner, graph_safety(program), f"{kind} program",
                                         synchronize=target.device.synchronize)
    return program


def _device_type_of(example_inputs: Sequence[Any]) -> str:
    types = [t.device.type for t in example_inputs if isinstance(t, torch.Tensor)]
    for device_type in types:
        if device_type != "cpu":
            return device_type
    return "cpu"


def resolve_target(target: str | Target | None, example_inputs: Sequence[Any] = ()) -> Target:
    """A Target by name, as given, or the default one for the inputs' device."""
    if isinstance(target, Target):
        return target
    manager = get_plugin_manager()
    if target is not None:
        return manager.target(target)
    return manager.target_for_device(_device_type_of(example_inputs))


class Backend:
    """A ``torch.compile`` backend: ``torch.compile(fn, backend=Backend(target="cpu"))``.

    Options: ``target`` (name or Target; default: the inputs' device), ``reuse``
    (storage reuse in the memory plan, default True), ``decompositions``
    (``"core"`` (default) or ``"none"``), ``kernels`` (generate kernels where the
    target can, default True; False: every op an extern), ``on_program`` (a callable receiving every
    compiled ``Program``), ``execute`` (run the target's kernels another way: the target
    named ``f"{target}_{execute}"``, e.g. ``{"target": "mps", "execute": "shim"}`` runs the
    Metal kernels on CPU tensors through the C++ shim), ``mode`` (``"default"``, or
    ``"cudagraphs"``: CUDA targets record each program into a CUDA graph and replay
    it, see ``fxwrap.runtime.cudagraphs``; ``torch.compile(mode="reduce-overhead")``
    means the same; ``"max-autotune"``: more candidate configs per kernel, timed by the
    Triton emitter, plus CUDA graphs on CUDA targets; ``"max-autotune-no-cudagraphs"``:
    the configs alone; the C++ and Metal emitters have no tunable choices, so there
    max-autotune changes nothing).
    """

    def __init__(self, target: str | Target | None = None, options: dict | None = None):
        logs.configure()  # an unknown FXWRAP_LOG stage fails here, before dynamo traces anything
        self.options = CompileOptions.from_dict(options, target=target)  # checked now, not at compile
        self.example_inputs: list | None = None  # lower() sets [] to keep dynamo's example inputs
        self.input_names: list[str | None] = []  # lower(): the function local each input came from
        self.graph_outputs: dict[str, Any] = {}  # lower(): each program's outputs of its last run

    @property
    def target(self) -> str | Target | None:
        return self.options.target

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        lowering = self.example_inputs is not None
        if lowering:
            self.example_inputs = list(example_inputs)
            self.input_names = [_local_name(n) for n in gm.graph.nodes if n.op == "placeholder"]
        options = self.options
        target = resolve_target(options.target, example_inputs)
        if options.execute:
            target = resolve_target(f"{target.name}_{options.execute}")
        if options.cuda_graphs_required and target.device_type != "cuda":
            raise ValueError(f"fxwrap mode {options.mode!r} needs a CUDA target, not target {target.name!r} "
                             f"(device type {target.device_type!r}); drop the mode or compile for cuda")
        session = get_plugin_manager().session(target).configured(options)
        # the warm-start cache (fxwrap/graph_cache.py): a hit skips AOTAutograd and lowering
        warm = None if lowering else GraphCompile.start(gm, example_inputs, session)
        if warm is not None and (runner := warm.load(options.on_program)) is not None:
            return runner

        def compile_graph(aten_gm, aten_inputs, kind):
            program = compile_aten_graph(aten_gm, session, kind, example_inputs=aten_inputs)
            if warm is not None:
                warm.compiled(kind, program)
            if kind == "forward":  # the backward graph is compiled for these (core/capture.py)
                report_output_strides(program.output_strides)
            if options.on_program is not None:
                options.on_program(program)
            if not lowering:
                if isinstance(program.runner, torch.fx.GraphModule):
                    return ListCall(program.runner)  # inputs freed at their last use
                return program.runner
            runner = program.runner

            def recording(*args):  # lower() matches the function's return value to these
                outputs = runner(*args)
                self.graph_outputs[kind] = outputs
                return outputs
            return recording

        return capture_backend(compile_graph, session.decompositions(), options.partition)(gm, example_inputs)


def _local_name(placeholder: torch.fx.Node) -> str | None:
    """The function local a dynamo graph input was read from (``x`` for ``L['x']``)."""
    grapharg = placeholder.meta.get("grapharg")
    return getattr(getattr(grapharg, "source", None), "local_name", None)


def dynamo_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None,
                   mode: str | None = None):
    """``torch.compile(model, backend="fxwrap", options={...})`` lands here."""
    options = dict(options or {})
    if mode is not None and mode not in MODES:
        raise ValueError(f"fxwrap has no mode {mode!r}; valid modes: {', '.join(map(repr, MODES))} "
                         "('reduce-overhead': CUDA graphs; 'max-autotune': more candidate configs per "
                         "kernel, and CUDA graphs on CUDA; 'max-autotune-no-cudagraphs': more configs only)")
    if mode not in (None, "default"):
        options.setdefault("mode", mode)
    return Backend(options=options)(gm, example_inputs)


def compile(model, target: str | Target | None = None, dynamic: bool | None = None,
            fullgraph: bool = False, options: dict | None = None):
    """``torch.compile`` with the fxwrap backend on ``target``."""
    return torch.compile(model, backend=Backend(target, options), dynamic=dynamic, fullgraph=fullgraph)


@dataclass
class TrainingPrograms:
    """``lower(..., training=True)``: the forward and backward programs."""

    forward: Program
    backward: Program

    def save(self, path: str | os.PathLike) -> None:
        """Both programs in one file; ``fxwrap.load(path)`` gives a ``LoadedTrainingPrograms``."""
        from fxwrap.artifacts import save
        save(self, path)

    def __reduce__(self):
        from fxwrap.artifacts import dumps, loads
        return (loads, (dumps(self),))


def lower(fn, *example_inputs, training: bool = False, dynamic: bool = False,
          target: str | Target | None = None, options: dict | None = None):
    """Compile ``fn`` for ``example_inputs`` and return its Program(s) without running later.

    ``training=False`` gives the inference Program; ``training=True`` runs one
    forward and backward (on the sum of the floating outputs) and returns both.
    """
    programs: list[Program] = []
    opts = dict(options or {})
    opts["on_program"] = programs.append
    backend = Backend(target, opts)
    backend.example_inputs = []
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True)
    try:
        lowered, returned = _run_lowering(compiled, example_inputs, training, programs)
        first = lowered.forward if training else lowered
        first.arguments = ArgumentMap.build(first.inputs, backend.example_inputs, example_inputs, fn,
                                            backend.input_names)
        if first.arguments is not None:
            if first.input_guard is not None:
                first.input_guard.name_inputs(first.arguments.labels(first.inputs))
            first.outputs = OutputMap.build(returned, backend.graph_outputs.get(first.kind, ()),
                                            example_inputs)
        return lowered
    finally:
        # Each lower() is a fresh compile: drop dynamo's cache entry for fn so repeated
        # lowerings never pile up against the recompile limit (nor hit an old entry).
        torch._dynamo.eval_frame.remove_from_cache(fn)
        # dynamo keeps every backend it was given (eval_frame.cached_backends, until
        # torch._dynamo.reset()): let it keep nothing of this lowering -- the programs
        # (through on_program), their kernels, the example inputs and outputs
        backend.options = replace(backend.options, on_program=None)
        backend.example_inputs, backend.graph_outputs, backend.input_names = None, {}, []
        programs.clear()


def _run_lowering(compiled, example_inputs, training: bool, programs: list):
    if not training:
        with torch.no_grad():
            out = compiled(*example_inputs)
        return _only(programs, "inference"), out
    out = compiled(*example_inputs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    loss = sum(o.float().sum() for o in outs
               if isinstance(o, torch.Tensor) and o.requires_grad)
    if not isinstance(loss, torch.Tensor):
        raise ValueError("lower(training=True): no output requires grad; give inputs with requires_grad=True")
    loss.backward()
    return TrainingPrograms(_only(programs, "forward"), _only(programs, "backward")), out


def _only(programs: list[Program], kind: str) -> Program:
    found = [p for p in programs if p.kind == kind]
    if len(found) != 1:
        raise RuntimeError(f"expected one {kind} program, dynamo produced {[p.kind for p in programs]} "
                           "(a graph break splits the function; lower() needs one graph)")
    return found[0]
