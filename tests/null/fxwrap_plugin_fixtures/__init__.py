"""Small fxwrap plugins for tests/null/test_plugins.py, one module per case.

Each test builds ``importlib.metadata.EntryPoint(name, "fxwrap_plugin_fixtures.<module>",
group="fxwrap")`` and passes it to ``fxwrap.PluginManager(entry_points=[...])``.
"""
import fxwrap


class FakeDevice(fxwrap.DeviceInterface):
    """A device type no real target uses, so these plugins never meet the built-ins."""

    device_type = "testdev"

    def is_available(self) -> bool:
        return True


class OtherDevice(FakeDevice):
    device_type = "otherdev"


def target(name, priority=0, device=None, device_type=None,
           emitter=fxwrap.KernelEmitter, wrapper=fxwrap.WrapperCodegen) -> fxwrap.Target:
    """A Target on ``testdev`` unless told otherwise; any part can be replaced."""
    device = FakeDevice() if device is None else device
    device_type = device.device_type if device_type is None else device_type
    return fxwrap.Target(name, device_type, device, emitter, wrapper, priority=priority)
