"""The entry point ``c99 = "fxwrap_c99.plugin"`` (group ``fxwrap``) names this module."""
import fxwrap

from fxwrap_c99.emitter import C99Emitter


@fxwrap.hookimpl
def fxwrap_targets():
    # Priority below the built-in cpu target (0): chosen only by name, never by default.
    return [fxwrap.Target("c99", "cpu", fxwrap.CpuDevice(), C99Emitter, fxwrap.WrapperCodegen, priority=-10)]
