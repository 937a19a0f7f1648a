"""pytest wiring for tests/cuda: the Triton emitter on a GPU, or under Triton's CPU
interpreter when there is none.

Without CUDA, ``TRITON_INTERPRET=1`` is set here, before anything imports triton,
and the tests compile for the ``triton-interpret`` target (CPU tensors).  With CUDA
they compile for ``cuda`` on CUDA tensors.  Without triton the folder is skipped.
"""
from __future__ import annotations

import os
import random
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton  # noqa: F401
except ImportError:  # pragma: no cover - depends on the machine
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True)
def fresh_state(request):
    """A fresh dynamo cache and a fresh random seed per test (shown on failure)."""
    import torch._dynamo
    torch._dynamo.reset()
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    random.seed(seed)
    print(f"seed {seed} for {request.node.nodeid}")
    yield
    torch._dynamo.reset()
