"""Imports go one way down the layers (docs/architecture.md, "Layers").

Every ``import`` in the package is read from the source (module level and inside
functions alike; only ``if TYPE_CHECKING:`` blocks are exempt, since they never run) and
checked against the layer table below: a module may import its own layer and the
layers beneath it, never one above.  A target may import the shared target modules but
never another target's modules.  ``import fxwrap.runtime`` (what a saved program needs)
loads no compiler module and no dynamo.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


import fxwrap

PACKAGE = Path(fxwrap.__file__).parent

# lowest first; a module belongs to the last layer with a matching prefix
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("runtime", ("fxwrap.runtime",)),
    ("logs", ("fxwrap.core.logs", "fxwrap.core.progress")),
    ("symbolic", ("fxwrap.ir", "fxwrap.ir.symbolic")),
    ("loop IR", ("fxwrap.ir.loops", "fxwrap.ir.intrinsics", "fxwrap.ir.combo")),
    ("lines", ("fxwrap.ir.lines", "fxwrap.ir.control_flow", "fxwrap.ir.user_kernels",
               "fxwrap.ir.collectives", "fxwrap.ir.partitions")),
    ("lowering", ("fxwrap.core", "fxwrap.core.capture", "fxwrap.core.extern", "fxwrap.core.layout",
                  "fxwrap.core.lowering", "fxwrap.core.numerics", "fxwrap.core.rules")),
    ("scheduling and memory", ("fxwrap.core.scheduler", "fxwrap.core.combo", "fxwrap.core.memory",
                               "fxwrap.core.overlap")),
    ("pass lists", ("fxwrap.core.passes", "fxwrap.core.pipeline")),
    ("build", ("fxwrap.wrapper_ir", "fxwrap.wrapper_ir.build", "fxwrap.wrapper_ir.built", "fxwrap.wrapper_ir.lowered",
               "fxwrap.wrapper_ir.lowerer", "fxwrap.wrapper_ir.journal", "fxwrap.wrapper_ir.layouts",
               "fxwrap.wrapper_ir.nesting", "fxwrap.wrapper_ir.origins", "fxwrap.wrapper_ir.rule_lowering",
               "fxwrap.wrapper_ir.realization", "fxwrap.wrapper_ir.template_recognition", "fxwrap.wrapper_ir.render",
               "fxwrap.wrapper_ir.template_choice",
               "fxwrap.wrapper_ir.guards", "fxwrap.wrapper_ir.build_control_flow",
               "fxwrap.wrapper_ir.build_user_kernels", "fxwrap.wrapper_ir.partitions")),
    ("fx", ("fxwrap.wrapper_ir.fx", "fxwrap.wrapper_ir.printer")),
    ("stages", ("fxwrap.wrapper_ir.stages",)),
    ("targets", ("fxwrap.targets",)),
    ("plugins", ("fxwrap.plugins",)),
    # the program's life after compilation: its runner, files, caches, precompile, debug dump
    ("programs", ("fxwrap.programs",)),
    ("api", ("fxwrap.api", "fxwrap.profiling", "fxwrap")),
    ("testing", ("fxwrap.testing",)),
    # the command line runs everything, the fuzzer of fxwrap.testing included
    ("command line", ("fxwrap.cli", "fxwrap.__main__")),
]
# modules every target may import; anything else under fxwrap.targets belongs to one target
SHARED_TARGET_MODULES = ("fxwrap.targets", "fxwrap.targets.base", "fxwrap.targets.cstyle", "fxwrap.targets.marker",
                         "fxwrap.targets.c_helpers", "fxwrap.targets.cstyle_combo",
                         "fxwrap.targets.index_printer", "fxwrap.targets.values", "fxwrap.targets.host")

# modules that must never load with the runtime alone
COMPILER_MODULES = ("fxwrap.core", "fxwrap.ir", "fxwrap.wrapper_ir", "fxwrap.plugins", "fxwrap.targets", "fxwrap.api",
                    "fxwrap.programs.arguments", "torch._dynamo", "torch._functorch.aot_autograd",
                    "torch._inductor", "sympy")


def _prefixed(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for rank, (_name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if _prefixed(module, p) and len(p) > best_len:
                best, best_len = rank, len(p)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best


@dataclass(frozen=True)
class Import:
    source: str   # importing module
    target: str   # imported fxwrap module
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (PACKAGE.parent / rel.with_suffix(".py")).exists() or (PACKAGE.parent / rel / "__init__.py").exists()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports_of(path: Path) -> list[Import]:
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_nodes(tree)
    found: list[Import] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [Import(name, a.name, node.lineno) for a in node.names if _prefixed(a.name, "fxwrap")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not _prefixed(module, "fxwrap"):
                continue
            for alias in node.names:  # ``from fxwrap.x import y`` may name a module y
                sub = f"{module}.{alias.name}"
                found.append(Import(name, sub if _is_module(sub) else module, node.lineno))
    return found


def all_imports() -> list[Import]:
    return [imp for path in sorted(PACKAGE.rglob("*.py")) for imp in imports_of(path)]


def _target_of(module: str) -> str | None:
    """``fxwrap.targets.cpu_cpp.emitter`` -> ``cpu_cpp``; shared target modules -> None."""
    if not _prefixed(module, "fxwrap.targets") or any(
            module == shared or (shared.count(".") > 1 and _prefixed(module, shared))
            for shared in SHARED_TARGET_MODULES):
        return None
    return module.split(".")[2]


def layering_violations(imports: list[Import]) -> list[str]:
    bad = []
    for imp in imports:
        src, dst = layer_of(imp.source), layer_of(imp.target)
        if dst > src:
            bad.append(f"{imp} (layer {LAYERS[src][0]!r} may not import layer {LAYERS[dst][0]!r})")
        mine, theirs = _target_of(imp.source), _target_of(imp.target)
        if theirs is not None and _prefixed(imp.source, "fxwrap.targets") and mine != theirs:
            bad.append(f"{imp} (a target imports another target's module; share it through "
                       f"{', '.join(SHARED_TARGET_MODULES[1:])})")
    return bad


def test_every_module_is_in_a_layer():
    for path in PACKAGE.rglob("*.py"):
        layer_of(_module_name(path))


def test_imports_go_one_way_down_the_layers():
    bad = layering_violations(all_imports())
    assert not bad, "imports against the layer order:\n  " + "\n  ".join(bad)


def test_the_check_sees_function_local_imports_and_skips_type_checking_blocks(tmp_path, monkeypatch):
    """The checker itself: an upward import inside a function is caught; one under
    ``if TYPE_CHECKING:`` is not (it never runs)."""
    fake = tmp_path / "fxwrap"
    (fake / "runtime").mkdir(parents=True)
    (fake / "core").mkdir()
    for init in (fake / "__init__.py", fake / "runtime" / "__init__.py", fake / "core" / "__init__.py"):
        init.write_text("")
    (fake / "core" / "scheduler.py").write_text("")
    (fake / "runtime" / "kernel.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from fxwrap.core import scheduler\n"
        "def f():\n    from fxwrap.core import scheduler\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    found = imports_of(fake / "runtime" / "kernel.py")
    assert [(i.target, i.line) for i in found] == [("fxwrap.core.scheduler", 5)]
    assert layering_violations(found) == [
        "fxwrap.runtime.kernel:5 imports fxwrap.core.scheduler "
        "(layer 'runtime' may not import layer 'scheduling and memory')"]


def test_a_target_may_not_import_another_targets_module():
    found = [Import("fxwrap.targets.mps_metal.reduction", "fxwrap.targets.cpu_cpp.emitter", 1),
             Import("fxwrap.targets.mps_metal.reduction", "fxwrap.targets.cstyle", 2)]
    bad = layering_violations(found)
    assert len(bad) == 1 and "another target's module" in bad[0] and ":1 " in bad[0]


def test_importing_the_runtime_loads_no_compiler_module():
    code = ("import sys, fxwrap.runtime\n"
            "print('\\n'.join(sorted(m for m in sys.modules)))\n")
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    loaded = out.stdout.split()
    assert "fxwrap.runtime.kernel" in loaded
    compiler = [m for m in loaded if any(_prefixed(m, c) for c in COMPILER_MODULES)]
    assert not compiler, f"import fxwrap.runtime loaded compiler modules: {compiler}"


def test_import_fxwrap_is_lazy_and_every_public_name_resolves():
    """``import fxwrap`` loads no submodule but ``fxwrap.registration`` (standard library only: it
    registers ``backend="fxwrap"`` race-free); each name of ``__all__`` loads its own on use."""
    code = ("import sys, fxwrap\n"
            "print(' '.join(m for m in sys.modules if m.startswith('fxwrap.')))\n"
            "[getattr(fxwrap, n) for n in fxwrap.__all__]\n"
            "print(fxwrap.lower.__module__, fxwrap.Kernel.__module__, fxwrap.lines.__name__)\n")
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    loaded_by_import, resolved = out.stdout.splitlines()
    assert loaded_by_import == "fxwrap.registration"
    assert resolved == "fxwrap.api fxwrap.runtime.kernel fxwrap.ir.lines"


# the folders, lowest first: a module in one may import its own folder and those beneath it.
# No exception: the hook-implementation marker the targets use is ``fxwrap.targets.marker``.
FOLDERS = ("fxwrap.runtime", "fxwrap.ir", "fxwrap.core", "fxwrap.wrapper_ir", "fxwrap.targets", "fxwrap.plugins",
           "fxwrap.programs", "fxwrap")


def folder_of(module: str) -> int:
    return max((rank for rank, f in enumerate(FOLDERS) if _prefixed(module, f)),
               key=lambda rank: len(FOLDERS[rank]))


def test_folders_are_the_layers():
    """``core/`` never imports ``wrapper_ir/``, ``ir/`` never imports ``core/``: the folder
    order is the layer order, not only the module table above."""
    bad = [str(i) for i in all_imports()
           if not i.source.startswith("fxwrap.testing") and folder_of(i.target) > folder_of(i.source)]
    assert not bad, "imports up the folders:\n  " + "\n  ".join(bad)


def test_the_folder_check_catches_core_importing_wrapper_ir():
    assert folder_of("fxwrap.wrapper_ir.lines_x") > folder_of("fxwrap.core.lowering")
    assert folder_of("fxwrap.ir.lines") < folder_of("fxwrap.core.lowering")
    assert folder_of("fxwrap.targets.marker") < folder_of("fxwrap.plugins.hookspecs")
    assert folder_of("fxwrap.targets.cstyle") < folder_of("fxwrap.plugins.manager")


def test_targets_import_nothing_of_plugins_and_hookimpl_is_one_object():
    """The built-in targets mark their hooks with ``fxwrap.targets.marker.hookimpl``, which
    ``fxwrap.hookimpl`` and ``fxwrap.plugins.hookspecs.hookimpl`` are (one object: a plugin may
    import it from any of the three)."""
    up = [str(i) for i in all_imports() if _prefixed(i.source, "fxwrap.targets") and _prefixed(i.target, "fxwrap.plugins")]
    assert not up, "targets importing plugins:\n  " + "\n  ".join(up)
    from fxwrap.plugins import hookspecs
    from fxwrap.targets import marker
    assert fxwrap.hookimpl is marker.hookimpl is hookspecs.hookimpl


def import_cycles(imports: list[Import]) -> list[list[str]]:
    """Every set of modules that import one another, directly or around a circle (the
    strongly connected components of the import graph with more than one module), each
    sorted; function-local imports count (they are an import all the same)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.source != imp.target:
            graph.setdefault(imp.source, set()).add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(cycles)


def test_no_two_modules_import_each_other():
    """No import circle, function-local imports included (``api`` <-> ``program_cache``
    and ``plugins.manager`` <-> ``plugins.session`` were two: the program cache builds a
    ``Program`` from ``fxwrap.programs.program``, the session is handed ``PluginFacts``)."""
    cycles = import_cycles(all_imports())
    assert not cycles, "modules importing each other:\n  " + "\n  ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_function_local_circle():
    found = [Import("fxwrap.api", "fxwrap.programs.program_cache", 30),
             Import("fxwrap.programs.program_cache", "fxwrap.api", 235),  # inside a function
             Import("fxwrap.a", "fxwrap.b", 1), Import("fxwrap.b", "fxwrap.c", 1), Import("fxwrap.c", "fxwrap.a", 1),
             Import("fxwrap.c", "fxwrap.d", 1)]
    assert import_cycles(found) == [["fxwrap.a", "fxwrap.b", "fxwrap.c"], ["fxwrap.api", "fxwrap.programs.program_cache"]]
