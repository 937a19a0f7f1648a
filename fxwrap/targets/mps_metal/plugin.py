"""Registers the built-in ``mps`` target, and ``mps_shim`` (the same Metal kernels run
on CPU tensors through the C++ shim), through the ``fxwrap`` entry point.

``options={"target": "mps", "execute": "shim"}`` picks ``mps_shim``.
"""
from fxwrap.targets.marker import hookimpl
from fxwrap.targets.base import Target, WrapperCodegen
from fxwrap.targets.host.device import CpuDevice
from fxwrap.targets.mps_metal.device import MpsDevice
from fxwrap.targets.mps_metal.emitter import MetalEmitter


@hookimpl
def fxwrap_targets():
    return [Target("mps", "mps", MpsDevice(), MetalEmitter, WrapperCodegen,
                   options={"execute": "mps"}),
            Target("mps_shim", "cpu", CpuDevice(), MetalEmitter, WrapperCodegen,
                   options={"execute": "shim"}, priority=-1)]
