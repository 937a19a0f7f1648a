"""The entry point ``arena = "fxwrap_arena.plugin"`` (group ``fxwrap``) names this module."""
import fxwrap

from fxwrap_arena.emitter import ArenaEmitter
from fxwrap_arena.gemm import ArenaBlockedGemm
from fxwrap_arena.wrapper import ArenaWrapper


@fxwrap.hookimpl
def fxwrap_targets():
    # Priority below the built-in cpu target (0): chosen only by name, never by default.
    return [fxwrap.Target("arena", "cpu", fxwrap.CpuDevice(), ArenaEmitter, ArenaWrapper,
                          options={"alignment": 64}, priority=-10)]


@fxwrap.hookimpl
def fxwrap_templates(target):
    # Its own GEMM for its own target (the built-in cpu target registers cpp_gemm for "cpu").
    return [ArenaBlockedGemm()] if target.name == "arena" else []
