"""pytest wiring for tests/mps: the Metal target (``mps_shim``) on CPU tensors.

The lowering tests of ``tests/cpu/test_lowerings.py`` are re-run here through the
Metal target (see ``test_mps_lowerings.py``); their float64 cases are skipped, with
the reason, *here only*, because Metal has no double: float64 runs as ATen extern
calls, which ``test_mps_fallback.py`` checks (numbers, no kernels, the log line).
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
for sub in ("cpu", "models"):
    path = os.path.join(TESTS, sub)
    if path not in sys.path:
        sys.path.append(path)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


NO_DOUBLE = pytest.mark.skip(reason="Metal has no double: float64 runs as ATen externs on the Metal "
                                     "target, which tests/mps/test_mps_fallback.py checks")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if (str(item.path).startswith(HERE + os.sep) and item.name.startswith("test_lowering_")
                and hasattr(item, "callspec")
                and any(v is torch.float64 for v in item.callspec.params.values())):
            item.add_marker(NO_DOUBLE)
