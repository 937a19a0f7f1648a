"""``fxwrap_targets`` without ``@hookimpl``: pluggy would silently ignore it."""
from fxwrap_plugin_fixtures import target


def fxwrap_targets():
    return [target("undecorated")]
