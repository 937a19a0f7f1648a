"""What one target compiles with: the compile session, built once per target by the
plugin manager, and the typed options a ``Backend`` accepts.

    >>> from fxwrap import get_plugin_manager
    >>> session = get_plugin_manager().session(get_plugin_manager().target("cpu"))
    >>> session.lowerings.lookup(aten.sin.default)      # fxwrap's rule, or a plugin's
    <function ...>
    >>> session.decompositions(CompileOptions())        # defaults + kernel + plugins'
    {<OpOverload(op='aten...', overload='...')>: <function ...>, ...}
    >>> session.configured(CompileOptions(reuse=False)).options.reuse
    False

A session holds what does not change from one graph to the next: the lowering
table (fxwrap's default rules, the target's own rules in ``fxwrap.core.lowering.REGISTRY``,
then every plugin's ``fxwrap_lowerings``, in load order, each overriding the ones
before), every plugin's decompositions for the target, the
device's capabilities and the dtypes kernels may use, and the pipeline (the stages,
``fxwrap.core.pipeline``, as every plugin's ``fxwrap_pipeline`` edits them for the options).
``configured(options)`` gives a session with other options that shares all of that.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from fxwrap.ir.capabilities import Capabilities, as_capabilities
from fxwrap.core.capture import default_decompositions, kernel_decompositions
from fxwrap.core.lowering import LoweringTable
from fxwrap.core.numerics import Numerics, numerics_for
from fxwrap.core.passes import LinesPass
from fxwrap.core.pipeline import Pipeline
from fxwrap.core.templates import TEMPLATE_MODES
from fxwrap.targets.base import KernelEmitter, Target

#: ``mode``: fxwrap's own ``"cudagraphs"`` and Inductor's names (``torch.compile(mode=...)``):
#: ``"reduce-overhead"`` is CUDA graphs; ``"max-autotune"`` a wider set of candidate configs per
#: kernel (the Triton emitter times them all) and CUDA graphs on CUDA targets;
#: ``"max-autotune-no-cudagraphs"`` the wider autotuning alone
MODES = ("default", "cudagraphs", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DECOMPOSITION_MODES = ("core", "none")
PARTITIONS = ("min_cut", "save_all")

# the dtypes fxwrap's loop IR and emitters can put in a generated kernel; a device's
# ``capabilities().dtypes`` and an emitter's ``supported_dtypes`` narrow it
KERNEL_DTYPES = frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})


def generates_kernels(target: Target) -> bool:
    """True when the target's emitter renders kernels (else every op is an extern)."""
    return target.emitter.render is not KernelEmitter.render


@dataclass(frozen=True)
class CompileOptions:
    """The options of ``fxwrap.Backend`` / ``torch.compile(..., options={...})``, checked.

    ``target`` (a name or ``Target``; None: the inputs' device), ``reuse`` (storage
    reuse in the memory plan), ``decompositions`` (``"core"`` or ``"none"``),
    ``kernels`` (generate kernels where the target can; False: every op an extern),
    ``execute`` (run the target's kernels another way: the target named
    ``f"{target}_{execute}"``), ``mode`` (one of ``MODES``: ``"default"``, ``"cudagraphs"``
    or Inductor's ``"reduce-overhead"``, ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``;
    see ``cuda_graphs`` and ``max_autotune``),
    ``partition`` (how a training graph is split into forward and backward: ``"min_cut"``,
    the default, AOTAutograd's min-cut rematerialization as Inductor uses it, saves the
    fewest bytes for the backward and recomputes cheap pointwise values there: on the H200
    it cut the bf16 training peak of the Llama-style decoder 1545 -> 990 MiB and of the
    GPT-style one 1054 -> 802 MiB, with less GPU time, BENCHMARKS.md; ``"save_all"``,
    AOTAutograd's default partition, saves every value the backward reads), ``on_program``
    (a callable receiving every compiled ``Program``), ``cache`` (the whole-program cache across
    processes, ``fxwrap.programs.program_cache``; also off with ``FXWRAP_PROGRAM_CACHE=0``), the debug modes
    (``fxwrap.plugins.debug_modes``, docs/debugging.md): ``check_nan`` (True: raise at the first
    kernel or extern that writes NaN or Inf; ``"nan"``: NaN only) and ``print_values`` (True:
    print a summary of every buffer a launch writes; a list of buffer, kernel or ATen op
    names: of those), ``debug_dir`` (write a debug dump of
    every program there, ``fxwrap.programs.dump``; default ``$FXWRAP_DEBUG_DIR``), ``templates``
    (GEMM templates with fused epilogues, ``fxwrap.core.templates``: ``"auto"`` uses a
    template where it is timed faster than the ATen call plus the epilogue kernel;
    ``"default"``, the default, does so with the templates marked ``in_default_mode`` (the
    CPU's), and with every template under a max-autotune mode; ``"always"`` wherever one
    applies; ``"off"`` never; default ``$FXWRAP_TEMPLATES`` or ``"default"``),
    ``cache_weight_layouts`` (inference programs that relay a parameter out for a convolution
    (channels-last) make the copy once and reuse it while the parameter's ``_version`` and
    ``data_ptr`` are unchanged, ``fxwrap.runtime.weight_layouts``; a write through ``p.data``
    is not seen, hence off by default, as Inductor's ``freezing``; not with CUDA graphs, whose
    replay would not ask the cache), ``arena`` (True, the default: a target whose runner can
    keep the storage of a program's temporaries for its next call does, the CPU's
    ``fxwrap.runtime.arena``: no page faulted in per call, that storage held between calls;
    False: every call allocates and frees its own)::

        >>> CompileOptions.from_dict({"reuse": False, "mode": "cudagraphs"})
        CompileOptions(target=None, reuse=False, decompositions='core', kernels=True, ...)
        >>> CompileOptions.from_dict({"resue": False})
        Traceback (most recent call last):
        TypeError: unknown fxwrap option(s) ['resue']; known: ['arena', ...
    """

    target: str | Target | None = None
    reuse: bool = True
    decompositions: str = "core"
    kernels: bool = True
    execute: str | None = None
    mode: str = "default"
    partition: str = "min_cut"
    cache: bool = True
    on_program: Callable | None = field(default=None, compare=False)
    check_nan: bool | str = False
    print_values: bool | tuple[str, ...] = False
    debug_dir: str | None = None
    templates: str = field(default_factory=lambda: os.environ.get("FXWRAP_TEMPLATES", "default"))
    cache_weight_layouts: bool = False
    arena: bool = True

    def __post_init__(self):
        if self.templates not in TEMPLATE_MODES:
            raise ValueError(f"fxwrap option templates={self.templates!r} is not one of {list(TEMPLATE_MODES)} "
                             "('auto': a template where it is timed faster than the ATen call; 'always': "
                             "wherever one applies; 'off': ATen calls only)")
        if self.check_nan not in (True, False, "nan"):
            raise ValueError(f"fxwrap option check_nan={self.check_nan!r} is not one of True, False, 'nan' "
                             "(NaN only, Inf allowed)")
        selection = self.print_values
        if isinstance(selection, str):
            selection = (selection,)
        if isinstance(selection, (list, tuple)):
            if not all(isinstance(name, str) for name in selection):
                raise TypeError(f"fxwrap option print_values={self.print_values!r}: give True or a list of "
                                "buffer, kernel or ATen op names (strings)")
            object.__setattr__(self, "print_values", tuple(selection))  # hashable: sessions are keyed by it
        elif selection not in (True, False):
            raise TypeError(f"fxwrap option print_values={self.print_values!r}: give True or a list of "
                            "buffer, kernel or ATen op names")
        if self.mode == "cudagraphs" and (self.check_nan or self.print_values):
            raise ValueError("fxwrap debug modes check_nan and print_values read values back to the CPU after "
                             "every launch, which a CUDA graph cannot replay: drop mode='cudagraphs' (or "
                             "torch.compile's mode='reduce-overhead') while debugging")
        if self.mode not in MODES:
            raise ValueError(f"fxwrap has no mode {self.mode!r}; valid modes: {', '.join(map(repr, MODES))}")
        if self.decompositions not in DECOMPOSITION_MODES:
            raise ValueError(f"fxwrap option decompositions={self.decompositions!r} is not one of "
                             f"{list(DECOMPOSITION_MODES)}")
        if self.partition not in PARTITIONS:
            raise ValueError(f"fxwrap option partition={self.partition!r} is not one of {list(PARTITIONS)}")
        if self.debug_dir is not None and not isinstance(self.debug_dir, (str, os.PathLike)):
            raise TypeError(f"fxwrap option debug_dir must be a folder path, got {self.debug_dir!r}")
        if self.on_program is not None and not callable(self.on_program):
            raise TypeError(f"fxwrap option on_program must be callable, got {self.on_program!r}")

    @property
    def cuda_graphs(self) -> bool:
        """Record each program (partition by partition) and replay it, on targets whose device
        declares graph capture (``DeviceInterface.graph_capture()``: CUDA graphs, the CPU's
        launch list): ``"cudagraphs"``, ``"reduce-overhead"``, ``"max-autotune"`` (on other
        targets the last two compile without graphs, as Inductor's do)."""
        return self.mode in ("cudagraphs", "reduce-overhead", "max-autotune")

    @property
    def cuda_graphs_required(self) -> bool:
        """fxwrap's own ``"cudagraphs"``: an error on a target whose device has no graph
        capture (``DeviceInterface.graph_capture()`` None).  Inductor's names
        (``"reduce-overhead"``, ``"max-autotune"``) compile on any target, captured where the
        device can, as Inductor does."""
        return self.mode == "cudagraphs"

    @property
    def max_autotune(self) -> bool:
        """Emitters try a wider set of candidate configs per kernel (``KernelEmitter.max_autotune``)."""
        return self.mode in ("max-autotune", "max-autotune-no-cudagraphs")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, options: dict[str, Any] | None = None, **defaults) -> "CompileOptions":
        """``options`` (a ``Backend``'s dict) as ``CompileOptions``; ``defaults`` fill what it lacks."""
        options = dict(options or {})
        unknown = set(options) - set(cls.names())
        if unknown:
            raise TypeError(f"unknown fxwrap option(s) {sorted(unknown)}; known: {sorted(cls.names())}")
        return cls(**{**defaults, **options})


@dataclass(frozen=True)
class PluginFacts:
    """What a compile session needs from the plugins, handed to it when it is built (the
    session never calls back into the plugin manager).

    ``kernel_loader``: what a ``Kernel`` built in the session loads its launcher with after
    unpickling; ``pipeline(options)``: the session's target's pipeline under other options
    (every plugin's ``fxwrap_pipeline`` edits); ``plugins``: ``(name, description)`` of every
    loaded plugin, in load order, and ``plugin_objects`` the registered plugin objects (the
    program cache keys on both)."""

    kernel_loader: Callable
    pipeline: Callable[[CompileOptions], Pipeline]
    plugins: tuple = ()
    plugin_objects: tuple = ()


class CompileSession:
    """Everything fxwrap compiles one target's graphs with; built by
    ``PluginManager.session(target)`` once per target and shared by every graph.

    ``lowerings`` (a ``LoweringTable``), ``decompositions(options)``, ``pipeline`` (the
    stages and their passes for the session's options, ``fxwrap.core.pipeline``;
    ``repr(session.pipeline)`` lists them), ``capabilities`` (the device's, read once),
    ``intrinsics`` (the target's own ops, ``fxwrap.Intrinsic``), ``kernel_dtypes`` (what a
    generated kernel may hold on this target), ``new_emitter(size_hints)`` and ``options``.
    """

    def __init__(self, plugins: PluginFacts, target: Target, lowerings: LoweringTable,
                 plugin_decompositions: dict, options: CompileOptions | None = None, templates: tuple = (),
                 pipeline: Pipeline | None = None):
        self.plugins = plugins
        self.options = options or CompileOptions()
        #: the stages (fxwrap's, edited by every plugin's ``fxwrap_pipeline`` for ``options``)
        self.pipeline = plugins.pipeline(self.options) if pipeline is None else pipeline
        #: the target's templates, then every other plugin's (``fxwrap_templates``)
        self.templates = tuple(templates)
        self.target = target
        self.lowerings = lowerings
        self.plugin_decompositions = plugin_decompositions
        self._shared = _SharedState()

    @property
    def template_mode(self) -> str:
        """``"auto"``, ``"always"`` or ``"off"``: how the kernel builder uses ``active_templates``."""
        mode = self.options.templates
        return "auto" if mode == "default" else mode

    @property
    def active_templates(self) -> tuple:
        """The templates this compile considers: all of ``templates``, or under the
        ``"default"`` option outside max-autotune those ``in_default_mode``."""
        if self.options.templates == "default" and not self.options.max_autotune:
            return tuple(t for t in self.templates if getattr(t, "in_default_mode", True))
        return self.templates

    @property
    def kernel_loader(self) -> Callable:
        """What a ``Kernel`` built in this session loads its launcher with after unpickling
        (``fxwrap.plugins.manager.load_kernel``: the named target's emitter)."""
        return self.plugins.kernel_loader

    @property
    def lines_passes(self) -> tuple[LinesPass, ...]:
        """Every Wrapper-IR pass a program goes through (the ``wrapper passes`` stage's)."""
        return tuple(self.pipeline.wrapper)

    @property
    def generates_kernels(self) -> bool:
        return generates_kernels(self.target)

    def configured(self, options: CompileOptions) -> "CompileSession":
        """This session with ``options``: the same lowering table and caches, the pipeline
        for ``options``."""
        if options == self.options and options.on_program is self.options.on_program:
            return self
        shared = self._shared
        with shared.lock:
            pipeline = shared.pipelines.get(options)
            if pipeline is None:  # the hook, once per set of options (check_nan adds a pass)
                pipeline = self.pipeline if options == self.options else self.plugins.pipeline(options)
                shared.pipelines[options] = pipeline
        other = CompileSession(self.plugins, self.target, self.lowerings, self.plugin_decompositions,
                               options, self.templates, pipeline)
        other._shared = shared
        return other

    @property
    def capabilities(self) -> Capabilities:
        """``target.device.capabilities()`` as a ``Capabilities`` record, asked once per
        session (a device still returning a dict: converted, with a ``DeprecationWarning``)."""
        shared = self._shared
        with shared.lock:
            if shared.capabilities is None:
                device = self.target.device
                shared.capabilities = as_capabilities(device.capabilities(), device)
            return shared.capabilities

    @property
    def intrinsics(self) -> tuple:
        """The target's own ops (``fxwrap.Intrinsic``s its emitter declares,
        ``KernelEmitter.intrinsics``): the lowering table emits them, the caches key on them."""
        return tuple(getattr(self.target.emitter, "intrinsics", ()))

    @property
    def kernel_dtypes(self) -> frozenset:
        """The dtypes a generated kernel may read or write on this target: fxwrap's own,
        narrowed by the device's ``capabilities().dtypes`` (names such as
        ``"bfloat16"``; None: no limit) and by the emitter's ``supported_dtypes``."""
        dtypes = set(KERNEL_DTYPES)
        named = self.capabilities.dtypes
        if named is not None:
            dtypes &= {getattr(torch, n) for n in named}
        supported = getattr(self.target.emitter, "supported_dtypes", None)  # None: every dtype
        if supported is not None:
            dtypes &= set(supported)
        return frozenset(dtypes)

    @property
    def numerics(self) -> Numerics:
        """What this target's kernels compute in (``fxwrap.core.numerics``): the dtypes of
        ``kernel_dtypes`` but bf16/fp16; every kernel is legalized for it before emission."""
        return numerics_for(self.kernel_dtypes)

    def decompositions(self, options: CompileOptions | None = None) -> dict:
        """The decomposition table a graph for this target is captured with: PyTorch's
        core table (``decompositions="core"``), the kernel decompositions where kernels
        are generated, then every plugin's ``fxwrap_decompositions``."""
        options = options or self.options
        kernels = options.decompositions == "core" and self.generates_kernels and options.kernels
        key = (options.decompositions, kernels)
        shared = self._shared
        with shared.lock:
            table = shared.decompositions.get(key)
            if table is None:
                table = default_decompositions() if options.decompositions == "core" else {}
                if kernels:
                    table.update(kernel_decompositions())
                table.update(self.plugin_decompositions)
                shared.decompositions[key] = table
        return dict(table)

    @property
    def template_ops(self) -> frozenset:
        """Every ATen overload some template of this session computes."""
        return frozenset(op for t in self.active_templates for op in t.ops)

    def new_emitter(self, size_hints: dict | None = None) -> KernelEmitter:
        """A kernel emitter for one graph; ``size_hints`` (``{symbol: int}``) are its example sizes."""
        emitter = self.target.emitter(self.target)
        emitter.size_hints = dict(size_hints or {})
        emitter.max_autotune = self.options.max_autotune
        return emitter

    def __repr__(self) -> str:
        return (f"CompileSession(target={self.target.name!r}, {len(self.lowerings)} lowerings, "
                f"{len(self.plugin_decompositions)} plugin decompositions, "
                f"{len(self.templates)} templates, {len(self.pipeline.stages)} stages)")


class _SharedState:
    """Caches shared by a session and its ``configured`` copies."""

    def __init__(self):
        self.lock = threading.Lock()
        self.capabilities: Capabilities | None = None
        self.decompositions: dict = {}
        self.pipelines: dict[CompileOptions, Pipeline] = {}  # options -> the hook's pipeline
