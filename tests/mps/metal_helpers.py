"""Helpers for the Metal-target tests: load the CPU lowering tests against ``mps_shim``,
find kernels of compiled programs."""
from __future__ import annotations

import importlib.util
import os

from shared_helpers import kernels  # noqa: F401

TARGET = "mps_shim"
OPTIONS = {"target": "mps", "execute": "shim"}
_CPU_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu",
                          "test_lowerings.py")


def lowering_tests_module():
    """``tests/cpu/test_lowerings.py`` as a fresh module whose ``TARGET`` is ``mps_shim``.

    Its functions read the module global ``TARGET`` when they compile, so every test
    of that file runs unchanged through the Metal target.
    """
    spec = importlib.util.spec_from_file_location("mps_shim_lowerings", _CPU_TESTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.TARGET = TARGET
    return module
