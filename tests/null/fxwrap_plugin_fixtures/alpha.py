"""Target ``alpha`` on testdev, priority 1."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import target


@hookimpl
def fxwrap_targets():
    return [target("alpha", priority=1)]
