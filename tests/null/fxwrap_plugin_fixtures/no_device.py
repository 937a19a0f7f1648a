"""A target whose device is a string, not a DeviceInterface."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import target


@hookimpl
def fxwrap_targets():
    return [target("no_device", device_type="testdev", device="testdev")]
