"""A target given tensors of another device type is a clear error when the compile
starts, not a failure at run time (``target="cuda"``) nor a CPU program labelled with
another device (``target="mps"``)."""
import pytest
import torch

import fxwrap


def _f(x):
    return x.sin() * 2


@pytest.mark.parametrize("target", ["cuda", "mps"])
def test_lower_for_another_device_type_names_the_input_and_the_target(target):
    with pytest.raises(ValueError, match=rf"input 0 \(size \(4,\)\) is on device cpu, but target "
                                         rf"'{target}' runs on device type '{target}'"):
        fxwrap.lower(_f, torch.randn(4), target=target, options={"kernels": False})


def test_torch_compile_for_another_device_type_fails_at_compile_time():
    compiled = torch.compile(_f, backend="fxwrap", options={"target": "mps"})
    with pytest.raises(Exception, match="is on device cpu, but target 'mps' runs on device type 'mps'"):
        compiled(torch.randn(4))
    torch._dynamo.reset()


def test_execute_shim_runs_the_metal_target_on_cpu_tensors_and_0d_cpu_tensors_pass():
    x = torch.randn(4)
    program = fxwrap.lower(_f, x, options={"target": "mps", "execute": "shim", "kernels": False})
    assert program.target.name == "mps_shim"
    torch.testing.assert_close(program.run(x), _f(x))
    from fxwrap.api import check_input_devices
    from fxwrap.plugins.manager import get_plugin_manager
    cuda = get_plugin_manager().target("cuda")
    check_input_devices(cuda, [torch.tensor(2.0)])  # a 0-d CPU tensor is a scalar next to any device
    with pytest.raises(ValueError, match=r"input 1 \(size \(3,\)\)"):
        check_input_devices(cuda, [torch.tensor(2.0), torch.randn(3)])
