"""Finds plugins through the entry-point group ``fxwrap``, validates them at load
time, and answers which target compiles what.

    >>> manager = get_plugin_manager()
    >>> manager.target("cpu").name, manager.target_for_device("cuda").name
    ('cpu', 'cuda')

Rules (which target is a device type's default, and which decomposition wins,
never depend on the order in which plugins load):

* **Load order.**  Installed entry points load sorted by name (then value); a list
  given as ``PluginManager(entry_points=[...])`` loads in its own order.  Load
  order decides only the order in which wrapper passes run, and which of two
  lowering rules two plugins register for one op on one target wins (the later).
* **Validation, at load.**  Every plugin is imported, checked against the hook
  specifications and its ``fxwrap_targets()`` is called and checked.  Anything
  wrong raises ``PluginError`` naming the plugin's entry point and the problem:
  an import that fails; a ``fxwrap_*`` name that is not a hook (``fxwrap_target``)
  or a hook not marked ``@fxwrap.hookimpl``; hook arguments the spec lacks; no
  hook at all; ``hookwrapper``/``wrapper`` implementations (fxwrap hooks only
  collect results); a hook that raises; ``fxwrap_targets()`` returning a non-list
  or a non-``Target``; a target without a ``DeviceInterface`` instance (whose
  ``device_type`` matches the target's), a ``KernelEmitter`` subclass or a
  ``WrapperCodegen`` subclass; two plugins registering one target name.  A manager that failed to load keeps
  raising the same error.
* **Several targets on one device type.**  The default for tensors of that device
  type is the target with the highest ``Target.priority``; on a tie, the
  alphabetically first target name.  Any target can always be picked by name
  (``options={"target": "arena"}``).  Built-in targets have priority 0 and load
  through the same entry-point group as everyone else.
* **Decompositions** (``fxwrap_decompositions``) for a target are merged from every
  plugin.  When two plugins map one op to different callables, the plugin that
  registered the target wins; if neither did, that is a ``PluginError``.
* **The pipeline** (``fxwrap_pipeline(pipeline, target, options)``): each plugin, in
  load order, inserts, replaces or removes stages and passes at named points; the
  deprecated ``fxwrap_wrapper_passes`` hook's passes are appended to the ``wrapper
  passes`` stage after every installed plugin's edits, in load order, each plugin's in
  the order it lists them.  **Lowerings** (``fxwrap_lowerings``): each plugin, in
  load order, registers into a registry of its own; a later plugin's rule for an op
  wins over an earlier one's, and every plugin's over fxwrap's defaults.  A rule for
  a target name no plugin registered is an error naming the plugin (with the closest
  registered name); an ``OpOverloadPacket`` key (``aten.sin``) stands for all its
  overloads.
* **Compile sessions.**  ``session(target)`` builds, once per target per manager, the
  ``CompileSession`` that every graph for that target compiles with: the lowering
  table, the decompositions and the pipeline are collected from the hooks then (the
  pipeline again for each other set of options),
  not for every graph.  Every hook is called through pluggy's hook relay, one
  plugin at a time (``pluggy.PluginManager.subset_hook_caller``).

Errors raised inside a hook at compile time are re-raised as ``PluginError``
naming the plugin too.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import difflib
import importlib.metadata
import inspect
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator

import pluggy

import fxwrap.core.rules  # noqa: F401  (registers fxwrap's default lowering rules)
from fxwrap.core.lowering import REGISTRY, LoweringRegistry, LoweringTable, intrinsic_rules
from fxwrap.core.passes import LinesPass
from fxwrap.core.pipeline import Pipeline
from fxwrap.core.templates import check_template
from fxwrap.plugins import hookspecs
from fxwrap.plugins import debug_modes, graph_capture
from fxwrap.plugins.session import CompileOptions, CompileSession, PluginFacts
from fxwrap.runtime.kernel import Kernel
from fxwrap.targets.base import DeviceInterface, KernelEmitter, KernelSource, Target, WrapperCodegen
from fxwrap.wrapper_ir.stages import default_pipeline

GROUP = "fxwrap"
HOOKS = tuple(sorted(name for name in vars(hookspecs) if name.startswith("fxwrap_")))


class PluginError(RuntimeError):
    """A plugin is broken; the message names its entry point and what is wrong."""


def _describe(ep) -> str:
    return f"plugin {ep.name!r} (entry point {ep.value!r} in group {GROUP!r})"


# fxwrap's own targets, as pyproject.toml declares them (tests/null/test_plugins.py checks
# the two agree): used when fxwrap runs from a source tree that pip has not installed
# (``PYTHONPATH=.``), where no distribution metadata declares them.
BUILTIN_PREFIX = "fxwrap.targets."  # where the entry points of fxwrap's own targets point
BUILTIN_ENTRY_POINTS = (
    ("cpu", "fxwrap.targets.cpu_cpp.plugin"),
    ("cuda", "fxwrap.targets.cuda_triton.plugin"),
    ("mps", "fxwrap.targets.mps_metal.plugin"),
    ("reference", "fxwrap.targets.reference.plugin"),
)


def installed_entry_points() -> list:
    """The installed entry points of group ``fxwrap``, sorted by name then value.

    fxwrap's built-in targets are among them even when fxwrap itself is not installed.
    """
    found = list(importlib.metadata.entry_points(group=GROUP))
    if not any(ep.value.startswith(BUILTIN_PREFIX) for ep in found):
        found += [importlib.metadata.EntryPoint(name, value, GROUP) for name, value in BUILTIN_ENTRY_POINTS]
    return sorted(found, key=lambda ep: (ep.name, ep.value))


def _hook_like_names(plugin) -> list[str]:
    return sorted(n for n in dir(plugin) if n.startswith("fxwrap_") and inspect.isroutine(getattr(plugin, n)))


def _did_you_mean(plugin) -> str:
    """``; 'fxwrap_target' is not a hook: did you mean 'fxwrap_targets'?`` for each unknown name."""
    hints = []
    for name in (n for n in _hook_like_names(plugin) if n not in HOOKS):
        close = difflib.get_close_matches(name, HOOKS, n=1)
        hints.append(f"{name!r} is not a hook: " + (f"did you mean {close[0]!r}?" if close else
                                                      f"the hooks are {list(HOOKS)}"))
    return "".join(f"; {h}" for h in hints)


def load_kernel(kernel: Kernel) -> Callable:
    """A ``Kernel``'s loader (pickled by reference with it): the launcher from the emitter
    of the target the kernel names, looked up in the process-wide plugin manager, so an
    unpickled program loads its kernels (from the target's cache, or compiling them) on
    first launch."""
    target = get_plugin_manager().target(kernel.target)
    source = KernelSource(kernel.name, kernel.source, target.emitter.language,
                          tuple(kernel.signature), kernel.launch)
    return target.emitter(target).load(source)



class PluginManager:
    """Loads plugins once and keeps the registered targets by name.

    ``entry_points``: ``importlib.metadata.EntryPoint`` objects to load instead of
    the installed ones, e.g. ``[*installed_entry_points(), EntryPoint("mine",
    "my_pkg.plugin", group="fxwrap")]``.
    """

    kernel_loader = staticmethod(load_kernel)  # the loader every compiled Kernel carries

    def __init__(self, entry_points: Iterable | None = None):
        self._entry_points = None if entry_points is None else list(entry_points)
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.targets: dict[str, Target] = {}
        self.owner: dict[str, str] = {}  # target name -> plugin description
        self.builtin_targets: set[str] = set()  # names of the targets fxwrap's own plugins registered
        self.plugins: list[tuple[str, str]] = []  # (plugin name, description), load order
        self.builtin_plugins: list[tuple[str, str]] = []  # fxwrap's own, after every installed one
        self._warned_legacy: set[str] = set()  # plugins warned that fxwrap_wrapper_passes is deprecated
        self._loaded = False
        self._error: PluginError | None = None
        self._sessions: dict[Target, CompileSession] = {}
        self._session_lock = threading.RLock()

    def discover(self) -> list:
        return installed_entry_points() if self._entry_points is None else list(self._entry_points)

    def load(self) -> "PluginManager":
        if self._error is not None:
            raise self._error
        if not self._loaded:
            try:
                for ep in self.discover():
                    self._load_one(ep)
                self._register_builtin(debug_modes, debug_modes.PLUGIN_NAME)
                self._register_builtin(graph_capture, graph_capture.PLUGIN_NAME)
            except PluginError as exc:
                self._error = exc
                raise
            self._loaded = True
        return self

    def _load_one(self, ep) -> None:
        who = _describe(ep)
        try:
            plugin = ep.load()
        except Exception as exc:
            raise PluginError(f"{who} failed to import: {type(exc).__name__}: {exc}") from exc
        try:
            self.pm.register(plugin, name=ep.name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"{who} does not match fxwrap's hook specifications: {exc}"
                              f"{_did_you_mean(plugin)}") from exc
        except ValueError as exc:
            raise PluginError(f"{who} is registered twice: {exc}") from exc
        self._check_names(who, plugin)
        impls = [impl for caller in self.pm.get_hookcallers(plugin) or () for impl in caller.get_hookimpls()
                 if impl.plugin is plugin]
        if not impls:
            raise PluginError(f"{who} implements no fxwrap hook; it needs at least one of {list(HOOKS)}, "
                              "each marked @fxwrap.hookimpl")
        wrappers = [impl.function.__name__ for impl in impls if impl.hookwrapper or impl.wrapper]
        if wrappers:
            raise PluginError(f"{who}: {wrappers} are hook wrappers; fxwrap hooks only collect results, "
                              "drop hookwrapper=/wrapper= from @fxwrap.hookimpl")
        self.plugins.append((ep.name, who))
        for _, targets in self._results("fxwrap_targets", only=ep.name):
            if not isinstance(targets, (list, tuple)):
                raise PluginError(f"{who}: fxwrap_targets() must return a list of fxwrap.Target, "
                                  f"got {type(targets).__name__}")
            for t in targets:
                self._validate_target(who, t)
                if t.name in self.targets:
                    raise self._name_clash(t.name, who, builtin=ep.value.startswith(BUILTIN_PREFIX))
                self.targets[t.name] = t
                self.owner[t.name] = who
                if ep.value.startswith(BUILTIN_PREFIX):
                    self.builtin_targets.add(t.name)

    def _name_clash(self, name: str, who: str, builtin: bool) -> PluginError:
        """The error for a second target named ``name`` (``who``: the plugin registering it now;
        ``builtin``: whether that is one of fxwrap's own).  A clash with a built-in target names
        the other plugin as the one to change, in either load order."""
        first = self.owner[name]
        if builtin or name in self.builtin_targets:
            plugin, own = (first, who) if builtin else (who, first)
            return PluginError(f"{plugin} registers target {name!r}, the name of a built-in fxwrap target "
                               f"(registered by {own}); a plugin cannot replace a built-in target: give the "
                               "plugin's target another name")
        return PluginError(f"{who} registers target {name!r}, already registered by {first}; rename one of them")

    def _register_builtin(self, plugin, name: str) -> None:
        """Register one of fxwrap's own plugins (after every entry point, so its passes run
        last).  It is not listed in ``plugins``: those are the installed ones."""
        if self.pm.get_plugin(name) is None:
            self.pm.register(plugin, name=name)
        self.builtin_plugins.append((name, f"fxwrap's built-in plugin {plugin.__name__}"))

    @staticmethod
    def _check_names(who: str, plugin) -> None:
        """Every ``fxwrap_*`` function is a known hook marked ``@fxwrap.hookimpl`` (pluggy
        checks the marked ones; unmarked ones it would silently ignore)."""
        for name in _hook_like_names(plugin):
            if name not in HOOKS:
                raise PluginError(f"{who} defines a function named like a hook"
                                  f"{_did_you_mean(plugin)}")
            if not hasattr(getattr(plugin, name), "fxwrap_impl"):
                raise PluginError(f"{who} defines {name!r} without @fxwrap.hookimpl; fxwrap would "
                                  "ignore it. Decorate it with @fxwrap.hookimpl")

    @staticmethod
    def _validate_target(who: str, t) -> None:
        if not isinstance(t, Target):
            raise PluginError(f"{who}: fxwrap_targets() returned {t!r}, not an fxwrap.Target")
        problems = []
        if not isinstance(t.device, DeviceInterface):
            problems.append("a device interface (Target.device: a DeviceInterface instance)")
        elif t.device.device_type != t.device_type:
            problems.append(f"a device interface for its device type (Target.device.device_type is "
                            f"{t.device.device_type!r}, Target.device_type is {t.device_type!r})")
        if not (isinstance(t.emitter, type) and issubclass(t.emitter, KernelEmitter)):
            problems.append("a kernel emitter (Target.emitter: a KernelEmitter subclass)")
        if not (isinstance(t.wrapper, type) and issubclass(t.wrapper, WrapperCodegen)):
            problems.append("a wrapper (Target.wrapper: a WrapperCodegen subclass)")
        if problems:
            raise PluginError(f"{who}: target {t.name!r} lacks " + "; ".join(problems))

    def _results(self, hook: str, only: str | None = None, **kwargs) -> list[tuple[str, object]]:
        """``(plugin description, result)`` of each plugin's ``hook``, in load order.

        Each plugin is called through pluggy's hook relay, restricted to that plugin
        (``pluggy.PluginManager.subset_hook_caller``), so tracing and call monitoring
        see every call and an exception is attributed to the plugin that raised it.
        A hook returning None gives no result.
        """
        implementers = {impl.plugin_name for impl in getattr(self.pm.hook, hook).get_hookimpls()}
        out = []
        for name, who in [*self.plugins, *self.builtin_plugins]:
            if name not in implementers or (only is not None and name != only):
                continue
            try:
                results = self._caller(hook, name)(**kwargs)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(f"{who}: its {hook}() raised {type(exc).__name__}: {exc}") from exc
            out.extend((who, result) for result in results)
        return out

    def _caller(self, hook: str, plugin_name: str):
        """The hook caller of ``hook`` that calls only plugin ``plugin_name``'s implementation."""
        plugin = self.pm.get_plugin(plugin_name)
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        return self.pm.subset_hook_caller(hook, others)

    # -- queries ------------------------------------------------------------
    def target(self, name: str) -> Target:
        self.load()
        try:
            return self.targets[name]
        except KeyError:
            raise KeyError(f"no fxwrap target named {name!r}; registered: {sorted(self.targets)}. "
                           "Install the plugin that provides it (entry-point group 'fxwrap').") from None

    def missing_device(self, name: str) -> str | None:
        """Why programs compiled for target ``name`` cannot run in this process: no plugin
        registers the target, or its device interface finds no device
        (``DeviceInterface.is_available()``); None when they can."""
        try:
            target = self.target(name)
        except KeyError as exc:
            return str(exc.args[0])
        if not target.device.is_available():
            return (f"target {name!r} runs on {target.device_type} devices and this machine has none "
                    f"({type(target.device).__name__}.is_available() is False)")
        return None

    def target_for_device(self, device_type: str) -> Target:
        """The default target for ``device_type``: highest priority, then first name."""
        self.load()
        candidates = [t for t in self.targets.values() if t.device_type == device_type]
        if not candidates:
            registered = ", ".join(f"{t.name} ({t.device_type})" for t in sorted(self.targets.values(),
                                                                              key=lambda t: t.name))
            if device_type == "meta":
                advice = ("meta tensors hold no data, so no target runs on them: trace shapes with "
                          "torch.compile(model, backend='eager') (or run the model eagerly), or move the model "
                          "and inputs to a device a target serves")
            else:
                advice = (f"install or register a plugin whose target has device_type {device_type!r} "
                          "(docs/adding-a-device.md), or move the inputs to a device a target serves")
            raise KeyError(f"no fxwrap target for device type {device_type!r}; registered targets (device "
                           f"type): {registered}; {advice}")
        return min(candidates, key=lambda t: (-t.priority, t.name))

    def decompositions(self, target: Target) -> dict:
        """``{op: decomposition}`` from every plugin for ``target`` (see the module rules)."""
        self.load()
        table: dict = {}
        source: dict = {}  # op -> description of the plugin whose entry is in `table`
        owner = self.owner.get(target.name)
        for who, extra in self._results("fxwrap_decompositions", target=target):
            if extra is None:
                continue
            if not isinstance(extra, dict) or not all(callable(fn) for fn in extra.values()):
                raise PluginError(f"{who}: fxwrap_decompositions() must return a dict "
                                  f"{{OpOverload: callable}}, got {extra!r:.200}")
            for op, fn in extra.items():
                if op in table and table[op] is not fn and owner not in (who, source[op]):
                    raise PluginError(f"{who} and {source[op]} both decompose {op} for target "
                                      f"{target.name!r}, differently, and neither registered that target")
                if op not in table or source[op] != owner:
                    table[op], source[op] = fn, who
        return table

    def wrapper_passes(self, target: Target, options: CompileOptions | None = None) -> list[Callable]:
        """The passes of the deprecated ``fxwrap_wrapper_passes`` hook for ``target`` compiled
        with ``options`` (default: the default ``CompileOptions``), every plugin's, in load
        order; ``pipeline`` appends them to the ``wrapper passes`` stage."""
        self.load()
        passes: list[Callable] = []
        options = CompileOptions() if options is None else options
        for who, group in self._results("fxwrap_wrapper_passes", target=target, options=options):
            if group is None:
                continue
            if not isinstance(group, (list, tuple)) or not all(callable(p) for p in group):
                raise PluginError(f"{who}: fxwrap_wrapper_passes() must return a list of callables "
                                  f"pass(lines) -> lines, got {group!r:.200}")
            passes.extend(group)
        return passes

    def templates(self, target: Target) -> tuple:
        """Every plugin's ``fxwrap_templates(target)``: the plugin that registered
        ``target`` first, then the others in load order.  A result that is not a list of
        ``Template`` instances is a ``PluginError`` naming the plugin."""
        self.load()
        owner = self.owner.get(target.name)
        own: list = []
        others: list = []
        for who, found in self._results("fxwrap_templates", target=target):
            if found is None:
                continue
            if not isinstance(found, (list, tuple)):
                raise PluginError(f"{who}: fxwrap_templates() must return a list of fxwrap.Template, "
                                  f"got {type(found).__name__}")
            for template in found:
                try:
                    check_template(template, who)
                except TypeError as exc:
                    raise PluginError(str(exc)) from None
            (own if who == owner else others).extend(found)
        return tuple(own + others)

    def pipeline(self, target: Target, options: CompileOptions | None = None) -> Pipeline:
        """The stages for ``target`` compiled with ``options`` (default: the default
        ``CompileOptions``): fxwrap's (``wrapper_ir.stages.default_pipeline``), edited by each
        installed plugin's ``fxwrap_pipeline(pipeline, target, options)`` in load order; then
        the passes of the deprecated ``fxwrap_wrapper_passes`` hook appended to the ``wrapper
        passes`` stage (a ``DeprecationWarning`` names each plugin still on it); then fxwrap's
        built-in plugins' edits (the debug modes, graph capture's partitions: last).  A
        pipeline broken by an edit (a stage reading what no stage before it gives, a pass of
        the wrong kind, a name twice, no memory plan) is a ``PluginError`` naming the plugin."""
        self.load()
        options = CompileOptions() if options is None else options
        pipeline = default_pipeline()
        for name, who in self.plugins:
            self._edit_pipeline(pipeline, name, who, target, options)
        legacy = {impl.plugin_name for impl in self.pm.hook.fxwrap_wrapper_passes.get_hookimpls()}
        for name, who in self.plugins:
            if name in legacy and name not in self._warned_legacy:
                self._warned_legacy.add(name)
                warnings.warn(f"{who}: the hook fxwrap_wrapper_passes is deprecated and goes in the next release; "
                              "implement fxwrap_pipeline(pipeline, target, options) and append a "
                              "fxwrap.core.passes.LinesPass to pipeline.wrapper (docs/adding-a-device.md)",
                              DeprecationWarning, stacklevel=2)
        names = set(pipeline.wrapper.names())
        for fn in self.wrapper_passes(target, options):
            named = LinesPass.of(fn)
            name, count = named.name, 1
            while name in names:  # two plugins' passes of one name: the pipeline names each once
                count += 1
                name = f"{named.name} {count}"
            names.add(name)
            pipeline.wrapper.append(dataclasses.replace(named, name=name))
        for name, who in self.builtin_plugins:
            self._edit_pipeline(pipeline, name, who, target, options)
        return pipeline

    def _edit_pipeline(self, pipeline: Pipeline, name: str, who: str, target: Target,
                       options: CompileOptions) -> None:
        """Plugin ``name``'s ``fxwrap_pipeline`` edits of ``pipeline`` (if it has the hook), checked."""
        if name not in {impl.plugin_name for impl in self.pm.hook.fxwrap_pipeline.get_hookimpls()}:
            return
        self._results("fxwrap_pipeline", only=name, pipeline=pipeline, target=target, options=options)
        try:
            pipeline.check(target.name)
        except (TypeError, ValueError, KeyError) as exc:
            raise PluginError(f"{who}: its fxwrap_pipeline() left a broken pipeline: {exc}") from exc

    def lowering_table(self, target: Target) -> LoweringTable:
        """The lowering rules for ``target``: fxwrap's defaults, the target's own rules
        (``REGISTRY.register(op, rule, target=target.name)``), the intrinsics its emitter
        declares (``KernelEmitter.intrinsics``: each call one covers is its node, any other
        declines to the rules beneath), then what every plugin's
        ``fxwrap_lowerings`` registers, in load order (a later rule for one op wins).
        A rule registered for a target name that no plugin registers is a ``PluginError``
        naming the plugin (or ``LoweringError`` for the process-wide registry)."""
        self.load()
        known = set(self.targets) | {target.name}
        REGISTRY.check_targets(known)
        layers = [REGISTRY.default, REGISTRY.per_target.get(target.name, {}),
                  intrinsic_rules(target.name, getattr(target.emitter, "intrinsics", ()))]
        for name, who in self.plugins:
            registry = LoweringRegistry(known_targets=known)
            self._results("fxwrap_lowerings", only=name, registry=registry, target=target)
            layers.append(registry.table(target.name))
        return LoweringTable(target.name, *layers)

    def session(self, target: Target) -> CompileSession:
        """The compile session for ``target``, built on first use and kept (one per target
        per manager): its lowering table, decompositions and wrapper passes come from the
        plugins' hooks, called once here and not for every graph."""
        self.load()
        with self._session_lock:
            session = self._sessions.get(target)
            if session is None:
                facts = PluginFacts(self.kernel_loader, functools.partial(self.pipeline, target),
                                    tuple(self.plugins), tuple(self.pm.get_plugins()))
                session = CompileSession(facts, target, self.lowering_table(target),
                                         self.decompositions(target), templates=self.templates(target))
                self._sessions[target] = session
            return session


_MANAGER: PluginManager | None = None
_LOCK = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide manager, loaded on first use."""
    global _MANAGER
    with _LOCK:
        if _MANAGER is None:
            _MANAGER = PluginManager().load()
        return _MANAGER


@contextlib.contextmanager
def use_plugin_manager(manager: PluginManager) -> Iterator[PluginManager]:
    """Make ``manager`` the process-wide one inside a ``with`` block (tests, embedding).

        with use_plugin_manager(PluginManager([*installed_entry_points(), my_ep])):
            torch.compile(fn, backend="fxwrap")(x)
    """
    global _MANAGER
    manager.load()
    with _LOCK:
        previous, _MANAGER = _MANAGER, manager
    try:
        yield manager
    finally:
        with _LOCK:
            _MANAGER = previous
