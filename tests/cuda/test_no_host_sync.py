"""A compiled model's per-call path never synchronizes the host with the GPU.

Eager and Inductor check embedding/gather indices on the device; a host-side check
(``int()`` of a CUDA tensor) would stall the host on every call.  Each model runs once
to compile, then again under ``torch.cuda.set_sync_debug_mode("error")``, which raises
on any synchronizing call, and its numbers are compared with eager's.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from triton_helpers import compiled

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs exist only with a GPU")


class TinyDecoder(nn.Module):
    """Embedding, causal SDPA, layer norm, GELU MLP, cross-entropy: the lookups and
    reductions a language model has."""

    def __init__(self, vocab=97, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(64, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens, targets):
        b, t = tokens.shape
        x = self.embed(tokens) + self.pos(torch.arange(t, device=tokens.device))
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.proj(a)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        logits = self.head(x)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten()), logits


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())

    def forward(self, x):
        return self.body(x).mean((2, 3))


def _decoder_inputs():
    tokens = torch.randint(0, 97, (4, 32), device="cuda")
    return tokens, torch.randint(0, 97, (4, 32), device="cuda")


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_decoder_runs_without_host_sync(training, dynamic):
    torch.manual_seed(0)
    model = TinyDecoder().cuda()
    ref = copy.deepcopy(model)
    f, programs = compiled(model, dynamic)
    tokens, targets = _decoder_inputs()
    with torch.set_grad_enabled(training):
        f(tokens, targets)  # compile (may synchronize: autotuning, loading)
        torch.cuda.synchronize()
        tokens, targets = _decoder_inputs()
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss, logits = f(tokens, targets)
            if training:
                loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        want_loss, want_logits = ref(tokens, targets)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-4)
    if training:
        want_loss.backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    assert programs


def test_conv_net_inference_runs_without_host_sync():
    torch.manual_seed(0)
    model = ConvBN().cuda().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    f, programs = compiled(model, False)
    with torch.no_grad():
        f(torch.randn(2, 3, 16, 16, device="cuda"))
        torch.cuda.synchronize()
        x = torch.randn(2, 3, 16, 16, device="cuda")
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = f(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    assert programs
