"""The user-facing entry points: ``compile``, ``lower``, ``Backend`` (``Program`` is in ``fxwrap.programs.program``).

    model = torch.compile(model, backend="fxwrap")           # registered by entry point
    model = fxwrap.compile(model, target="cpu")               # same, explicit target

    >>> prog = fxwrap.lower(lambda x: x.sin() + 1, torch.randn(8))
    >>> print(prog.code())
    def forward(arg0):
        buf0 = empty_strided((8,), (1,), dtype=torch.float32, device='cpu')
        # kernel fxwrap_pointwise_0 (cpu): arg0:input, buf0:output
        # sin, add (... in <lambda>)
        fxwrap_pointwise_0(arg0, buf0)
        return (buf0,)
"""
from __future__ import annotations

import copy
import logging
import threading
import types
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch._dynamo.source import LocalSource, TensorPropertySource
from torch.utils import _pytree as pytree

from fxwrap.core import logs
from fxwrap.core.capture import report_output_strides
from fxwrap.core.passes import AtenGraph
from fxwrap.core.pipeline import Compilation
from fxwrap.plugins.manager import get_plugin_manager
from fxwrap.plugins.session import MODES, CompileOptions, CompileSession
from fxwrap.programs.arguments import ArgumentMap, OutputMap
from fxwrap.programs.assembly import ProgramAssembly
from fxwrap.programs.graph_cache import GraphCompile
from fxwrap.programs.precompile import (CompiledFunction, PrecompiledGraph, PrecompileError, calling,
                                        has_aot_precompile, module_references, plain_aot_autograd, precompiling)
from fxwrap.programs.program import Program, TrainingPrograms
from fxwrap.runtime.boxed import ListCall
from fxwrap.targets.base import Target

log = logging.getLogger("fxwrap")

OPTION_NAMES = frozenset(CompileOptions.names())


def compile_session(target: Target, options: CompileOptions | dict | None = None) -> CompileSession:
    """The process-wide plugin manager's session for ``target``, with ``options``."""
    if not isinstance(options, CompileOptions):
        options = CompileOptions.from_dict(options)
    return get_plugin_manager().session(target).configured(options)


def compile_aten_graph(gm: torch.fx.GraphModule, target: Target | CompileSession, kind: str = "inference",
                       options: CompileOptions | dict | None = None,
                       example_inputs: Sequence[Any] | None = None) -> Program:
    """ATen graph -> ``Program``: the session's pipeline (``session.pipeline``,
    ``fxwrap.core.pipeline``) run on it, from its ATen-graph passes through the program
    cache, the lowerer, the renderer, the Wrapper-IR passes and the GraphModule to the
    ``Program`` (``fxwrap.programs.assembly``).

    ``target``: a ``Target`` (compiled with the process-wide plugin manager's session
    for it, and ``options``) or a ``CompileSession`` (with its own options).  With the
    whole-program cache on (``options.cache``), a program saved by an earlier process
    for the same graph (after the ATen passes), options, target, pipeline and versions
    is loaded instead.  ``example_inputs``: AOTAutograd's example inputs; a backward graph
    is compiled for their strides (those the compiled forward returns its saved
    activations in)."""
    logs.configure()
    session = target if isinstance(target, CompileSession) else compile_session(target, options)
    graph = AtenGraph.of(gm, kind, session, example_inputs)
    label = f"{kind} program"
    compilation = Compilation(graph, logs.PhaseTimer(label), label, ProgramAssembly(graph))
    return session.pipeline.run(compilation).program


def _tensor_leaves(example_inputs: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors of ``example_inputs``, nested ones included: a compiled-autograd graph's
    example inputs are one list of tensors (``[[grad, saved, ...]]``), not tensors."""
    return [t for t in pytree.tree_leaves(list(example_inputs)) if isinstance(t, torch.Tensor)]


def check_input_devices(target: Target, example_inputs: Sequence[Any]) -> None:
    """Raise ``ValueError`` when a tensor input lives on another device type than ``target``
    runs on (``target="cuda"`` given CPU tensors would compile, then fail at run time;
    ``target="mps"`` would compile a CPU program labelled mps).  A 0-d CPU tensor is
    allowed, as eager allows it next to tensors of any device (a scalar).  Tensors inside a
    list (a compiled-autograd graph's one list input) are not checked: such a graph mixes
    devices legitimately (CPU bookkeeping tensors beside CUDA gradients), and only its device
    tensors reach kernels (``_device_type_of`` picks the target from them)."""
    for index, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor) or value.device.type == target.device_type:
            continue
        if value.device.type == "cpu" and value.dim() == 0:
            continue
        raise ValueError(f"fxwrap: input {index} (size {tuple(value.shape)}) is on device {value.device}, "
                         f"but target {target.name!r} runs on device type {target.device_type!r}; move "
                         f"the inputs with .to({target.device_type!r}), or compile for a target of device "
                         f"type {value.device.type!r} (or leave the target out: the inputs' device picks it)")


def _device_type_of(example_inputs: Sequence[Any], gm: torch.fx.GraphModule | None = None) -> str:
    """The device type a graph computes on: its first tensor input's (nested inputs included)
    that is not on the CPU; with none, the first non-CPU tensor value the graph makes
    (``torch.ones(3, device="cuda")`` in a graph of CPU scalars); else ``"cpu"``.  Inputs alone
    were not enough: a compiled-autograd backward's inputs are one list, so its CUDA graph
    compiled for the CPU target, and a C++ kernel read CUDA memory (a segfault)."""
    for tensor in _tensor_leaves(example_inputs):
        if tensor.device.type != "cpu":
            return tensor.device.type
    for node in gm.graph.nodes if gm is not None else ():
        value = node.meta.get("example_value", node.meta.get("val"))
        for leaf in pytree.tree_leaves(value):
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "cpu":
                return leaf.device.type
    return "cpu"


def resolve_target(target: str | Target | None, example_inputs: Sequence[Any] = (),
                   gm: torch.fx.GraphModule | None = None) -> Target:
    """A Target by name, as given, or the default one for the device the graph computes on."""
    if isinstance(target, Target):
        return target
    manager = get_plugin_manager()
    if target is not None:
        return manager.target(target)
    return manager.target_for_device(_device_type_of(example_inputs, gm))


class Backend:
    """A ``torch.compile`` backend: ``torch.compile(fn, backend=Backend(target="cpu"))``.

    Options: ``target`` (name or Target; default: the inputs' device), ``reuse``
    (storage reuse in the memory plan, default True), ``decompositions``
    (``"core"`` (default) or ``"none"``), ``kernels`` (generate kernels where the
    target can, default True; False: every op an extern), ``on_program`` (a callable receiving every
    compiled ``Program``), ``execute`` (run the target's kernels another way: the target
    named ``f"{target}_{execute}"``, e.g. ``{"target": "mps", "execute": "shim"}`` runs the
    Metal kernels on CPU tensors through the C++ shim), ``mode`` (``"default"``, or
    ``"cudagraphs"``: each program recorded by the target's device and replayed (cuda: a
    CUDA graph; cpu: a launch list), see ``fxwrap.runtime.graph_replay``; an error where the
    device declares no graph capture; ``torch.compile(mode="reduce-overhead")`` means the
    same but runs plainly where the device cannot record; ``"max-autotune"``: more candidate configs per kernel, timed by the
    Triton emitter, plus CUDA graphs on CUDA targets; ``"max-autotune-no-cudagraphs"``:
    the configs alone; the C++ and Metal emitters have no tunable choices, so there
    max-autotune changes nothing).
    """

    def __init__(self, target: str | Target | None = None, options: dict | None = None):
        logs.configure()  # an unknown FXWRAP_LOG stage fails here, before dynamo traces anything
        self.options = CompileOptions.from_dict(options, target=target)  # checked now, not at compile
        self.example_inputs: list | None = None  # lower() sets [] to keep dynamo's example inputs
        self.input_names: list[str | None] = []  # lower(): the function local each input came from
        self.input_sizes: list[tuple[str, int | None] | None] = []  # lower(): (local, dim; -1 - dim: a stride; None: offset)
        self.graph_outputs: dict[str, Any] = {}  # lower(): each program's outputs of its last run

    @property
    def target(self) -> str | Target | None:
        return self.options.target

    def resolved_target(self, example_inputs: Sequence[Any], gm: torch.fx.GraphModule | None = None) -> Target:
        """The target that compiles for ``example_inputs`` (the option's, or the inputs'
        device's; with ``execute``, its ``f"{target}_{execute}"`` twin).  Given a target or
        an ``execute`` twin, a tensor input on another device type is a ``ValueError``
        (``check_input_devices``).  Picked from the inputs, a graph may mix devices as eager
        code may (a CPU bookkeeping tensor beside CUDA gradients in a compiled-autograd graph,
        seen in the nccl DDP test): its kernels take one device's buffers only (the builder
        leaves an op over another device's values to its ATen kernel)."""
        target = resolve_target(self.options.target, example_inputs, gm)
        if self.options.execute:
            target = resolve_target(f"{target.name}_{self.options.execute}")
        if self.options.target is not None or self.options.execute:
            check_input_devices(target, example_inputs)
        return target

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        if not precompiling():
            return self._compile(gm, example_inputs)[0]
        # torch's AOT precompile (fxwrap.programs.precompile): a result it can serialize
        with plain_aot_autograd():
            runner, warm, options = self._compile(gm, example_inputs)
        if warm is None:  # the precompiled form is the warm-start cache's entry
            session = get_plugin_manager().session(self.resolved_target(example_inputs, gm)).configured(options)
            raise PrecompileError(f"fxwrap cannot precompile this graph: {GraphCompile.unstorable(gm, session)}. "
                                  "torch.compile(model, backend='fxwrap') compiles it")
        return PrecompiledGraph.of(warm, runner, options)

    def _compile(self, gm: torch.fx.GraphModule, example_inputs):
        """(the runner of ``gm``, its warm-start cache record or None, the options)."""
        lowering = self.example_inputs is not None
        if lowering:
            self.example_inputs = list(example_inputs)
            placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
            self.input_names = [_local_name(n) for n in placeholders]
            self.input_sizes = [_size_of(n) for n in placeholders]
        options = self.options
        target = self.resolved_target(example_inputs, gm)
        if options.cuda_graphs_required and target.device.graph_capture() is None:
            raise ValueError(f"fxwrap mode {options.mode!r} needs a target whose device records and replays "
                             f"programs (DeviceInterface.graph_capture()); target {target.name!r} (device type "
                             f"{target.device_type!r}) has none: drop the mode or compile for such a device (cuda)")
        session = get_plugin_manager().session(target).configured(options)
        # the warm-start cache (fxwrap/programs/graph_cache.py): a hit skips AOTAutograd and lowering
        warm = None if lowering else GraphCompile.start(gm, example_inputs, session)
        if warm is not None and (runner := warm.load(options.on_program)) is not None:
            return runner, warm, options
        session.new_emitter().prepare()  # e.g. compiler processes started while AOTAutograd traces

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

        runner = session.pipeline.capture(compile_graph, session)(gm, example_inputs)
        return runner, warm, options


def _local_name(placeholder: torch.fx.Node) -> str | None:
    """The function local a dynamo graph input was read from (``x`` for ``L['x']``)."""
    grapharg = placeholder.meta.get("grapharg")
    return getattr(getattr(grapharg, "source", None), "local_name", None)


def _size_of(placeholder: torch.fx.Node) -> tuple[str, int | None] | None:
    """``("x", 0)`` for a dynamo size input read as ``L['x'].size()[0]``, ``("x", -1 - d)`` for
    one read as ``L['x'].stride()[d]``, ``("x", None)`` for ``L['x'].storage_offset()``, else None."""
    source = getattr(placeholder.meta.get("grapharg"), "source", None)
    if not isinstance(source, TensorPropertySource) or not isinstance(source.base, LocalSource):
        return None
    local, prop = source.base.local_name, source.prop.name  # torch._dynamo.source.TensorProperty
    if prop == "SIZE":
        return local, source.idx
    if prop == "STRIDE":
        return local, -1 - source.idx
    return (local, None) if prop == "STORAGE_OFFSET" else None


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


def aot_compile(fn, example_inputs: Sequence[Any], kwargs: dict | None = None, *,
                target: str | Target | None = None, options: dict | None = None,
                dynamic: bool | None = None) -> CompiledFunction:
    """Trace ``fn`` (a function, or an ``nn.Module``: its ``forward``) for ``example_inputs``
    with dynamo, as one graph (``fullgraph``), and compile it with fxwrap now, through torch's
    AOT precompile (``fxwrap.programs.precompile``).  The result runs it (training too: its outputs
    carry the compiled backward) and ``.save(path)``s it for ``load_compiled``, which runs
    it in another process with no dynamo trace, no AOTAutograd and no lowering::

        compiled = fxwrap.aot_compile(model, (x,)); compiled.save("model.fxaot")
        loaded = fxwrap.load_compiled("model.fxaot", model); loaded(x)

    Raises ``PrecompileError`` for a graph the warm-start cache cannot store (see
    docs/programs.md), and torch's error for a graph break."""
    module = fn if isinstance(fn, torch.nn.Module) else None
    traced = calling(module) if module is not None else fn
    compiled = torch.compile(traced, backend=Backend(target, options), fullgraph=True, dynamic=dynamic)
    if not has_aot_precompile():
        raise PrecompileError(f"torch {torch.__version__} has no AOT precompile of a whole graph (the "
                              "function torch.compile returns has no .aot_compile): fxwrap.aot_compile needs "
                              "a torch that has it; fxwrap's warm-start cache (on by default) still skips "
                              "AOTAutograd and lowering on a second run")
    return CompiledFunction(compiled.aot_compile((tuple(example_inputs), dict(kwargs or {}))), module)


def load_compiled(path, module: torch.nn.Module | None = None) -> CompiledFunction:
    """The function ``aot_compile(...).save(path)`` wrote, ready to run with no dynamo trace,
    no AOTAutograd and no lowering.  ``module``: the module it was compiled from (its
    parameters and buffers are read at each call, where dynamo's saved guards check them).
    Raises ``CacheBundleError`` where the file was made with other versions, on another host
    CPU or for a device this machine lacks."""
    with open(path, "rb") as file:
        function = torch.compiler.load_compiled_function(file, external_data=module_references(module))
    return CompiledFunction(function, module)


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
    backend.resolved_target(example_inputs)  # a tensor on the wrong device: a clear error now, not in dynamo
    backend.example_inputs = []
    private = _with_own_code(fn)
    compiled = torch.compile(fn if private is None else private, backend=backend, dynamic=dynamic, fullgraph=True)
    if private is None:  # dynamo's cache of fn's code object is shared: one lowering at a time mutates it
        _SHARED_CODE_LOWERING.acquire()
    try:
        lowered, returned = _run_lowering(compiled, example_inputs, training, programs)
        first = lowered.forward if training else lowered
        first.arguments = ArgumentMap.build(first.inputs, backend.example_inputs, example_inputs, fn,
                                            backend.input_names, backend.input_sizes)
        if first.arguments is not None:
            if first.input_guard is not None:
                first.input_guard.name_inputs(first.arguments.labels(first.inputs))
            first.outputs = OutputMap.build(returned, backend.graph_outputs.get(first.kind, ()),
                                            example_inputs)
        return lowered
    finally:
        # Each lower() is a fresh compile.  It traces a copy of fn's code object (see
        # _with_own_code) and drops the copy's cache entries: nothing piles up against the
        # recompile limit, nothing keeps the programs alive, and no other thread's entries
        # are touched.  A callable fxwrap cannot copy has fn's own entries dropped, under a lock.
        if private is None:
            try:
                torch._dynamo.eval_frame.remove_from_cache(fn)
            finally:
                _SHARED_CODE_LOWERING.release()
        else:  # the copy's entries: no other thread runs its code object
            torch._dynamo.eval_frame.remove_from_cache(private)
        # dynamo keeps every backend it was given (eval_frame.cached_backends, until
        # torch._dynamo.reset()): let it keep nothing of this lowering -- the programs
        # (through on_program), their kernels, the example inputs and outputs
        backend.options = replace(backend.options, on_program=None)
        backend.example_inputs, backend.graph_outputs, backend.input_names = None, {}, []
        backend.input_sizes = []
        programs.clear()


# Serializes the lowerings of callables whose code object fxwrap cannot copy (see lower()).
_SHARED_CODE_LOWERING = threading.Lock()


def _own_function(func: types.FunctionType) -> types.FunctionType:
    """``func`` with a code object of its own (equal to ``func``'s, not the same object)."""
    copied = types.FunctionType(func.__code__.replace(), func.__globals__, func.__name__,
                                func.__defaults__, func.__closure__)
    copied.__kwdefaults__ = func.__kwdefaults__
    copied.__qualname__, copied.__module__ = func.__qualname__, func.__module__
    copied.__dict__.update(func.__dict__)
    return copied


def _with_own_code(fn):
    """``fn`` to trace with a code object no one else runs: a function's copy, or a shallow
    copy of a module (parameters, buffers, submodules and hooks shared) whose ``forward`` is
    such a copy; None for a callable of another kind.

    dynamo caches compiled code on the code object, and every instance of a module class (or
    every closure of one ``def``) shares it.  ``lower()`` used to drop fn's entries after each
    lowering (``remove_from_cache``), which freed them under another thread running or
    compiling the same code: 4 threads lowering instances of one class segfaulted."""
    if isinstance(fn, types.FunctionType):
        return _own_function(fn)
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return types.MethodType(_own_function(fn.__func__), fn.__self__)
    if isinstance(fn, torch.nn.Module) and not isinstance(fn, torch._dynamo.eval_frame.OptimizedModule):
        forward = fn.forward
        if isinstance(forward, types.MethodType) and isinstance(forward.__func__, types.FunctionType):
            module = copy.copy(fn)
            module.forward = types.MethodType(_own_function(forward.__func__), module)
            return module
    return None


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
