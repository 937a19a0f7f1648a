"""Small models for the conformance kit: an MLP, a conv net with batch norm, a
transformer block.  Each is built with fresh random weights, with a function drawing a
fresh random input batch; sizes are small so every target (interpreters included)
runs them in a second or two."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class MLP(nn.Module):
    """Linear -> GELU -> Linear."""

    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 10):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out))

    def forward(self, x):
        return self.layers(x)


class ConvNet(nn.Module):
    """Two conv -> batch norm -> ReLU stages (max pooling between), global mean, a linear head."""

    def __init__(self, channels: int = 3, width: int = 8, classes: int = 10):
        super().__init__()
        self.stage1 = nn.Sequential(nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.stage2 = nn.Sequential(nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width),
                                    nn.ReLU())
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.stage2(self.pool(self.stage1(x)))
        return self.head(x.mean((2, 3)))


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: multi-head self-attention written out with softmax,
    then a GELU MLP, each with a residual connection."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        batch, seq, d = x.shape
        head_dim = d // self.heads
        qkv = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        weights = torch.softmax(q @ k.transpose(-1, -2) * head_dim ** -0.5, dim=-1)
        x = x + self.out((weights @ v).transpose(1, 2).reshape(batch, seq, d))
        return x + self.mlp(self.norm2(x))


@dataclass(frozen=True)
class ModelCase:
    """A model by name: ``build()`` makes it with fresh weights, ``batch()`` a fresh input."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[], torch.Tensor]


MODEL_CASES: dict[str, ModelCase] = {case.name: case for case in (
    ModelCase("mlp", MLP, lambda: torch.randn(16, 32)),
    ModelCase("conv_net", ConvNet, lambda: torch.randn(2, 3, 12, 12)),
    ModelCase("transformer_block", TransformerBlock, lambda: torch.randn(2, 8, 32)),
)}

# Matmuls and convolutions sum in a different order than eager's: float32 sums of
# ~100 terms differ by a few ulps, gradients (sums of sums) by a little more.
FORWARD_TOLERANCE = dict(rtol=1e-4, atol=1e-4)
GRADIENT_TOLERANCE = dict(rtol=1e-3, atol=1e-4)
