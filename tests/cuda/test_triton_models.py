"""Model-level checks through the Triton emitter: the transformer block of tests/models
(attention written out and through SDPA, layer_norm, GELU MLP), forward and backward,
static and dynamic, against eager on the same device."""
import copy
import os
import sys

import pytest
import torch

from triton_helpers import DEVICE, compiled, kernels

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
from test_transformer import Block  # noqa: E402


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
def test_transformer_block_training(attention, dynamic):
    torch._dynamo.reset()
    model = Block(dim=32, heads=4, attention=attention).to(DEVICE)
    with torch.no_grad():
        for ln in (model.ln1, model.ln2):
            ln.weight.copy_(torch.rand_like(ln.weight) + 0.5)
            ln.bias.copy_(torch.randn_like(ln.bias))
    ref = copy.deepcopy(model)
    f, programs = compiled(model, dynamic)
    for shape in ((2, 8, 32), (3, 5, 32)):
        x = torch.randn(shape, device=DEVICE)
        out, want = f(x), ref(x)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        g = torch.randn_like(want)
        out.backward(g)
        want.backward(g)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
            p.grad = q.grad = None
    assert {"forward", "backward"} <= {p.kind for p in programs}
    assert len(kernels(programs)) >= 4  # layer norms, softmax/GELU epilogues, residual adds
