"""pytest wiring for tests/cuda: the Triton emitter on a GPU, or under Triton's CPU
interpreter when there is none.

Without CUDA, ``TRITON_INTERPRET=1`` is set here, before anything imports triton,
and the tests compile for the ``triton-interpret`` target (CPU tensors).  With CUDA
they compile for ``cuda`` on CUDA tensors.  Without triton (or, with no GPU, numpy)
every module of the folder is reported as skipped, with the reason.
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


def _missing_dependency() -> str | None:
    """Why this folder cannot run here (a missing optional dependency), or None."""
    try:
        import triton  # noqa: F401
    except ImportError as error:
        return f"triton is not installed ({error}); pip install -e '.[triton]'"
    if not torch.cuda.is_available():
        try:
            import numpy  # noqa: F401
        except ImportError as error:
            return f"Triton's CPU interpreter needs numpy ({error}); pip install -e '.[triton]'"
    return None


MISSING = _missing_dependency()


class MissingDependencyModule(pytest.File):
    """Stands in for a test module of this folder when a dependency is missing: it is
    reported as skipped with the reason (``pytest -ra`` lists it), never left out silently."""

    def collect(self):
        pytest.skip(MISSING, allow_module_level=True)


if MISSING:
    def pytest_pycollect_makemodule(module_path, parent):
        return MissingDependencyModule.from_parent(parent, path=module_path)

import shared_helpers  # noqa: E402  (after TRITON_INTERPRET is set: it imports fxwrap)


fresh_state = pytest.fixture(autouse=True)(shared_helpers.fresh_state)
