"""torch.cond and while_loop on a GPU: the branches and loop bodies are nested programs of
Triton kernels (launched by fxwrap's CUDA runner inside the higher-order op), eager's numbers
forward and backward.  The CPU-side checks of the same programs are tests/models/test_control_flow.py."""
import pytest
import torch
from torch._higher_order_ops.while_loop import while_loop

from fxwrap.runtime.kernel import Kernel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the lead's H200)")


def branchy(x, y):
    z = torch.cond(x.sum() > 0, lambda a, b: a.sin() * b, lambda a, b: (a.cos() + b).softmax(-1), (x, y))
    return z * 2 + y


def loop(x, w):
    def cond_fn(t, n):
        return n < 5

    def body_fn(t, n):
        return (t * w).sin() / (t.abs().sum() + 1), n + 1
    return while_loop(cond_fn, body_fn, (x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)))


def _subgraph_kernels(programs):
    return {name: [n.target for n in m.graph.nodes if isinstance(n.target, Kernel)]
            for p in programs for name, m in p.graph_module.named_modules()
            if name and isinstance(m, torch.fx.GraphModule)}


@pytest.mark.parametrize("dynamic", [False, True])
def test_cond_forward_backward_on_cuda(dynamic):
    programs = []
    fn = torch.compile(branchy, backend="fxwrap", dynamic=dynamic, options={"on_program": programs.append})
    for sign in (1.0, -1.0):
        x = ((torch.rand(64, 32, device="cuda") + 0.1) * sign).requires_grad_()
        y = torch.randn(64, 32, device="cuda", requires_grad=True)
        xr, yr = (t.detach().clone().requires_grad_() for t in (x, y))
        out, want = fn(x, y), branchy(xr, yr)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
        g = torch.randn_like(out)
        out.backward(g)
        want.backward(g)
        torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(y.grad, yr.grad, rtol=1e-4, atol=1e-5)
    found = _subgraph_kernels(programs)
    assert {"true_graph_0", "false_graph_0", "true_graph_1", "false_graph_1"} <= set(found)
    assert all(found[n] and all(k.target == "cuda" for k in found[n]) for n in found)


def test_while_loop_on_cuda():
    programs = []
    fn = torch.compile(loop, backend="fxwrap", options={"on_program": programs.append})
    for _ in range(2):
        x, w = torch.randn(256, device="cuda"), torch.randn(256, device="cuda")
        torch.testing.assert_close(fn(x, w), loop(x, w), rtol=1e-4, atol=1e-5)
    found = _subgraph_kernels(programs)
    assert found["while_loop_cond_graph_0"] and found["while_loop_body_graph_0"]
