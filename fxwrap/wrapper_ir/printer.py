"""Wrapper IR lines -> readable Python source, for humans.

::

    def forward(arg0, arg1, s0):
        buf0 = empty_strided((s0, 16), (16, 1), dtype=torch.float32, device='cpu')
        # mm (model.py:12 in forward, fc)
        aten.mm.out(arg0, arg1, out=buf0)
        buf1 = as_strided(buf0, (16, s0), (1, 16), 0)  # view
        return (buf1,)

Each line prints itself (``Line.to_source(printer)``) with the ``Printer``'s
helpers; the text is a pure function of the lines: the same program prints the
same bytes.
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.ir.lines import Buffer, Line
from fxwrap.runtime.provenance import describe


def fmt(value, names=frozenset()) -> str:
    """``value`` as Python text; a string in ``names`` is a program value, printed bare."""
    if isinstance(value, Buffer):
        return value.name
    if isinstance(value, sympy.Expr):
        return str(value)
    if isinstance(value, str) and value in names:
        return value
    if isinstance(value, tuple):
        inner = ", ".join(fmt(v, names) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v, names) for v in value) + "]"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.device):
        return repr(str(value))
    if isinstance(value, torch._ops.OpOverload):
        return op_name(value)
    return repr(value)


def op_name(op) -> str:
    if isinstance(op, torch._ops.OpOverload):
        ns = op.namespace
        return f"{ns}.{op._schema.name.split('::')[-1]}.{op._overloadname}"
    return getattr(op, "__name__", repr(op))


def _call(args, kwargs, names=frozenset()) -> str:
    parts = [fmt(a, names) for a in args] + [f"{k}={fmt(v, names)}" for k, v in kwargs]
    return ", ".join(parts)


def value_names(lines: list[Line]) -> frozenset[str]:
    """Names of the non-buffer values lines define (tuple and scalar results)."""
    return frozenset(name for line in lines for name in line.defines_values())


class Printer:
    """What a line's ``to_source(printer)`` builds its text with.

    ``names`` are the string values that name program values (``value_names``);
    any other string argument prints as a literal.
    """

    def __init__(self, names=frozenset()):
        self.names = names

    def fmt(self, value) -> str:
        """``value`` (a buffer, size, dtype, device, op, nested tuple ...) as Python text."""
        return fmt(value, self.names)

    def call(self, args, kwargs=()) -> str:
        """The argument list ``a, b, k=v`` of a call."""
        return _call(args, kwargs, self.names)

    op_name = staticmethod(op_name)

    def nested(self, program) -> str:
        """A nested program (``control_flow.NestedProgram``) as a ``def`` block of its own."""
        return program_source(program.inputs, list(program.lines), program.name)

    @staticmethod
    def provenance(origins, text: str) -> str:
        """``text`` under a comment naming the ATen nodes it computes (``provenance.describe``):
        ``# exp, mm (model.py:12 in forward, fc)`` then ``aten.mm.out(...)``."""
        return f"# {describe(origins)}\n{text}" if origins else text

    def unknown(self, line: Line):
        raise TypeError(f"no printed form for line {line!r}: a Line subclass prints itself "
                        f"through to_source(printer)")


def line_source(line: Line, names=frozenset()) -> str:
    """One line of the program as Python text: ``line.to_source(Printer(names))``.

    ``names`` are the string values that name program values (``value_names``);
    any other string argument prints as a literal.
    """
    return line.to_source(Printer(names))


def program_source(inputs, lines: list[Line], name: str = "forward") -> str:
    """The whole program as a Python function."""
    head = f"def {name}({', '.join(i.name for i in inputs)}):"
    printer = Printer(value_names(lines))
    body = ["    " + text if text else text
            for line in lines for text in line.to_source(printer).split("\n")]
    return "\n".join([head, *body]) + "\n"
