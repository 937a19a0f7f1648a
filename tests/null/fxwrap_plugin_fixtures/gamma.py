"""Target ``gamma`` on testdev, priority 2 (beats alpha and beta)."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import target


@hookimpl
def fxwrap_targets():
    return [target("gamma", priority=2)]
