"""Registers the ``reference`` target (CPU tensors, chosen by name only)."""
from fxwrap.targets.marker import hookimpl
from fxwrap.targets.base import Target, WrapperCodegen
from fxwrap.targets.host.device import CpuDevice
from fxwrap.targets.reference.emitter import ReferenceEmitter


@hookimpl
def fxwrap_targets():
    return [Target("reference", "cpu", CpuDevice(), ReferenceEmitter, WrapperCodegen, priority=-1)]
