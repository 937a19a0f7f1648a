"""A pre-norm transformer block, forward and backward: multi-head self-attention
(once through F.scaled_dot_product_attention, once written out as
softmax(q @ k^T / sqrt(d)) @ v), layer_norm, a GELU MLP and residuals."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models_helpers import DYNAMIC, assert_same_training_step, compile_fxwrap, twin, zero_grads


class Block(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, attention: str = "sdpa", causal: bool = False):
        super().__init__()
        self.heads, self.attention, self.causal = heads, attention, causal
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def attend(self, q, k, v):
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.causal:
            t = q.shape[-2]
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = self.attend(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.mlp(self.ln2(x))


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("attention,causal", [("sdpa", False), ("explicit", False), ("sdpa", True)])
def test_transformer_block(attention, causal, dynamic):
    model = Block(attention=attention, causal=causal)
    with torch.no_grad():  # LayerNorm affine parameters away from their 1/0 defaults
        for ln in (model.ln1, model.ln2):
            ln.weight.copy_(torch.rand_like(ln.weight) + 0.5)
            ln.bias.copy_(torch.randn_like(ln.bias))
    ref = twin(model)
    compiled = compile_fxwrap(model, "torch.compile", dynamic)
    for shape in ((2, 8, 32), (3, 5, 32)):
        zero_grads(model, ref)
        assert_same_training_step(model, ref, compiled, torch.randn(shape))
    assert "backward" in compiled.kinds()


def test_explicit_attention_matches_sdpa_eager():
    """The two attention formulations compute the same thing (guards the test itself)."""
    a, b = Block(attention="sdpa"), Block(attention="explicit")
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 6, 32)
    torch.testing.assert_close(a(x), b(x), rtol=1e-4, atol=1e-5)


class MHAModel(nn.Module):
    """nn.MultiheadAttention returning its output and its head-averaged weights."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        out, weights = self.mha(x, x, x, need_weights=True)
        return out + weights.sum(-1, keepdim=True)


@pytest.mark.parametrize("partition", ["save_all", "min_cut"])
@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_multihead_attention_saved_views(dynamic, partition):
    """MultiheadAttention's forward saves q, k, v as views (with offsets) of one buffer;
    fxwrap's fused kernels write them as buffers of their own, which must keep the traced
    strides: the backward program reads them through exactly those strides.  Under the
    min-cut partition a view of such a buffer is taken in the forward program itself, at
    the traced offset minus the buffer's own."""
    model = MHAModel()
    ref = twin(model)
    compiled = compile_fxwrap(model, "torch.compile", dynamic, partition=partition)
    for shape in ((2, 5, 32), (3, 7, 32)):
        zero_grads(model, ref)
        assert_same_training_step(model, ref, compiled, torch.randn(shape))
    # every tensor the forward saves has the layout the backward was compiled to read: the
    # forward returns (output, *saved tensors, *saved sizes), the backward takes the saved
    # tensors in that order, then the tangent (its sizes where AOTAutograd puts them)
    forward = next(p for p in compiled.programs if p.kind == "forward")
    backward = next(p for p in compiled.programs if p.kind == "backward")

    def tensors(nodes):
        return [n for n in nodes if isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)]
    outputs = tensors(forward.graph_module.graph.find_nodes(op="output")[0].args[0])
    placeholders = tensors(backward.graph_module.graph.find_nodes(op="placeholder"))
    assert len(outputs) == len(placeholders)
    saved = list(zip(outputs[1:], placeholders[:-1]))
    assert len(saved) >= 3  # q, k and v at least
    compared = 0
    for out, inp in saved:
        assert isinstance(out, torch.fx.Node), out
        got, wanted = out.meta["val"].stride(), inp.meta["val"].stride()
        if all(isinstance(s, int) for s in (*got, *wanted)):  # symbolic ones: the backward's guard checks them
            assert got == wanted, (out.name, inp.name)
            compared += 1
    assert compared >= (len(saved) if not dynamic else 3)
