"""What the compiler takes from a target's ``DeviceInterface``: the dtypes a generated
kernel may hold come from ``capabilities().dtypes`` (read once per compile session)."""
import dataclasses
import torch

import fxwrap
from fxwrap.plugins.manager import get_plugin_manager
from fxwrap.targets.base import Target
from fxwrap.targets.host.device import CpuDevice
from fxwrap.targets.cpu_cpp.emitter import CppEmitter


class Float32OnlyDevice(CpuDevice):
    """A CPU whose kernels may hold float32 only; counts how often it is asked."""

    asked = 0

    def capabilities(self) -> fxwrap.Capabilities:
        type(self).asked += 1
        return dataclasses.replace(super().capabilities(), dtypes=("float32",))


def _sines(a, b):
    return a.sin() * 2, b.sin() * 2


def _kernel_sources(program):
    return [n.target.source for n in program.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]


def test_kernel_dtypes_follow_the_device_capabilities():
    a, b = torch.randn(8, 5), torch.randn(8, 5, dtype=torch.float64)
    narrow = Target("cpu_float32_only", "cpu", Float32OnlyDevice(), CppEmitter)
    Float32OnlyDevice.asked = 0
    torch._dynamo.reset()
    program = fxwrap.lower(_sines, a, b, target=narrow)
    torch._dynamo.reset()
    fxwrap.lower(_sines, a.t(), b.t(), target=narrow)
    got = program.run(a, b)
    torch.testing.assert_close(got[0], a.sin() * 2)
    torch.testing.assert_close(got[1], b.sin() * 2)
    code = program.code()
    assert "aten.sin.out" in code and "aten.mul" in code, code  # the float64 ops: externs
    (source,) = _kernel_sources(program)  # the float32 ops: one kernel
    assert "std::sin" in source and "float64" not in source, source  # no float64 buffer in its header
    assert Float32OnlyDevice.asked == 1  # once per session, not per graph or node
    session = get_plugin_manager().session(narrow)
    assert session.kernel_dtypes == {torch.float32}

    torch._dynamo.reset()
    wide = fxwrap.lower(_sines, a, b, target="cpu")  # the cpu target's device allows float64
    assert "aten.sin" not in wide.code() and "float64" in _kernel_sources(wide)[0]
