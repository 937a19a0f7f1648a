"""fxwrap_wrapper_passes raises at compile time."""
from fxwrap import hookimpl


@hookimpl
def fxwrap_wrapper_passes(target):
    raise ValueError(f"passes for {target.name} are not ready")
