"""A target on device type ``cpu`` whose device interface is for ``testdev``."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import target


@hookimpl
def fxwrap_targets():
    return [target("mismatched", device_type="cpu")]
