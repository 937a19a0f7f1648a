"""The MLP and the transformer block of tests/models, forward and backward, on the
Metal target through the shim (``options={"target": "mps", "execute": "shim"}``)."""
from __future__ import annotations

import pytest
import torch

from metal_helpers import OPTIONS, kernels
from models_helpers import DYNAMIC, assert_same_training_step, compile_fxwrap, twin, zero_grads
from test_mlp import mlp
from test_transformer import Block


def train_twice(model, compiled, shapes):
    ref = twin(model)
    for shape in shapes:
        zero_grads(model, ref)
        assert_same_training_step(model, ref, compiled, torch.randn(shape))
    assert "forward" in compiled.kinds() and "backward" in compiled.kinds()
    assert all(p.target.name == "mps_shim" for p in compiled.programs)
    ks = kernels(compiled.programs)
    assert any(k.launch.kind == "reduction" for k in ks)
    assert all(k.target == "mps_shim" and k.source.count("kernel void") == 1 for k in ks)


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_mlp(dynamic):
    model = mlp()
    train_twice(model, compile_fxwrap(model, "torch.compile", dynamic, **OPTIONS), [(16, 24), (7, 24)])


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
def test_transformer_block(attention, dynamic):
    model = Block(attention=attention)
    with torch.no_grad():
        for ln in (model.ln1, model.ln2):
            ln.weight.copy_(torch.rand_like(ln.weight) + 0.5)
            ln.bias.copy_(torch.randn_like(ln.bias))
    train_twice(model, compile_fxwrap(model, "torch.compile", dynamic, **OPTIONS), [(2, 8, 32), (3, 5, 32)])
