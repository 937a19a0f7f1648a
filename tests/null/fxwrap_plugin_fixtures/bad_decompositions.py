"""fxwrap_decompositions returns a list."""
from fxwrap import hookimpl


@hookimpl
def fxwrap_decompositions(target):
    return ["not", "a", "dict"]
