"""Registers the built-in ``cpu`` target through the ``fxwrap`` entry point."""
from fxwrap.plugins.hookspecs import hookimpl
from fxwrap.targets.base import DirectCallWrapper, Target
from fxwrap.targets.host.device import CpuDevice
from fxwrap.targets.cpu_cpp.emitter import CppEmitter


@hookimpl
def fxwrap_targets():
    return [Target("cpu", "cpu", CpuDevice(), CppEmitter, DirectCallWrapper)]
