"""A hookwrapper: fxwrap hooks only collect results."""
from fxwrap import hookimpl


@hookimpl(wrapper=True)
def fxwrap_wrapper_passes(target):
    return (yield)
