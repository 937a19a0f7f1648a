"""Wrapper IR lines -> readable Python source, for humans.

::

    def forward(arg0, arg1, s0):
        # mm: aten.mm.default
        buf0 = empty_strided((s0, 16), (16, 1), dtype=torch.float32, device='cpu')
        aten.mm.out(arg0, arg1, out=buf0)
        buf1 = as_strided(buf0, (16, s0), (1, 16), 0)  # view
        return (buf1,)

The text is a pure function of the lines: the same program prints the same
bytes.
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.wrapper_ir.lines import (
    Allocate, Buffer, CallExtern, CallKernel, Comment, DefineKernel, DefineSymbol, Free,
    GetItem, Line, Return, Reuse, View,
)


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
    found = set()
    for line in lines:
        if isinstance(line, CallExtern) and isinstance(line.out, str):
            found.add(line.out)
        elif isinstance(line, GetItem) and isinstance(line.buf, str):
            found.add(line.buf)
    return frozenset(found)


def line_source(line: Line, names=frozenset()) -> str:
    """One line of the program as Python text.

    ``names`` are the string values that name program values (``value_names``);
    any other string argument prints as a literal.
    """
    if isinstance(line, Allocate):
        b = line.buf
        return (f"{b.name} = empty_strided({fmt(b.size)}, {fmt(b.stride)}, dtype={b.dtype}, "
                f"device={fmt(b.device)})")
    if isinstance(line, Reuse):
        n = line.new
        o = line.old
        if (o.size, o.stride, o.offset, o.dtype) == (n.size, n.stride, n.offset, n.dtype):
            return f"{n.name} = {line.old.name}  # reuse"
        return f"{n.name} = as_strided({line.old.name}, {fmt(n.size)}, {fmt(n.stride)}, {fmt(n.offset)})  # reuse"
    if isinstance(line, View):
        b = line.buf
        return f"{b.name} = as_strided({line.base.name}, {fmt(b.size)}, {fmt(b.stride)}, {fmt(b.offset)})  # view"
    if isinstance(line, DefineKernel):
        k = line.kernel
        return f"# kernel {k.name} ({k.target}): " + ", ".join(f"{a.name}:{a.role}" for a in k.signature)
    if isinstance(line, CallKernel):
        grid = f"  # grid={fmt(tuple(line.grid))}" if line.grid else ""
        return f"{line.kernel.name}({_call(line.args, (), names)}){grid}"
    if isinstance(line, CallExtern):
        call = f"{op_name(line.op)}({_call(line.args, line.kwargs, names)})"
        if line.out is None:
            return call
        return f"{line.out.name if isinstance(line.out, Buffer) else line.out} = {call}"
    if isinstance(line, GetItem):
        name = line.buf.name if isinstance(line.buf, Buffer) else line.buf
        return f"{name} = {line.src}[{line.index}]"
    if isinstance(line, DefineSymbol):
        return f"{line.symbol} = {line.expr}"
    if isinstance(line, Free):
        return f"free({line.buf.name})"
    if isinstance(line, Comment):
        return f"# {line.text}"
    if isinstance(line, Return):
        return f"return {fmt(tuple(line.values), names)}"
    raise TypeError(f"no printed form for line {line!r}")


def program_source(inputs, lines: list[Line], name: str = "forward") -> str:
    """The whole program as a Python function."""
    head = f"def {name}({', '.join(i.name for i in inputs)}):"
    names = value_names(lines)
    body = [f"    {line_source(line, names)}" for line in lines]
    return "\n".join([head, *body]) + "\n"
