"""fxwrap: a torch.compile backend that lowers PyTorch programs to a Wrapper IR and
an FX GraphModule, with devices plugged in as targets::

    compiled = torch.compile(model, backend="fxwrap")
    program = fxwrap.lower(fn, *example_inputs); print(program.code())

The package imports lazily: ``import fxwrap`` loads nothing but this file and
``fxwrap.registration`` (standard library only: ``backend="fxwrap"`` registered race-free), each name
below loads its module on first use, and ``import fxwrap.runtime`` (what a compiled
GraphModule calls) loads no compiler module and no dynamo.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "Backend": "fxwrap.api", "Program": "fxwrap.programs.program", "TrainingPrograms": "fxwrap.programs.program",
    "compile": "fxwrap.api", "lower": "fxwrap.api",
    "aot_compile": "fxwrap.api", "load_compiled": "fxwrap.api", "CompiledFunction": "fxwrap.programs.precompile",
    "PrecompileError": "fxwrap.programs.precompile",
    "load": "fxwrap.programs.artifacts", "LoadedProgram": "fxwrap.programs.artifacts",
    "LoadedTrainingPrograms": "fxwrap.programs.artifacts", "ProgramFileError": "fxwrap.programs.artifacts",
    "MemoryPlan": "fxwrap.core.memory",
    "save_cache_artifacts": "fxwrap.programs.graph_cache", "load_cache_artifacts": "fxwrap.programs.graph_cache",
    "CacheBundleError": "fxwrap.programs.graph_cache",
    "ProfileReport": "fxwrap.profiling", "profile": "fxwrap.profiling",
    "EmitError": "fxwrap.core.errors", "UnsupportedUserKernel": "fxwrap.core.errors",
    "hookimpl": "fxwrap.targets.marker", "hookspec": "fxwrap.plugins.hookspecs",
    "PluginError": "fxwrap.plugins.manager", "PluginManager": "fxwrap.plugins.manager",
    "get_plugin_manager": "fxwrap.plugins.manager", "installed_entry_points": "fxwrap.plugins.manager",
    "use_plugin_manager": "fxwrap.plugins.manager",
    "InputGuard": "fxwrap.runtime.guards", "InputMismatchError": "fxwrap.runtime.guards",
    "Kernel": "fxwrap.runtime.kernel", "KernelArg": "fxwrap.runtime.kernel", "free": "fxwrap.runtime.memory",
    "Capabilities": "fxwrap.ir.capabilities", "DECLINE": "fxwrap.core.lowering",
    "Intrinsic": "fxwrap.ir.intrinsics",
    "DeviceInterface": "fxwrap.targets.base", "DirectCallWrapper": "fxwrap.targets.base",
    "KernelEmitter": "fxwrap.targets.base", "KernelSource": "fxwrap.targets.base",
    "Target": "fxwrap.targets.base", "WrapperCodegen": "fxwrap.targets.base",
    "CpuDevice": "fxwrap.targets.host.device",
    "CppEmitter": "fxwrap.targets.cpu_cpp.emitter",
    "CStyleEmitter": "fxwrap.targets.cstyle",
    "Origin": "fxwrap.runtime.provenance",
    "GraphCapture": "fxwrap.runtime.graph_replay", "LaunchListCapture": "fxwrap.runtime.launch_list",
    "Template": "fxwrap.core.templates", "TemplateCall": "fxwrap.core.templates",
}
_SUBMODULES: dict[str, str] = {"lines": "fxwrap.ir.lines",
                                "control_flow": "fxwrap.ir.control_flow",
                                "collectives": "fxwrap.ir.collectives"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    else:
        raise AttributeError(f"module 'fxwrap' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


from fxwrap import registration as _registration  # noqa: E402  (standard library only)

_registration.install()  # backend="fxwrap" registered race-free (fxwrap/registration.py)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from fxwrap.api import Backend, aot_compile, compile, load_compiled, lower  # noqa: F401
    from fxwrap.programs.precompile import CompiledFunction, PrecompileError  # noqa: F401
    from fxwrap.programs.artifacts import LoadedProgram, LoadedTrainingPrograms, ProgramFileError, load  # noqa: F401
    from fxwrap.ir.capabilities import Capabilities  # noqa: F401
    from fxwrap.ir.intrinsics import Intrinsic  # noqa: F401
    from fxwrap.programs.graph_cache import CacheBundleError, load_cache_artifacts, save_cache_artifacts  # noqa: F401
    from fxwrap.core.errors import EmitError, UnsupportedUserKernel  # noqa: F401
    from fxwrap.core.lowering import DECLINE  # noqa: F401
    from fxwrap.core.memory import MemoryPlan  # noqa: F401
    from fxwrap.core.templates import Template, TemplateCall  # noqa: F401
    from fxwrap.plugins.hookspecs import hookspec  # noqa: F401
    from fxwrap.profiling import ProfileReport, profile  # noqa: F401
    from fxwrap.programs.program import Program, TrainingPrograms  # noqa: F401
    from fxwrap.plugins.manager import (  # noqa: F401
        PluginError, PluginManager, get_plugin_manager, installed_entry_points, use_plugin_manager,
    )
    from fxwrap.runtime.guards import InputGuard, InputMismatchError  # noqa: F401
    from fxwrap.runtime.kernel import Kernel, KernelArg  # noqa: F401
    from fxwrap.runtime.memory import free  # noqa: F401
    from fxwrap.targets.base import (  # noqa: F401
        DeviceInterface, DirectCallWrapper, KernelEmitter, KernelSource, Target, WrapperCodegen,
    )
    from fxwrap.targets.cpu_cpp.emitter import CppEmitter  # noqa: F401
    from fxwrap.targets.cstyle import CStyleEmitter  # noqa: F401
    from fxwrap.targets.host.device import CpuDevice  # noqa: F401
    from fxwrap.targets.marker import hookimpl  # noqa: F401
    from fxwrap.ir import collectives, control_flow, lines  # noqa: F401
    from fxwrap.runtime.provenance import Origin  # noqa: F401
    from fxwrap.runtime.graph_replay import GraphCapture  # noqa: F401
