"""A missing optional dependency shows in pytest's summary as a skip with its reason."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tests_without_triton_are_reported_as_skipped_with_the_reason(tmp_path):
    hidden = tmp_path / "triton"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('triton hidden by a test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-ra",
                          "tests/cuda", "tests/null/test_readme_commands.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    modules = len(list((ROOT / "tests" / "cuda").glob("test_*.py")))
    assert f"{modules} skipped" in out, out
    assert "SKIPPED" in out and "triton is not installed (triton hidden by a test)" in out, out
    readme_tests = (ROOT / "tests" / "null" / "test_readme_commands.py").read_text().count("\ndef test_")
    assert f"{readme_tests} passed" in out and "error" not in out.lower(), out  # only test_readme_commands.py ran
