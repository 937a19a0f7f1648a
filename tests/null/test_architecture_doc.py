"""docs/architecture.md is checked against the tree: its Wrapper IR table names every line
type, and every file or folder it names exists."""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import fxwrap
from fxwrap.ir.lines import Line

ROOT = Path(fxwrap.__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
# the modules that define Wrapper IR line types
LINE_MODULES = ("fxwrap.ir.lines", "fxwrap.ir.control_flow", "fxwrap.ir.collectives", "fxwrap.ir.user_kernels",
                "fxwrap.ir.partitions", "fxwrap.wrapper_ir.debug_lines")
# where a path the page names may be relative to
BASES = (ROOT, ROOT / "fxwrap", ROOT / "docs", ROOT / "fxwrap" / "targets", ROOT / "benchmarks")
# names the page writes that are not files of the tree
NOT_PATHS = {"file.py": "an Origin's `file.py:LINE`", "index.md": "a debug dump's index, written at run time"}


def line_types() -> list[str]:
    found = []
    for name in LINE_MODULES:
        module = importlib.import_module(name)
        found += [n for n, c in vars(module).items() if inspect.isclass(c) and issubclass(c, Line)
                  and c.__module__ == name and c is not Line and not n.startswith("_")]
    return found


def line_table(text: str) -> str:
    start = text.index("| line | meaning | FX form |")
    return text[start:text.index("\n\n", start)]


def test_the_line_table_names_every_line_type():
    table = line_table(DOC.read_text())
    rows = set(re.findall(r"^\| `(\w+)\(", table, flags=re.M))
    assert "ZeroFill" in line_types() and "PartitionBoundary" in line_types()
    missing = [t for t in line_types() if t not in rows]
    assert not missing, f"docs/architecture.md's line table lacks {missing}"
    unknown = sorted(rows - set(line_types()))
    assert not unknown, f"docs/architecture.md's line table names no line type of the code: {unknown}"


def _expand(token: str) -> list[str]:
    """``core/rules/{a,b}.py`` -> ``core/rules/a.py``, ``core/rules/b.py``; ``<t>`` -> ``*``."""
    token = re.sub(r"<\w+>", "*", token)
    m = re.search(r"\{([^{}]*)\}", token)
    if m is None:
        return [token]
    return [e for part in m.group(1).split(",") for e in _expand(token[:m.start()] + part + token[m.end():])]


def named_paths(text: str) -> list[str]:
    """Every file (``*.py``, ``*.md``, ``*.h``, ``*.sh``, ``*.toml``) and folder (``name/``) the
    page names, in code spans and code blocks alike."""
    tokens = re.findall(r"(?<![\w.$/<>{}-])([\w.<>{},*-]+(?:/[\w.<>{},*-]*)*\.(?:py|md|h|sh|toml)"
                        r"|[\w.-]+(?:/[\w.-]+)*/)(?![\w(])", text)
    return sorted({p for t in tokens for p in _expand(t) if not p.startswith(("http", "$"))})


def _exists(path: str) -> bool:
    if "/" not in path.rstrip("/"):  # a bare file name: somewhere in the tree
        return any(ROOT.glob(f"**/{path}")) or any((base / path).exists() for base in BASES)
    return any(any(base.glob(path.rstrip("/"))) for base in BASES)


def test_every_path_the_page_names_exists():
    paths = named_paths(DOC.read_text())
    assert "fxwrap/api.py" in paths and "fxwrap/core/rules/pooling.py" in paths and len(paths) > 50
    missing = [p for p in paths if p not in NOT_PATHS and not _exists(p)]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_path_check_catches_a_missing_file():
    assert named_paths("see `fxwrap/no_such_module.py` and core/nothing/") == ["core/nothing/",
                                                                               "fxwrap/no_such_module.py"]
    assert not _exists("fxwrap/no_such_module.py") and not _exists("core/nothing/")


def test_the_pipeline_docstrings_show_the_stages_and_passes_of_the_code():
    """``fxwrap/core/pipeline.py``'s docstring prints ``default_pipeline()`` and
    ``fxwrap/core/passes.py``'s the pass lists, as doctests: they fail when a stage or a pass
    is added, removed or renamed and the text is not."""
    import doctest

    from fxwrap.core import passes, pipeline
    from fxwrap.wrapper_ir.stages import default_pipeline

    stages = default_pipeline()
    names = [s.name for s in stages.stages] + stages.aten.names() + stages.wrapper.names()
    assert len(names) == 17 and all(n in pipeline.__doc__ for n in names)
    for module in (pipeline, passes):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert result.attempted >= 1 and result.failed == 0