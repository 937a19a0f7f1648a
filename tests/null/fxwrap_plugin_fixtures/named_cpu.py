"""Registers a target named ``cpu``, the name of a built-in target (on another device type)."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import OtherDevice, target


@hookimpl
def fxwrap_targets():
    return [target("cpu", device=OtherDevice())]
