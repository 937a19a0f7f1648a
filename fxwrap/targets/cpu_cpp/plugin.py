"""Registers the built-in ``cpu`` target, its templates (few-row GEMM, GEMM, int8 weight-only
GEMM) and its Wrapper-IR pass ``"cpu attention"`` (attention as one C++ kernel: ``cpu_cpp.attention``),
through the ``fxwrap`` entry point."""
from fxwrap.targets.marker import hookimpl
from fxwrap.targets.base import Target
from fxwrap.targets.host.device import CpuDevice
from fxwrap.core.passes import MEMORY_PLAN
from fxwrap.targets.cpu_cpp.attention import attention_pass
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


@hookimpl
def fxwrap_pipeline(pipeline, target):
    if target.name == "cpu":
        pipeline.wrapper.insert_before(MEMORY_PLAN, attention_pass())
