"""fxwrap: a torch.compile backend that lowers PyTorch programs to a Wrapper IR and
an FX GraphModule, with devices plugged in as targets.

    >>> compiled = torch.compile(model, backend="fxwrap")
    >>> program = fxwrap.lower(fn, *example_inputs); print(program.code())
"""
from fxwrap.api import Backend, Program, TrainingPrograms, compile, lower
from fxwrap.core.memory import MemoryPlan
from fxwrap.plugins.hookspecs import hookimpl, hookspec
from fxwrap.plugins.manager import (
    PluginError, PluginManager, get_plugin_manager, installed_entry_points, use_plugin_manager,
)
from fxwrap.runtime import InputGuard, InputMismatchError, Kernel, KernelArg, free
from fxwrap.targets.base import (
    DeviceInterface, DirectCallWrapper, KernelEmitter, KernelSource, Target, WrapperCodegen,
)
from fxwrap.targets.cpu_cpp.device import CpuDevice
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.targets.cstyle import CStyleEmitter, EmitError
from fxwrap.wrapper_ir import lines

__all__ = [
    "Backend", "CStyleEmitter", "CppEmitter", "CpuDevice", "DeviceInterface", "DirectCallWrapper", "EmitError",
    "InputGuard", "InputMismatchError", "Kernel",
    "KernelArg", "KernelEmitter", "KernelSource", "MemoryPlan", "PluginError", "PluginManager",
    "Program", "Target", "TrainingPrograms", "WrapperCodegen", "compile", "free",
    "get_plugin_manager", "hookimpl", "hookspec", "installed_entry_points", "lines", "lower",
    "use_plugin_manager",
]
