"""pytest wiring for tests/models: fresh dynamo state and seed per test, the slow
OpInfo sweep opt-in, and the sweep's summary line in the terminal report.

The full OpInfo sweep (``@pytest.mark.slow``) is skipped, with that reason, unless asked for:
``pytest -m slow tests/models`` or ``FXWRAP_SLOW=1 pytest tests/models``.
"""
from __future__ import annotations

import os

import pytest

import shared_helpers

HERE = os.path.dirname(os.path.abspath(__file__))


fresh_state = pytest.fixture(autouse=True)(shared_helpers.fresh_state)


SLOW = pytest.mark.skip(reason="slow sweep: run it with `pytest -m slow tests/models` or FXWRAP_SLOW=1")


def pytest_collection_modifyitems(config, items):
    if config.getoption("markexpr") or os.environ.get("FXWRAP_SLOW"):
        return
    for item in items:
        if item.get_closest_marker("slow") and str(item.path).startswith(HERE):
            item.add_marker(SLOW)


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
