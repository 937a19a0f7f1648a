"""Registers the built-in ``cpu`` target, and its templates (few-row GEMM, GEMM, int8 weight-only
GEMM), through the ``fxwrap`` entry point."""
from fxwrap.plugins.hookspecs import hookimpl
from fxwrap.targets.base import Target
from fxwrap.targets.host.device import CpuDevice
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.targets.cpu_cpp.gemm import CppGemm
from fxwrap.targets.cpu_cpp.gemv import CppGemv
from fxwrap.targets.cpu_cpp.int8_gemm import CppInt8Gemm
from fxwrap.targets.cpu_cpp.wrapper import CpuWrapper


@hookimpl
def fxwrap_targets():
    return [Target("cpu", "cpu", CpuDevice(), CppEmitter, CpuWrapper)]


@hookimpl
def fxwrap_templates(target):
    return [CppGemv(), CppGemm(), CppInt8Gemm()] if target.name == "cpu" else []
