"""CI runs the README's two commands, character for character, in a fresh virtual environment."""
from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / ".ci" / "run"
SCRIPT = ROOT / ".ci" / "readme_commands.py"


def _readme_module():
    spec = importlib.util.spec_from_file_location("readme_commands", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ci_commands() -> list[str]:
    text = CI.read_text()
    found = []
    for name in ("DEMO_COMMAND", "TEST_COMMAND"):
        match = re.search(rf'^{name}="(.*)"$', text, flags=re.M)
        assert match, f".ci/run has no {name}=\"...\" line"
        found.append(match.group(1))
    return found


def test_ci_commands_are_the_readme_commands():
    readme = _readme_module().readme_commands((ROOT / "README.md").read_text())
    assert _ci_commands() == readme
    assert readme[0].endswith("python -m fxwrap demo")
    assert "python -m pytest" in readme[1]


def test_ci_runs_them_in_a_fresh_virtual_environment():
    text = CI.read_text()
    assert re.search(r'python -m venv "\$work/venv"', text)
    assert "mktemp -d" in text
    venv_at = text.index("python -m venv")
    assert text.index('eval "$DEMO_COMMAND"') > venv_at and text.index('eval "$TEST_COMMAND"') > venv_at
    assert text.index(".ci/readme_commands.py --check") < venv_at


def test_check_fails_when_the_readme_and_ci_differ():
    demo, tests = _ci_commands()
    ok = subprocess.run([sys.executable, str(SCRIPT), "--check", demo, tests], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    changed = tests.replace("-n 2", "-n 4")
    bad = subprocess.run([sys.executable, str(SCRIPT), "--check", demo, changed], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "CI's test command is not the README's" in bad.stderr


def test_readme_commands_need_only_python_and_pip():
    for command in _ci_commands():
        for step in command.split("&&"):
            words = shlex.split(step)
            assert words[:2] == ["python", "-m"], f"{step.strip()!r}: a fresh machine has python, not this"


def test_every_example_package_is_installed_and_tested():
    """Each installable example (``examples/*/pyproject.toml``) is installed and its tests run."""
    tests = _ci_commands()[1]
    examples = sorted(p.parent.name for p in (ROOT / "examples").glob("*/pyproject.toml"))
    assert examples, "no example package found"
    for name in examples:
        assert f"python -m pip install -e examples/{name} " in tests
        assert f" examples/{name}/tests" in tests
