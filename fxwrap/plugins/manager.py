"""Finds plugins through the entry-point group ``fxwrap``, validates them at load
time, and answers which target compiles what.

    >>> manager = get_plugin_manager()
    >>> manager.target("cpu").name, manager.target_for_device("cuda").name
    ('cpu', 'cuda')

Rule for several targets on one device type: the highest ``Target.priority`` is
the default for tensors of that device type; on a tie, the alphabetically first
target name.  Any target can always be picked by name.  Built-in targets have
priority 0 and load through the same entry-point group as everyone else.
"""
from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Iterable

import pluggy

from fxwrap.plugins import hookspecs
from fxwrap.targets.base import DeviceInterface, KernelEmitter, Target, WrapperCodegen

GROUP = "fxwrap"


class PluginError(RuntimeError):
    """A plugin is broken; the message names its entry point and what is wrong."""


def _describe(ep) -> str:
    return f"plugin {ep.name!r} (entry point {ep.value!r} in group {GROUP!r})"


class PluginManager:
    """Loads plugins once and keeps the registered targets by name."""

    def __init__(self, entry_points: Iterable | None = None):
        self._entry_points = entry_points
        self.pm = pluggy.PluginManager("fxwrap")
        self.pm.add_hookspecs(hookspecs)
        self.targets: dict[str, Target] = {}
        self.owner: dict[str, str] = {}  # target name -> plugin description
        self._loaded = False

    def discover(self) -> list:
        if self._entry_points is not None:
            return list(self._entry_points)
        eps = importlib.metadata.entry_points(group=GROUP)
        return sorted(eps, key=lambda ep: ep.name)

    def load(self) -> "PluginManager":
        if self._loaded:
            return self
        for ep in self.discover():
            self._load_one(ep)
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
            raise PluginError(f"{who} does not match fxwrap's hook specifications: {exc}") from exc
        except ValueError as exc:
            raise PluginError(f"{who} is registered twice: {exc}") from exc
        impls = [n for n in dir(plugin) if n.startswith("fxwrap_")]
        if not impls:
            raise PluginError(f"{who} implements no fxwrap_ hook; it needs at least one of "
                              f"{sorted(n for n in dir(hookspecs) if n.startswith('fxwrap_'))}")
        hook = getattr(plugin, "fxwrap_targets", None)
        if hook is None:
            return
        try:
            targets = hook()
        except Exception as exc:
            raise PluginError(f"{who}: its fxwrap_targets() raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(targets, (list, tuple)):
            raise PluginError(f"{who}: fxwrap_targets() must return a list of fxwrap.Target, "
                              f"got {type(targets).__name__}")
        seen_devices: set[str] = set()
        for t in targets:
            self._validate_target(who, t)
            if t.device_type in seen_devices:
                raise PluginError(f"{who} registers device type {t.device_type!r} twice; "
                                  "give one plugin one target per device type")
            seen_devices.add(t.device_type)
            if t.name in self.targets:
                raise PluginError(f"{who} registers target {t.name!r}, already registered by "
                                  f"{self.owner[t.name]}; rename one of them")
            self.targets[t.name] = t
            self.owner[t.name] = who

    @staticmethod
    def _validate_target(who: str, t) -> None:
        if not isinstance(t, Target):
            raise PluginError(f"{who}: fxwrap_targets() returned {t!r}, not an fxwrap.Target")
        problems = []
        if not isinstance(t.device, DeviceInterface):
            problems.append("a device interface (Target.device: a DeviceInterface instance)")
        elif not t.device.device_type:
            problems.append("a device type on its DeviceInterface (device_type = '...')")
        if not (isinstance(t.emitter, type) and issubclass(t.emitter, KernelEmitter)):
            problems.append("a kernel emitter (Target.emitter: a KernelEmitter subclass)")
        if not (isinstance(t.wrapper, type) and issubclass(t.wrapper, WrapperCodegen)):
            problems.append("a wrapper (Target.wrapper: a WrapperCodegen subclass)")
        if problems:
            raise PluginError(f"{who}: target {t.name!r} lacks " + "; ".join(problems))

    # -- queries ------------------------------------------------------------
    def target(self, name: str) -> Target:
        self.load()
        try:
            return self.targets[name]
        except KeyError:
            raise KeyError(f"no fxwrap target named {name!r}; registered: {sorted(self.targets)}. "
                           "Install the plugin that provides it (entry-point group 'fxwrap').") from None

    def target_for_device(self, device_type: str) -> Target:
        self.load()
        candidates = [t for t in self.targets.values() if t.device_type == device_type]
        if not candidates:
            raise KeyError(f"no fxwrap target for device type {device_type!r}; registered: "
                           f"{sorted((t.name, t.device_type) for t in self.targets.values())}")
        return min(candidates, key=lambda t: (-t.priority, t.name))

    def decompositions(self, target: Target) -> dict:
        table: dict = {}
        for extra in reversed(self.pm.hook.fxwrap_decompositions(target=target)):
            table.update(extra or {})
        return table

    def wrapper_passes(self, target: Target) -> list:
        passes = []
        for group in reversed(self.pm.hook.fxwrap_wrapper_passes(target=target)):
            passes.extend(group or [])
        return passes

    def add_lowerings(self, registry, target: Target) -> None:
        self.pm.hook.fxwrap_lowerings(registry=registry, target=target)


_MANAGER: PluginManager | None = None
_LOCK = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide manager, loaded on first use."""
    global _MANAGER
    with _LOCK:
        if _MANAGER is None:
            _MANAGER = PluginManager().load()
        return _MANAGER
