"""fxwrap_targets returns one Target instead of a list."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import target


@hookimpl
def fxwrap_targets():
    return target("lonely")
