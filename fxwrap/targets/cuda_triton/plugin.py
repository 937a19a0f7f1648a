"""Registers the built-in ``cuda`` target through the ``fxwrap`` entry point."""
from fxwrap.plugins.hookspecs import hookimpl
from fxwrap.targets.base import KernelEmitter, Target, WrapperCodegen
from fxwrap.targets.cuda_triton.device import CudaDevice


@hookimpl
def fxwrap_targets():
    return [Target("cuda", "cuda", CudaDevice(), KernelEmitter, WrapperCodegen)]
