"""Higher-order ops: torch.cond's branches are subgraphs the program passes to the op."""
import pickle

import pytest
import torch

import fxwrap
from models_helpers import DYNAMIC, compile_fxwrap


def branchy(x, y):
    z = torch.cond(x.sum() > 0, lambda a, b: a.sin() * b, lambda a, b: a.cos() + b, (x, y))
    return z * 2 + y


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_cond_forward_backward(dynamic):
    compiled = compile_fxwrap(branchy, "torch.compile", dynamic)
    for shape in ((4, 3), (5, 2)):
        for sign in (1.0, -1.0):  # both branches
            x = (torch.rand(shape) + 0.1) * sign
            y = torch.randn(shape)
            xa, ya, xb, yb = (t.clone().requires_grad_() for t in (x, y, x, y))
            out, expected = compiled(xa, ya), branchy(xb, yb)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
            grad = torch.randn_like(expected)
            out.backward(grad)
            expected.backward(grad)
            torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ya.grad, yb.grad, rtol=1e-5, atol=1e-5)
    assert "backward" in compiled.kinds()


def test_cond_program_pickles():
    program = fxwrap.lower(branchy, torch.randn(4, 3), torch.randn(4, 3))
    assert any(n.op == "get_attr" for n in program.graph_module.graph.nodes)  # the branches
    gm = pickle.loads(pickle.dumps(program.graph_module))
    for sign in (1.0, -1.0):
        x, y = (torch.rand(4, 3) + 0.1) * sign, torch.randn(4, 3)
        torch.testing.assert_close(gm(x, y)[0], branchy(x, y), rtol=1e-5, atol=1e-5)
