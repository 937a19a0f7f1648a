"""A failing fuzz program as one standalone Python file.

The file imports torch and fxwrap only: it holds the harness (``fxwrap.testing.fuzz.harness``,
embedded as source), the program and its input specs, and a main that runs the check::

    $ python fuzz_cpu_seed_17.py
    AssertionError: mismatch on target 'cpu' (seed 17): output 0 (torch.float32, shape (4,)): ...

It exits non-zero while the bug is there and prints ``pass`` once it is fixed, so it turns
into a regression test as it is (``runpy.run_path`` it, or copy the program into a test).
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path

from fxwrap.testing.fuzz import harness

MAIN = '''

TARGET = {target!r}

if __name__ == "__main__":
    status, message = check(globals(), TARGET)
    assert status == "pass", f"{{status}} on target {{TARGET!r}} (seed {{SEED}}): {{message}}"
    print("pass")
'''


def harness_source() -> str:
    """The harness module's code, without its ``from __future__`` line (a reproducer's own
    first statement is its docstring)."""
    lines = inspect.getsource(harness).splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("from __future__"))


def reproducer_source(program: str, target: str, status: str, message: str) -> str:
    quotes = '"' * 3
    found = message.replace("\\", "/").replace(quotes, "'''")[:1500]
    header = (f'{quotes}fxwrap fuzz reproducer: target {target!r}, {status}.\n\n{found}\n\n'
              'Run it: `python this_file.py`; it fails while the bug is there, prints "pass" once fixed.\n"""\n')
    return f"{header}{harness_source()}\n\n# ---- the program ----\n{program}{MAIN.format(target=target)}"


def write_reproducer(directory: str | os.PathLike, program: str, seed: int, target: str, status: str,
                     message: str) -> Path:
    """Write ``fuzz_<target>_seed_<seed>.py`` under ``directory``; returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"fuzz_{target.replace('-', '_')}_seed_{seed}.py"
    path.write_text(reproducer_source(program, target, status, message))
    return path
