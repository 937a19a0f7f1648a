"""A target given tensors of another device type is a clear error when the compile
starts, not a failure at run time (``target="cuda"``) nor a CPU program labelled with
another device (``target="mps"``)."""
import pytest
import torch

import fxwrap
from shared_helpers import compiled_autograd_backward


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


def _fake_cuda(*size):
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():  # a CUDA tensor's metadata, on a machine with no CUDA
        return torch.empty(*size, device="cuda")


def test_a_graph_whose_inputs_are_one_list_picks_the_device_of_the_tensors_in_it():
    """A compiled-autograd backward hands the backend one list of tensors.  Its device was
    read off top-level tensors only, so a CUDA backward compiled for the CPU target and a C++
    kernel dereferenced CUDA memory (the nccl DDP test's segfault)."""
    from fxwrap.api import _device_type_of, check_input_devices, resolve_target
    nested = [[torch.tensor(2.0), _fake_cuda(16)]]
    assert _device_type_of(nested) == "cuda"
    assert resolve_target(None, nested).device_type == "cuda"
    # a compiled-autograd graph's list mixes devices legitimately (CPU bookkeeping beside CUDA
    # gradients, seen in the nccl DDP test): not refused; top-level inputs still are
    check_input_devices(resolve_target(None, nested), [[torch.randn(0, 2), _fake_cuda(16)]])
    with pytest.raises(ValueError, match=r"input 0 \(size \(0, 2\)\) is on device cpu, but target 'cuda'"):
        check_input_devices(resolve_target(None, nested), [torch.randn(0, 2), _fake_cuda(16)])


def test_a_graph_with_no_device_input_picks_the_device_of_the_values_it_makes():
    """``torch.ones(3, device="cuda") * x`` with ``x`` a CPU scalar: the graph computes on CUDA."""
    from fxwrap.api import _device_type_of
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.tensor(2.0)
    made = graph.call_function(torch.ones, (3,), {"device": "cuda"})
    made.meta["example_value"] = _fake_cuda(3)
    graph.output(made)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert _device_type_of([torch.tensor(2.0)], gm) == "cuda"
    assert _device_type_of([torch.tensor(2.0)]) == "cpu"


def test_compiled_autograd_backward_through_fxwrap_matches_eager():
    """The backward compiled by compiled autograd (its inputs one list) runs as an fxwrap
    program of the inputs' target and gives eager's gradients."""
    programs = compiled_autograd_backward("cpu", 8)
    assert programs and {p.target.name for p in programs} == {"cpu"}, programs


def test_meta_tensors_name_the_device_the_targets_and_the_way_out():
    compiled = torch.compile(_f, backend="fxwrap")
    with pytest.raises(Exception, match=r"no fxwrap target for device type 'meta'; registered targets \(device "
                                        r"type\): .*cpu \(cpu\).*meta tensors hold no data.*backend='eager'"):
        compiled(torch.empty(4, device="meta"))
    torch._dynamo.reset()
