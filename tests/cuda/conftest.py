"""pytest wiring for tests/cuda: the Triton emitter on a GPU, or under Triton's CPU
interpreter when there is none.

Without CUDA, ``TRITON_INTERPRET=1`` is set here, before anything imports triton,
and the tests compile for the ``triton-interpret`` target (CPU tensors).  With CUDA
they compile for ``cuda`` on CUDA tensors.  Without triton the folder is skipped.
"""
from __future__ import annotations

import os
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

import shared_helpers  # noqa: E402  (after TRITON_INTERPRET is set: it imports fxwrap)


fresh_state = pytest.fixture(autouse=True)(shared_helpers.fresh_state)
