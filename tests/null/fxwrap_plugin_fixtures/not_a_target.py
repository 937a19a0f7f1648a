"""fxwrap_targets returns a list holding a dict."""
from fxwrap import hookimpl


@hookimpl
def fxwrap_targets():
    return [{"name": "dict", "device_type": "testdev"}]
