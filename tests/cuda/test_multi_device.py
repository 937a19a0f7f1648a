"""Programs whose tensors live on a CUDA device other than the current one: kernels are
compiled for, loaded into and launched on the tensors' device, and the caller's current
device is left as it was.  Needs two CUDA devices (run on a two-GPU device machine)."""
from __future__ import annotations

import pytest
import torch

import fxwrap

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


def _f(x, w, b):
    h = torch.softmax(x @ w, dim=-1) * 2 + x.sum(0)
    return torch.nn.functional.layer_norm(h, (h.shape[-1],), b, None) + torch.tanh(h).mean()


@pytest.mark.parametrize("current", [0, 1])
@pytest.mark.parametrize("where", [1, 0])
def test_inference_on_a_device_that_is_not_current(where, current):
    dev = torch.device("cuda", where)
    x, w, b = torch.randn(96, 64, device=dev), torch.randn(64, 64, device=dev) / 8, torch.randn(64, device=dev)
    torch._dynamo.reset()
    programs = []
    with torch.cuda.device(current):
        fn = torch.compile(_f, backend=fxwrap.Backend("cuda", {"on_program": programs.append}))
        got = fn(x, w, b)
        again = fn(x * 2, w, b)
        assert torch.cuda.current_device() == current
    assert any(isinstance(n.target, fxwrap.Kernel) for p in programs for n in p.graph_module.graph.nodes)
    assert got.device == dev
    torch.testing.assert_close(got, _f(x, w, b), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(again, _f(x * 2, w, b), rtol=1e-4, atol=1e-4)


def test_training_on_the_second_device_while_the_first_is_current():
    dev = torch.device("cuda", 1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(dev)
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(dev)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(16, 32, device=dev)
    torch._dynamo.reset()
    with torch.cuda.device(0):
        compiled = torch.compile(model, backend=fxwrap.Backend("cuda"))
        compiled(x).square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
