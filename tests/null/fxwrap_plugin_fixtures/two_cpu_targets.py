"""One plugin, two targets on one device type (the CPU): the C++ target's parts under two
names, the second with lower priority (chosen only by name)."""
import fxwrap
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.targets.cpu_cpp.wrapper import CpuWrapper


@fxwrap.hookimpl
def fxwrap_targets():
    return [fxwrap.Target("twin_fast", "cpu", fxwrap.CpuDevice(), CppEmitter, CpuWrapper, priority=-5),
            fxwrap.Target("twin_variant", "cpu", fxwrap.CpuDevice(), CppEmitter, CpuWrapper, priority=-6)]
