"""A target whose wrapper is None."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import target


@hookimpl
def fxwrap_targets():
    return [target("no_wrapper", wrapper=None)]
