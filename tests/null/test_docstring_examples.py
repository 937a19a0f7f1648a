"""Docstrings with code in them are run: every module of the package whose docstrings hold
``>>>`` examples goes through ``doctest`` (the names ``torch``, ``fxwrap`` and ``aten`` are
given; ``...`` matches anything, whitespace runs are equal).  A snippet that only shows a
shape of code (a user's ``model``, a file it writes) is a plain ``::`` block, not ``>>>``."""
from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest
import torch

import fxwrap

PACKAGE = Path(fxwrap.__file__).resolve().parent
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def modules_with_examples() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" in path.read_text():
            parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append(".".join(parts))
    return found


def run_examples(module) -> doctest.TestResults:
    extraglobs = {"torch": torch, "fxwrap": fxwrap, "aten": torch.ops.aten}
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=FLAGS)
    for test in finder.find(module, module.__name__, globs=vars(module).copy(), extraglobs=extraglobs):
        runner.run(test)
    return runner.summarize(verbose=False)


def test_the_examples_are_found():
    assert "fxwrap.runtime.launch" in modules_with_examples()


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    result = run_examples(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed (printed above)"
