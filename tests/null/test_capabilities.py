"""``DeviceInterface.capabilities()`` is a typed record (``fxwrap.Capabilities``): a
misspelled field is an error, as an unknown option is; a device still returning a dict
is converted with a ``DeprecationWarning``, and an unknown key there names the valid ones."""
import dataclasses

import pytest
import torch

import fxwrap
from fxwrap.plugins.manager import PluginManager
from fxwrap.targets.base import DeviceInterface, KernelEmitter, Target
from fxwrap.targets.host.device import CpuDevice


def test_every_builtin_device_returns_the_record():
    from fxwrap.targets.cuda_triton.device import CudaDevice
    from fxwrap.targets.mps_metal.device import MpsDevice
    cpu = CpuDevice().capabilities()
    assert isinstance(cpu, fxwrap.Capabilities)
    assert cpu.convolution_layout == "channels_last" and "bfloat16" in cpu.dtypes and cpu.cores >= 1
    metal = MpsDevice().capabilities()
    assert metal.max_threads_per_threadgroup == 1024 and "float64" not in metal.dtypes
    assert isinstance(CudaDevice().capabilities(), fxwrap.Capabilities)
    assert DeviceInterface().capabilities() == fxwrap.Capabilities()


def test_an_unknown_field_is_an_error():
    with pytest.raises(TypeError, match="index_check"):
        fxwrap.Capabilities(index_check="in_kernel")
    with pytest.raises(TypeError, match=r"unknown device capability\(ies\) \['convolution_layuot'\]; "
                                        r"valid: \[.*'convolution_layout'"):
        fxwrap.Capabilities.from_dict({"convolution_layuot": "channels_last"})


def test_values_are_checked_and_normalized():
    caps = fxwrap.Capabilities(dtypes=[torch.float32, "bfloat16"], capability=[9, 0])
    assert caps.dtypes == ("float32", "bfloat16") and caps.capability == (9, 0)
    hash(caps)  # the program cache and the session key on it
    with pytest.raises(ValueError, match="not torch dtype names"):
        fxwrap.Capabilities(dtypes=("floot32",))
    with pytest.raises(ValueError, match="index_checks='kernel'"):
        fxwrap.Capabilities(index_checks="kernel")
    with pytest.raises(ValueError, match="matmul_alignment_bytes"):
        fxwrap.Capabilities(matmul_alignment_bytes=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.dtypes = None


def test_a_vendor_subclass_adds_its_own_facts():
    @dataclasses.dataclass(frozen=True)
    class NpuCapabilities(fxwrap.Capabilities):
        tiles: int = 4
    caps = NpuCapabilities.from_dict({"tiles": 8, "dtypes": ["float32"]})
    assert caps.tiles == 8 and caps.dtypes == ("float32",)
    with pytest.raises(TypeError, match="'tiles'"):  # the valid list names the subclass's fields
        NpuCapabilities.from_dict({"tile": 8})


class _DictDevice(CpuDevice):
    """A device written against the old contract."""

    def __init__(self, caps):
        self.caps = caps

    def capabilities(self):
        return dict(self.caps)


def _session(device):
    manager = PluginManager(entry_points=[]).load()
    return manager.session(Target("old_style", "cpu", device, KernelEmitter))


def test_a_dict_is_converted_with_a_deprecation_warning():
    session = _session(_DictDevice({"dtypes": ["float32"], "convolution_layout": "channels_last"}))
    with pytest.warns(DeprecationWarning, match=r"_DictDevice.capabilities\(\) returned a dict"):
        caps = session.capabilities
    assert caps == fxwrap.Capabilities(dtypes=("float32",), convolution_layout="channels_last")
    assert session.kernel_dtypes == frozenset({torch.float32})


def test_a_dict_with_an_unknown_key_is_an_error_naming_the_valid_ones():
    session = _session(_DictDevice({"dtype": ["float32"]}))
    with pytest.warns(DeprecationWarning), \
            pytest.raises(TypeError, match=r"\['dtype'\]; valid: \[.*'dtypes'"):
        session.capabilities
