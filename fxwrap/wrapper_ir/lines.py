"""The Wrapper IR: a flat list of lines that is the whole program.

A program computing ``torch.relu(x @ w) + 1`` on the CPU, extern-only, prints as::

    def forward(arg0, arg1):
        buf0 = empty_strided((8, 16), (16, 1), dtype=torch.float32, device='cpu')
        aten.mm.out(arg0, arg1, out=buf0)
        buf1 = empty_strided((8, 16), (16, 1), dtype=torch.float32, device='cpu')
        aten.relu.out(buf0, out=buf1)
        buf2 = buf0  # reuse
        aten.add.out(buf1, 1, out=buf2)
        free(buf1)
        return (buf2,)

Every line is a frozen, hashable dataclass.  ``wrapper_ir.fx`` turns the list into
a ``torch.fx.GraphModule`` and ``wrapper_ir.printer`` into the text above.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from fxwrap.core.symbolic import storage_elements, to_expr, to_exprs


@dataclass(frozen=True)
class Buffer:
    """A named tensor of the program: its layout, dtype and device.

    ``Buffer("buf0", (s0, 16), (16, 1), torch.float32, torch.device("cpu"))``
    is a row-major ``s0 x 16`` float tensor.  ``offset`` is in elements, from the
    start of its storage.
    """

    name: str
    size: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    dtype: torch.dtype
    device: torch.device
    offset: sympy.Expr = sympy.Integer(0)

    @classmethod
    def from_fake(cls, name: str, fake: torch.Tensor) -> "Buffer":
        """The Buffer of a (fake) tensor: ``Buffer.from_fake("buf0", node.meta["val"])``."""
        return cls(name, to_exprs(fake.shape), to_exprs(fake.stride()), fake.dtype,
                   fake.device, to_expr(fake.storage_offset()))

    @property
    def storage_bytes(self) -> sympy.Expr:
        """Bytes of storage the layout spans (what an allocation needs)."""
        return storage_elements(self.size, self.stride, self.offset) * self.dtype.itemsize

    def renamed(self, name: str) -> "Buffer":
        return Buffer(name, self.size, self.stride, self.dtype, self.device, self.offset)


@dataclass(frozen=True)
class SizeInput:
    """A size symbol that the program takes as an input (``s0``), with its hint."""

    symbol: sympy.Symbol
    hint: int

    @property
    def name(self) -> str:
        return self.symbol.name


@dataclass(frozen=True)
class Line:
    """Base of every Wrapper IR line."""


@dataclass(frozen=True)
class Allocate(Line):
    """``buf0 = empty_strided(size, stride, dtype=, device=)``: new storage."""

    buf: Buffer


@dataclass(frozen=True)
class Reuse(Line):
    """``buf3 = buf0  # reuse``: ``new`` takes the storage of dead buffer ``old``."""

    old: Buffer
    new: Buffer


@dataclass(frozen=True)
class View(Line):
    """``buf2 = as_strided(buf0, size, stride, offset)``: reinterpret storage.

    ``buf`` carries the view's layout; ``base`` is the buffer that owns the storage.
    """

    buf: Buffer
    base: Buffer

    @property
    def name(self) -> str:
        return self.buf.name


@dataclass(frozen=True)
class DefineKernel(Line):
    """``# kernel fxwrap_pointwise_0 defined``: source and signature of a kernel."""

    kernel: Any  # fxwrap.runtime.Kernel


@dataclass(frozen=True)
class CallKernel(Line):
    """``fxwrap_pointwise_0(buf0, arg1, s0)``: launch; writes its output args."""

    kernel: Any
    args: tuple
    grid: tuple = ()


@dataclass(frozen=True)
class CallExtern(Line):
    """``aten.mm.out(arg0, arg1, out=buf0)``: an ATen or custom op.

    ``out`` names the result when the program uses it: a ``Buffer`` for a single
    tensor, a ``str`` for a tuple or a scalar (read through ``GetItem``), ``None``
    when the op writes into buffers passed in ``kwargs`` (its out= overload) or
    mutates an argument in place.
    """

    op: Any
    args: tuple
    kwargs: tuple[tuple[str, Any], ...] = ()
    out: Buffer | str | None = None

    @property
    def kwargs_dict(self) -> dict[str, Any]:
        return dict(self.kwargs)


@dataclass(frozen=True)
class GetItem(Line):
    """``buf4 = buf3[1]``: one result of a multi-output extern."""

    buf: Buffer | str
    src: str
    index: int


@dataclass(frozen=True)
class DefineSymbol(Line):
    """``u0 = s0 * 16``: a size expression computed on the host."""

    symbol: sympy.Symbol
    expr: sympy.Expr


@dataclass(frozen=True)
class Free(Line):
    """``free(buf1)``: last use of ``buf``; its storage may be released."""

    buf: Buffer


@dataclass(frozen=True)
class Comment(Line):
    """``# mm: aten.mm.default``: provenance of the next line."""

    text: str


@dataclass(frozen=True)
class Return(Line):
    """``return (buf2, s0)``: the program's outputs.

    Each value is a ``Buffer``, a sympy size expression, a python scalar or None.
    """

    values: tuple = field(default=())


def buffers_in(value) -> list[Buffer]:
    """Every ``Buffer`` inside a (nested) argument value, in order."""
    found: list[Buffer] = []

    def visit(v):
        if isinstance(v, Buffer):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            for item in v:
                visit(item)

    visit(value)
    return found


def buffers_read(line: Line) -> list[Buffer]:
    """Buffers a line uses (reads or writes into an existing buffer)."""
    if isinstance(line, CallExtern):
        return buffers_in(line.args) + buffers_in([v for _, v in line.kwargs])
    if isinstance(line, CallKernel):
        return buffers_in(line.args)
    if isinstance(line, View):
        return [line.base]
    if isinstance(line, Reuse):
        return [line.old]
    if isinstance(line, Free):
        return [line.buf]
    if isinstance(line, Return):
        return buffers_in(line.values)
    return []


def buffers_defined(line: Line) -> list[Buffer]:
    """Buffers a line brings into existence."""
    if isinstance(line, Allocate):
        return [line.buf]
    if isinstance(line, Reuse):
        return [line.new]
    if isinstance(line, View):
        return [line.buf]
    if isinstance(line, CallExtern) and isinstance(line.out, Buffer):
        return [line.out]
    if isinstance(line, GetItem) and isinstance(line.buf, Buffer):
        return [line.buf]
    return []
