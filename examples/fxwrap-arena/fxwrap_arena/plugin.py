"""The entry point ``arena = "fxwrap_arena.plugin"`` (group ``fxwrap``) names this module."""
import fxwrap
from fxwrap.targets.cpu_cpp.device import CpuDevice

from fxwrap_arena.wrapper import ArenaWrapper

# Kernels: for now fxwrap's base emitter, which renders none (every op an extern call).
# Next: ``class ArenaEmitter(fxwrap.targets.cpu_cpp.emitter.CppEmitter)`` in
# fxwrap_arena/emitter.py, imported here instead; ArenaWrapper already runs its launches.
ArenaEmitter = fxwrap.KernelEmitter


@fxwrap.hookimpl
def fxwrap_targets():
    # Priority below the built-in cpu target (0): chosen only by name, never by default.
    return [fxwrap.Target("arena", "cpu", CpuDevice(), ArenaEmitter, ArenaWrapper,
                          options={"alignment": 64}, priority=-10)]
