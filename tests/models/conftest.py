"""pytest wiring for tests/models: fresh dynamo state and seed per test, the slow
OpInfo sweep opt-in, and the sweep's summary line in the terminal report.

The full OpInfo sweep (``@pytest.mark.slow``) is deselected unless asked for:
``pytest -m slow tests/models`` or ``FXWRAP_SLOW=1 pytest tests/models``.
"""
from __future__ import annotations

import os
import random

import pytest
import torch
import torch._dynamo

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def fresh_state(request):
    """A fresh dynamo cache and a fresh random seed per test (shown on failure)."""
    torch._dynamo.reset()
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    random.seed(seed)
    print(f"seed {seed} for {request.node.nodeid}")
    yield
    torch._dynamo.reset()


def pytest_collection_modifyitems(config, items):
    if config.getoption("markexpr") or os.environ.get("FXWRAP_SLOW"):
        return
    slow = [i for i in items if i.get_closest_marker("slow") and str(i.path).startswith(HERE)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i not in slow]


def pytest_terminal_summary(terminalreporter):
    lines = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for key, value in getattr(report, "user_properties", ()):
                if key == "opinfo_summary":
                    lines.append(f"{report.nodeid}: {value}")
    if lines:
        terminalreporter.section("fxwrap OpInfo sweep")
        for line in sorted(lines):
            terminalreporter.write_line(line)
