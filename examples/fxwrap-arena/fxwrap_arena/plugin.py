"""The entry point ``arena = "fxwrap_arena.plugin"`` (group ``fxwrap``) names this module."""
import fxwrap

from fxwrap_arena.emitter import ArenaEmitter
from fxwrap_arena.wrapper import ArenaWrapper


@fxwrap.hookimpl
def fxwrap_targets():
    # Priority below the built-in cpu target (0): chosen only by name, never by default.
    return [fxwrap.Target("arena", "cpu", fxwrap.CpuDevice(), ArenaEmitter, ArenaWrapper,
                          options={"alignment": 64}, priority=-10)]
