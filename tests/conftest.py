"""Loaded before any test module: on a machine without CUDA, Triton runs in its CPU
interpreter for the whole session; the whole-program cache (``fxwrap.programs.program_cache``)
is off, so that every test compiles what it checks (``tests/artifacts`` turns it on
where it tests it).

Triton reads ``TRITON_INTERPRET`` when ``triton.language`` is first imported, and
importing torch's compile stack (which any test module does) may import it; so the
variable is set here, at the root, not in ``tests/cuda/conftest.py`` alone.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FXWRAP_PROGRAM_CACHE", "0")
# GEMM templates (fxwrap.core.templates) are chosen by timing under the default "auto":
# a test that counts kernels would depend on the machine's load.  Tests run with them
# off unless they ask (options={"templates": "auto" / "always"}: tests/cpu/test_templates.py).
os.environ.setdefault("FXWRAP_TEMPLATES", "off")
