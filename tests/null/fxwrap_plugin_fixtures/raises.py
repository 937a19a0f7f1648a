"""fxwrap_targets raises."""
from fxwrap import hookimpl


@hookimpl
def fxwrap_targets():
    raise RuntimeError("no licence for the simulator")
