"""What a device brings to fxwrap: a device interface, a kernel emitter, a wrapper.

A hardware team registers a ``Target`` from its plugin::

    @fxwrap.hookimpl
    def fxwrap_targets():
        return [Target(name="arena", device_type="cpu", device=CpuDevice(),
                       emitter=ArenaEmitter, wrapper=ArenaWrapper)]

and fxwrap then compiles programs whose tensors live on ``device_type`` (or that
name ``target="arena"``) with these pieces.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


class DeviceInterface:
    """One device type's runtime facts: ``DeviceInterface().device_type == "cpu"``."""

    device_type: str = ""

    def is_available(self) -> bool:
        raise NotImplementedError

    def synchronize(self, device=None) -> None:
        return None

    def current_stream(self, device=None):
        return None

    def device_count(self) -> int:
        return 1 if self.is_available() else 0

    def capabilities(self) -> dict:
        return {}


@dataclass(frozen=True)
class KernelSource:
    """Rendered kernel: ``KernelSource("fxwrap_pointwise_0", "extern \"C\" void ...", "c++")``."""

    name: str
    text: str
    language: str
    signature: tuple = ()
    launch: dict = field(default_factory=dict, hash=False, compare=False)


class KernelEmitter:
    """Turns one scheduled kernel into source text, and source into a launcher."""

    language: str = ""

    def __init__(self, target: "Target"):
        self.target = target

    def render(self, kernel) -> KernelSource:
        raise NotImplementedError(f"{type(self).__name__} cannot render kernels yet")

    def load(self, source: KernelSource) -> Callable:
        raise NotImplementedError(f"{type(self).__name__} cannot load kernels yet")


class WrapperCodegen:
    """Turns the program's GraphModule into what runs; subclass to run it your way.

    The default runs the GraphModule itself: ``compile_graph(gm) is gm``.
    """

    def __init__(self, target: "Target"):
        self.target = target

    def compile_graph(self, gm: torch.fx.GraphModule) -> Callable:
        return gm


@dataclass(frozen=True)
class Target:
    """``Target("cpu", "cpu", CpuDevice(), CppEmitter, WrapperCodegen)``."""

    name: str
    device_type: str
    device: DeviceInterface
    emitter: type[KernelEmitter]
    wrapper: type[WrapperCodegen] = WrapperCodegen
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    priority: int = 0

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("Target.name must be a non-empty string")
