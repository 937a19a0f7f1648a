"""What a Wrapper-IR line asks of the two objects that turn lines into something else: the
printer (``to_source(printer)``, ``wrapper_ir.printer.Printer``) and the FX converter
(``to_fx(converter)``, ``wrapper_ir.fx.FxConverter``).  A line type of a plugin or a new
module calls these and nothing else; ``tests/null/test_declared_contracts.py`` checks that every call
a line makes is declared here and that both classes implement every member::

    class Allocate(Line):
        def to_source(self, printer: LinePrinter) -> str:
            return f"{b.name} = empty_strided({printer.fmt(b.size)}, ...)"

        def to_fx(self, converter: LineConverter) -> None:
            converter.bind(b, converter.add(torch.empty_strided, (converter.sizes(b.size), ...)))
"""
from __future__ import annotations

from typing import Any, Protocol

import sympy
import torch


class LinePrinter(Protocol):
    """The text of a line in ``Program.code()``."""

    def fmt(self, value: Any) -> str:
        """``value`` (a buffer, size, dtype, device, op, nested tuple ...) as Python text."""

    def call(self, args: Any, kwargs: Any = ()) -> str:
        """The argument list ``a, b, k=v`` of a call."""

    def op_name(self, op: Any) -> str:
        """An op's printed name (``aten.mm.default``)."""

    def nested(self, program: Any) -> str:
        """A nested program (``control_flow.NestedProgram``) as a ``def`` block."""

    def provenance(self, origins: Any, text: str) -> str:
        """``text`` under a comment naming the ATen nodes it computes."""

    def unknown(self, line: Any) -> Any:
        """Raises: ``line`` has no printed form."""


class LineConverter(Protocol):
    """The FX nodes of a line in the program's GraphModule."""

    graph: torch.fx.Graph
    kernels: list

    def add(self, target: Any, args: Any = (), kwargs: Any = None, name: str | None = None,
            buf: Any = None) -> torch.fx.Node:
        """A ``call_function`` node (bound to ``buf`` where given)."""

    def arg(self, value: Any) -> Any:
        """``value`` as an FX argument: buffers and named values as their nodes, sizes as expressions."""

    def sizes(self, exprs: Any) -> list:
        """Sizes or strides as FX arguments."""

    def expr(self, e: Any) -> Any:
        """A size expression as an int or a node computing it."""

    def node(self, value: Any) -> torch.fx.Node:
        """The node a buffer or named value is bound to."""

    def bind(self, value: Any, node: Any) -> None:
        """Bind a buffer to ``node``."""

    def bind_value(self, name: str, node: Any) -> None:
        """Bind a named value (a tuple or scalar result) to ``node``."""

    def bind_symbol(self, symbol: sympy.Symbol, value: Any) -> None:
        """Bind a size symbol to its value."""

    def free(self, buf: Any) -> torch.fx.Node:
        """The node that drops ``buf``'s reference."""

    def subprogram(self, program: Any) -> torch.fx.Node:
        """A nested program's GraphModule as an attribute node."""

    def comment(self, text: str) -> None:
        """A comment on the next node."""

    def provenance(self, node: torch.fx.Node, origins: Any) -> None:
        """Record the ATen nodes ``node`` computes."""

    def unknown(self, line: Any) -> Any:
        """Raises: ``line`` has no FX form."""
