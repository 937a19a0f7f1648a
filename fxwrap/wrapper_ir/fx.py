"""Wrapper IR lines -> ``torch.fx.GraphModule`` that runs directly.

Lines::

    buf0 = empty_strided((s0, 16), (16, 1), dtype=torch.float32, device='cpu')
    aten.mm.out(arg0, arg1, out=buf0)
    buf1 = as_strided(buf0, (16, s0), (1, 16), 0)
    free(buf0)  ... return (buf1,)

become FX nodes (``gm.print_readable()``)::

    def forward(self, arg0, arg1, s0):
        buf0 = torch.empty_strided([s0, 16], [16, 1], dtype=torch.float32, device=device(type='cpu'))
        mm_out = torch.ops.aten.mm.out(arg0, arg1, out=buf0)
        buf1 = torch.as_strided(buf0, [16, s0], [1, 16], 0)
        ...

Conversion is a ``{LineType: method}`` table; a line type with no entry is an
error.  Every buffer node carries ``meta["val"]`` (a FakeTensor), every launch's
target is a ``fxwrap.Kernel``, and ``free`` nodes survive dead-code elimination.
"""
from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import sympy
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._sympy.functions import CleanDiv, FloorDiv, Max, Min, Mod, ModularIndexing, PythonMod

from fxwrap.runtime.kernel import Kernel
from fxwrap.runtime.memory import free
from fxwrap.wrapper_ir.lines import (
    Allocate, Buffer, CallExtern, CallKernel, Comment, DefineKernel, DefineSymbol, Free,
    GetItem, Line, Return, Reuse, SizeInput, View,
)


class UnknownLine(TypeError):
    """A line type the FX converter has no rule for."""


class FxConverter:
    """Builds one GraphModule from ``inputs`` + ``lines`` (see module docstring)."""

    def __init__(self, inputs, lines: list[Line], constants: Mapping[str, torch.Tensor] | None = None,
                 fake_values: Mapping[str, Any] | None = None):
        self.inputs = list(inputs)
        self.lines = list(lines)
        self.constants = dict(constants or {})
        self.fake_values = dict(fake_values or {})
        self.graph = torch.fx.Graph()
        self.nodes: dict[str, torch.fx.Node] = {}  # buffers, scalars, tuples by name
        self.symbols: dict[str, torch.fx.Node] = {}
        self.expr_nodes: dict[sympy.Expr, torch.fx.Node] = {}
        self.kernels: list[Kernel] = []
        self.pending_comment: str | None = None
        self._fake_mode: FakeTensorMode | None = None

    handlers = {
        Allocate: "allocate", Reuse: "reuse", View: "view", DefineKernel: "define_kernel",
        CallKernel: "call_kernel", CallExtern: "call_extern", GetItem: "get_item",
        DefineSymbol: "define_symbol", Free: "free", Comment: "comment", Return: "ret",
    }

    # -- driver -------------------------------------------------------------
    def convert(self) -> torch.fx.GraphModule:
        for inp in self.inputs:
            node = self.graph.placeholder(inp.name)
            if isinstance(inp, SizeInput):
                self.symbols[inp.name] = node
                node.meta["val"] = inp.hint
            else:
                self.nodes[inp.name] = node
                node.meta["val"] = self.fake(inp)
        root = torch.nn.Module()
        for name, tensor in self.constants.items():
            root.register_buffer(name, tensor)
            node = self.graph.get_attr(name)
            node.meta["val"] = self.fake(self._const_buffer(name, tensor))
            self.nodes[name] = node
        for line in self.lines:
            method = self.handlers.get(type(line))
            if method is None:
                raise UnknownLine(f"no FX conversion for line {line!r}; known: "
                                  f"{sorted(t.__name__ for t in self.handlers)}")
            getattr(self, method)(line)
        gm = torch.fx.GraphModule(root, self.graph, class_name="FxwrapProgram")
        gm._fxwrap_kernels = tuple(self.kernels)  # pickled before the code's import block
        return gm

    @staticmethod
    def _const_buffer(name, tensor) -> Buffer:
        from fxwrap.wrapper_ir.build import buffer_from_fake
        return buffer_from_fake(name, tensor)

    def add(self, target, args=(), kwargs=None, name: str | None = None, buf: Buffer | None = None):
        node = self.graph.create_node("call_function", target, tuple(args), kwargs or {}, name=name)
        if self.pending_comment is not None:
            node.meta["comment"] = self.pending_comment
            self.pending_comment = None
        if buf is not None:
            node.meta["val"] = self.fake(buf)
        return node

    # -- values -------------------------------------------------------------
    def arg(self, value):
        if isinstance(value, Buffer):
            return self.nodes[value.name]
        if isinstance(value, sympy.Expr):
            return self.expr(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self.arg(v) for v in value) if isinstance(value, list) else \
                tuple(self.arg(v) for v in value)
        if isinstance(value, str) and value in self.nodes:
            return self.nodes[value]
        return value

    def sizes(self, exprs) -> list:
        return [self.expr(e) for e in exprs]

    def expr(self, e):
        """An int, or an FX node computing the sympy expression from symbol inputs."""
        e = sympy.sympify(e)
        if e.is_Integer:
            return int(e)
        if e.is_Float or e.is_Rational and not e.is_Integer:
            return float(e)
        if e in self.expr_nodes:
            return self.expr_nodes[e]
        if isinstance(e, sympy.Symbol):
            if e.name not in self.symbols:
                raise KeyError(f"size symbol {e} is not a program input or defined symbol")
            return self.symbols[e.name]
        node = self._expr_node(e)
        self.expr_nodes[e] = node
        return node

    def _fold(self, op, terms):
        acc = self.expr(terms[0])
        for t in terms[1:]:
            acc = self.add(op, (acc, self.expr(t)))
        return acc

    def _expr_node(self, e):
        if isinstance(e, sympy.Add):
            return self._fold(operator.add, sorted(e.args, key=sympy.default_sort_key))
        if isinstance(e, sympy.Mul):
            return self._fold(operator.mul, sorted(e.args, key=sympy.default_sort_key))
        if isinstance(e, (FloorDiv, CleanDiv)):
            return self.add(operator.floordiv, (self.expr(e.args[0]), self.expr(e.args[1])))
        if isinstance(e, (Mod, PythonMod, sympy.Mod)):
            return self.add(operator.mod, (self.expr(e.args[0]), self.expr(e.args[1])))
        if isinstance(e, ModularIndexing):
            base, div, mod = (self.expr(a) for a in e.args)
            return self.add(operator.mod, (self.add(operator.floordiv, (base, div)), mod))
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
            return self.add(operator.pow, (self.expr(e.base), int(e.exp)))
        if isinstance(e, (Max, sympy.Max)):
            return self._fold(torch.sym_max, list(e.args))
        if isinstance(e, (Min, sympy.Min)):
            return self._fold(torch.sym_min, list(e.args))
        raise NotImplementedError(f"size expression {e} ({type(e).__name__}) has no FX form yet")

    # -- meta ---------------------------------------------------------------
    def fake(self, buf: Buffer):
        known = self.fake_values.get(buf.name)
        if known is not None:
            return known
        exprs = (*buf.size, *buf.stride, buf.offset)
        if any(sympy.sympify(x).free_symbols for x in exprs):
            return None  # symbolic and not recorded by the builder
        if self._fake_mode is None:
            self._fake_mode = FakeTensorMode()
        with self._fake_mode:
            return torch.empty_strided([int(n) for n in buf.size], [int(s) for s in buf.stride],
                                       dtype=buf.dtype, device=buf.device)

    # -- line rules ---------------------------------------------------------
    def allocate(self, line: Allocate):
        b = line.buf
        self.nodes[b.name] = self.add(
            torch.empty_strided, (self.sizes(b.size), self.sizes(b.stride)),
            {"dtype": b.dtype, "device": b.device}, name=b.name, buf=b)

    def reuse(self, line: Reuse):
        old, new = line.old, line.new
        same = (old.size, old.stride, old.offset, old.dtype) == (new.size, new.stride, new.offset, new.dtype)
        if same:
            self.nodes[new.name] = self.nodes[old.name]
            return
        self.nodes[new.name] = self.add(
            torch.as_strided, (self.nodes[old.name], self.sizes(new.size), self.sizes(new.stride),
                               self.expr(new.offset)), name=new.name, buf=new)

    def view(self, line: View):
        b = line.buf
        self.nodes[b.name] = self.add(
            torch.as_strided, (self.nodes[line.base.name], self.sizes(b.size), self.sizes(b.stride),
                               self.expr(b.offset)), name=b.name, buf=b)

    def define_kernel(self, line: DefineKernel):
        self.kernels.append(line.kernel)

    def call_kernel(self, line: CallKernel):
        if line.kernel not in self.kernels:
            self.kernels.append(line.kernel)
        self.add(line.kernel, self.arg(tuple(line.args)))

    def call_extern(self, line: CallExtern):
        name = line.out.name if isinstance(line.out, Buffer) else line.out
        node = self.add(line.op, self.arg(tuple(line.args)),
                        {k: self.arg(v) for k, v in line.kwargs}, name=name,
                        buf=line.out if isinstance(line.out, Buffer) else None)
        if name is not None:
            self.nodes[name] = node
            self.symbols.setdefault(name, node)

    def get_item(self, line: GetItem):
        name = line.buf.name if isinstance(line.buf, Buffer) else line.buf
        node = self.add(operator.getitem, (self.nodes[line.src], line.index), name=name,
                        buf=line.buf if isinstance(line.buf, Buffer) else None)
        self.nodes[name] = node
        self.symbols.setdefault(name, node)

    def define_symbol(self, line: DefineSymbol):
        self.symbols[line.symbol.name] = self.expr(line.expr)

    def free(self, line: Free):
        self.add(free, (self.nodes[line.buf.name],))

    def comment(self, line: Comment):
        self.pending_comment = line.text

    def ret(self, line: Return):
        self.graph.output(tuple(self.arg(v) if v is not None else None for v in line.values))


def to_graph_module(inputs, lines, constants=None, fake_values=None) -> torch.fx.GraphModule:
    """The GraphModule for a program (see ``FxConverter``)."""
    return FxConverter(inputs, lines, constants, fake_values).convert()
