"""Every ```python block of README.md and docs/*.md runs (issue 37: a docs snippet raised
``NameError``), so a listing that shows the API cannot rot.

A document's blocks run in order in one namespace, after ``PRELUDE`` (the names the docs take
as given: ``model``, ``x``, ``w``...), in a fresh folder (what they save stays there).  A block
that cannot run on a machine with only Python and a C++ compiler says so on the line above
its fence, with the reason, which the test reports as a skip::

    <!-- snippet: not run: needs a CUDA device -->

A block whose first line names a file of the repository (``# examples/fxwrap-c99/...py``)
is an excerpt of it: each of its lines must appear in that file, in order (the file itself
runs in its own tests).  A block printed as a listing of output or of generated code, not
as code to run, is fenced as ```text, not ```python.
"""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [p for p in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))) if "```python" in p.read_text()]
NOT_RUN = re.compile(r"<!--\s*snippet:\s*not run:\s*(.+?)\s*-->")

PRELUDE = """
import torch, fxwrap
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
x = torch.randn(8, 16)
w = torch.randn(16, 4)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))


def fn(a, b):
    return torch.relu(a @ b) * 2


example_inputs = (x, w)
new_inputs = (torch.randn(8, 16), torch.randn(16, 4))
args = example_inputs
program = fxwrap.lower(fn, *args)
compiled = torch.compile(model, backend="fxwrap")
"""


def blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, code, why not run)`` of each python block of ``path``."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            skip = NOT_RUN.search(above)
            found.append((start + 1, "\n".join(lines[start:end]), skip.group(1) if skip else None))
            i = end
        i += 1
    return found


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_every_python_block_of_the_document_runs(path, tmp_path, monkeypatch):
    found = blocks(path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")  # the documented default (tests/conftest.py turns it off)
    module = types.ModuleType(f"fxwrap_docs_{path.stem.replace('-', '_')}")  # a dataclass looks its module up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    exec(compile(PRELUDE, "<prelude>", "exec"), namespace)
    skipped = []
    for line, code, why in found:
        if why is not None:
            skipped.append(f"{path.name}:{line}: {why}")
            continue
        excerpt_of = _excerpt_file(code)
        if excerpt_of is not None:
            _check_excerpt(code, excerpt_of, f"{path.name}:{line}")
            continue
        try:
            exec(compile(code, f"{path.name}:{line}", "exec"), namespace)
        except Exception as exc:  # noqa: BLE001  (the failure, with where it is)
            raise AssertionError(f"the python block at {path.relative_to(ROOT)}:{line} raised "
                                 f"{type(exc).__name__}: {exc}") from exc
    if skipped and len(skipped) == len(found):
        pytest.skip("; ".join(skipped))


def _excerpt_file(code: str) -> Path | None:
    first = code.splitlines()[0].strip() if code.strip() else ""
    if not first.startswith("# "):
        return None
    candidate = ROOT / first[2:].split()[0]
    return candidate if candidate.is_file() else None


def _check_excerpt(code: str, source: Path, where: str) -> None:
    """Each non-blank line of the excerpt (its first, the file's name, aside) is a line of
    ``source``, in the same order (comments after ``#`` may be the doc's own)."""
    text = [line.strip() for line in source.read_text().splitlines()]
    at = 0
    for line in code.splitlines()[1:]:
        wanted = line.split("  #")[0].strip()
        if not wanted or wanted == "...":
            continue
        try:
            at = next(i for i in range(at, len(text)) if text[i].startswith(wanted)) + 1
        except StopIteration:
            raise AssertionError(f"the excerpt at {where} of {source.relative_to(ROOT)} has a line the file does "
                                 f"not (in this order): {wanted!r}") from None
