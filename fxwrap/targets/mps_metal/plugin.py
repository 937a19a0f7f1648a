"""Registers the built-in ``mps`` target through the ``fxwrap`` entry point."""
from fxwrap.plugins.hookspecs import hookimpl
from fxwrap.targets.base import KernelEmitter, Target, WrapperCodegen
from fxwrap.targets.mps_metal.device import MpsDevice


@hookimpl
def fxwrap_targets():
    return [Target("mps", "mps", MpsDevice(), KernelEmitter, WrapperCodegen)]
