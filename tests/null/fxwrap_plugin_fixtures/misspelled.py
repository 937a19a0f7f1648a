"""``fxwrap_target`` (no s): not a hook."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import target


@hookimpl
def fxwrap_target():
    return [target("misspelled")]
