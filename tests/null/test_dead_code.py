"""Code nothing calls and texts that point nowhere stay out (issue 29): the template choice's
the old ``choose`` (a live ``winner`` took a new name), ``Group.accepts``, the Triton launcher's ``host_function``; error messages that
recommend a ``DefineSymbol`` line (nothing creates one: a kernel the emitter cannot render runs
as ATen extern calls, which is what the messages say now); ``.md`` files cited in the sources
that do not exist in the repository (the design notes live outside it)."""
import ast
import re
from pathlib import Path

import fxwrap

PACKAGE = Path(fxwrap.__file__).parent
ROOT = PACKAGE.parent
# file names the debug dump writes, and a benchmark's output example: not citations
OUTPUT_NAMES = {"schedule.md", "index.md", "out.md"}


def _defined(path: Path) -> set[str]:
    """Qualified names (``Group.accepts``) of the functions and methods ``path`` defines."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
    return names


def test_removed_dead_code_stays_removed():
    dead = {"wrapper_ir/template_choice.py": "choose", "core/scheduler.py": "Group.accepts",
            "targets/cuda_triton/launcher.py": "host_function"}
    back = [f"{file}: {name}" for file, name in dead.items() if name in _defined(PACKAGE / file)]
    assert not back, f"dead code is back: {back}"


def test_no_message_recommends_a_define_symbol_line():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "DefineSymbol" in node.value \
                    and re.search(r"precompute|use a|add a", node.value, re.IGNORECASE):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.strip()[:80]}")
    assert not found, "messages recommending DefineSymbol, which nothing creates:\n  " + "\n  ".join(found)


def test_every_cited_markdown_file_exists():
    missing = []
    for folder in ("fxwrap", "tests", "examples", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for cited in sorted(set(re.findall(r"[A-Za-z0-9_./-]+\.md\b", path.read_text()))):
                name = cited.lstrip("/")
                if Path(name).name in OUTPUT_NAMES:
                    continue
                if not any((base / name).exists() for base in (ROOT, ROOT / "docs", path.parent)):
                    missing.append(f"{path.relative_to(ROOT)} cites {cited}")
    assert not missing, "\n".join(missing)
