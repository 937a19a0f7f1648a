"""Registers a second target named ``alpha`` (on another device type)."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import OtherDevice, target


@hookimpl
def fxwrap_targets():
    return [target("alpha", device=OtherDevice())]
