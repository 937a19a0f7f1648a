"""Loaded before any test module: on a machine without CUDA, Triton runs in its CPU
interpreter for the whole session.

Triton reads ``TRITON_INTERPRET`` when ``triton.language`` is first imported, and
importing torch's compile stack (which any test module does) may import it; so the
variable is set here, at the root, not in ``tests/cuda/conftest.py`` alone.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
