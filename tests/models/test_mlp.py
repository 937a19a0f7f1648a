"""An MLP, forward and backward, against eager (both public entry points)."""
import pytest
import torch
from torch import nn

from models_helpers import DYNAMIC, ENTRIES, assert_same_training_step, compile_fxwrap, twin, zero_grads


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(24, 64), nn.GELU(), nn.Linear(64, 48), nn.ReLU(),
                         nn.Linear(48, 10), nn.Tanh())


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("entry", ENTRIES)
def test_mlp_forward_backward(entry, dynamic):
    model = mlp()
    ref = twin(model)
    compiled = compile_fxwrap(model, entry, dynamic)
    # Two batch sizes: with dynamic=True the second runs the same symbolic
    # programs at a size they were not traced at.
    for batch in (16, 7):
        zero_grads(model, ref)
        assert_same_training_step(model, ref, compiled, torch.randn(batch, 24))
    assert "forward" in compiled.kinds() and "backward" in compiled.kinds()
    if dynamic:
        assert compiled.kinds().count("forward") == 1, f"recompiled: {compiled.kinds()}"


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_mlp_inference_no_grad(dynamic):
    model = mlp()
    compiled = compile_fxwrap(model, "torch.compile", dynamic)
    for batch in (5, 12):
        x = torch.randn(batch, 24)
        with torch.no_grad():
            out = compiled(x)
        torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-5)
    assert compiled.kinds()[0] == "inference"
