"""Contracts read as declared.  A Wrapper-IR line reaches the printer and the FX converter through the Protocols of
``fxwrap.ir.line_hosts`` only: every member a line calls is declared there, and both
classes implement every declared member (issue 40: ``ir/lines.py`` called 15 methods of the
converter and 7 of the printer through no declared contract)."""
from __future__ import annotations

import ast
import inspect
import pathlib
import typing

import fxwrap
from fxwrap.ir.line_hosts import LineConverter, LinePrinter
from fxwrap.wrapper_ir.fx import FxConverter
from fxwrap.wrapper_ir.printer import Printer

IR = pathlib.Path(fxwrap.__file__).parent / "ir"


def _declared(protocol) -> set[str]:
    members = {name for name, value in vars(protocol).items()
               if (callable(value) or isinstance(value, property)) and not name.startswith("_")}
    return members | set(typing.get_type_hints(protocol))


def _used_on(parameter: str) -> dict[str, set[str]]:
    """Attributes read off a parameter of that name in the line modules, with their files."""
    used: dict[str, set[str]] = {}
    for path in sorted(IR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == parameter:
                used.setdefault(node.attr, set()).add(path.name)
    return used


def test_lines_call_only_declared_members():
    for parameter, protocol in (("printer", LinePrinter), ("converter", LineConverter)):
        used = _used_on(parameter)
        assert used, parameter
        undeclared = {name: sorted(files) for name, files in used.items() if name not in _declared(protocol)}
        assert not undeclared, f"lines call {parameter} members {protocol.__name__} does not declare: {undeclared}"


def test_the_printer_and_the_converter_implement_every_declared_member():
    for cls, protocol in ((Printer, LinePrinter), (FxConverter, LineConverter)):
        init = inspect.getsource(cls.__init__)
        missing = [name for name in sorted(_declared(protocol))
                   if not hasattr(cls, name) and f"self.{name} =" not in init and f"self.{name}:" not in init]
        assert not missing, f"{cls.__name__} lacks {missing} of {protocol.__name__}"


def test_line_methods_are_typed_with_the_protocols():
    for path in sorted(IR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in ("to_source", "to_fx"):
                annotation = node.args.args[1].annotation
                want = "LinePrinter" if node.name == "to_source" else "LineConverter"
                assert isinstance(annotation, ast.Name) and annotation.id == want, f"{path.name}:{node.lineno}"


def test_the_session_has_what_aten_graph_passes_read():
    """``AtenGraph.session`` was typed ``Any`` and passes read its attributes unchecked; it is
    a ``PassSession`` now, and ``CompileSession`` / ``CompileOptions`` provide every member."""
    from fxwrap.core.passes import AtenGraph, PassOptions, PassSession
    from fxwrap.plugins.session import CompileOptions, CompileSession
    assert typing.get_type_hints(AtenGraph)["session"] is PassSession
    init = inspect.getsource(CompileSession.__init__)
    missing = [name for name in _declared(PassSession)
               if not hasattr(CompileSession, name) and f"self.{name} =" not in init]
    assert not missing, missing
    options = CompileOptions()
    assert all(hasattr(options, name) for name in _declared(PassOptions)), _declared(PassOptions)
    passes = pathlib.Path(fxwrap.__file__).parent / "core" / "passes.py"
    read = {node.attr for node in ast.walk(ast.parse(passes.read_text()))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "session"}
    assert read and read <= _declared(PassSession), sorted(read - _declared(PassSession))
