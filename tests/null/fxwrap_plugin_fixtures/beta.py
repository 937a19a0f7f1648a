"""Target ``beta`` on testdev, priority 1 (ties with alpha)."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import target


@hookimpl
def fxwrap_targets():
    return [target("beta", priority=1)]
