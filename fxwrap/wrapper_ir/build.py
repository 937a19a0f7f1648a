"""ATen FX graph -> list of Wrapper IR lines.

Given the ATen graph of ``lambda x, w: torch.relu(x @ w)``::

    mm = aten.mm.default(arg0_1, arg1_1)
    relu = aten.relu.default(mm)
    return (relu,)

``build_lines`` gives::

    # mm: aten.mm.default
    buf0 = empty_strided((8, 16), (16, 1), dtype=torch.float32, device='cpu')
    aten.mm.out(arg0, arg1, out=buf0)
    # relu: aten.relu.default
    buf1 = empty_strided((8, 16), (16, 1), dtype=torch.float32, device='cpu')
    aten.relu.out(buf0, out=buf1)
    return (buf1,)

Ops the scheduler turned into kernels arrive as ``ScheduledKernel``s; every other
node becomes a ``CallExtern`` (its out= overload where it has one), a ``View``
(view ops), or ``GetItem``s (multi-output ops).  Frees and reuse are added
afterwards by ``core.memory``.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx

from fxwrap.core import extern
from fxwrap.core.symbolic import evaluate, simplest, to_expr, to_exprs
from fxwrap.wrapper_ir.lines import (
    Allocate, Buffer, CallExtern, Comment, GetItem, Line, Return, SizeInput, View,
)

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


class UnsupportedNode(NotImplementedError):
    """An FX node fxwrap cannot express; names the node, op and target."""


@dataclass
class BuiltProgram:
    """The lines of one graph, plus what the FX converter needs beside them."""

    inputs: list[Buffer | SizeInput]
    lines: list[Line]
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    fake_values: dict[str, Any] = field(default_factory=dict)

    @property
    def hints(self) -> dict[sympy.Symbol, int]:
        return {i.symbol: i.hint for i in self.inputs if isinstance(i, SizeInput)}


def buffer_from_fake(name: str, fake: torch.Tensor) -> Buffer:
    return Buffer(name, to_exprs(fake.shape), to_exprs(fake.stride()), fake.dtype,
                  fake.device, to_expr(fake.storage_offset()))


def _is_dense(buf: Buffer, hints) -> bool:
    size = [evaluate(n, hints) for n in buf.size]
    stride = [evaluate(s, hints) for s in buf.stride]
    from fxwrap.core.symbolic import is_non_overlapping_and_dense
    return is_non_overlapping_and_dense(size, stride)


class _Builder:
    def __init__(self, gm: torch.fx.GraphModule, target_name: str):
        self.gm = gm
        self.target_name = target_name
        self.env: dict[torch.fx.Node, Any] = {}
        self.roots: dict[str, Buffer] = {}
        self.out = BuiltProgram([], [])
        self.counter = 0

    # -- naming -------------------------------------------------------------
    def fresh(self, prefix: str = "buf") -> str:
        name = f"{prefix}{self.counter}"
        self.counter += 1
        return name

    def new_buffer(self, fake: torch.Tensor, prefix: str = "buf") -> Buffer:
        buf = buffer_from_fake(self.fresh(prefix), fake)
        self.out.fake_values[buf.name] = fake
        self.roots[buf.name] = buf
        return buf

    # -- values -------------------------------------------------------------
    def value(self, arg):
        if isinstance(arg, torch.fx.Node):
            return self.env[arg]
        if isinstance(arg, (list, tuple)):
            return tuple(self.value(a) for a in arg)
        if isinstance(arg, _SYM_TYPES):
            return simplest(to_expr(arg))
        return arg

    def emit(self, line: Line) -> None:
        self.out.lines.append(line)

    # -- nodes --------------------------------------------------------------
    def run(self) -> BuiltProgram:
        n_inputs = 0
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node, n_inputs)
                n_inputs += 1
            elif node.op == "get_attr":
                tensor = getattr(self.gm, node.target)
                buf = self.new_buffer(tensor, prefix="const")
                self.out.constants[buf.name] = tensor
                self.env[node] = buf
            elif node.op == "call_function":
                self.call_function(node)
            elif node.op == "output":
                values = node.args[0]
                self.emit(Return(tuple(self.value(v) for v in values)))
            else:
                raise UnsupportedNode(f"node {node.format_node()}: op {node.op!r} is not supported "
                                      f"on target {self.target_name}")
        return self.out

    def placeholder(self, node: torch.fx.Node, index: int) -> None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            buf = buffer_from_fake(f"arg{index}", val)
            self.out.fake_values[buf.name] = val
            self.roots[buf.name] = buf
            self.out.inputs.append(buf)
            self.env[node] = buf
        elif isinstance(val, torch.SymInt) and isinstance(to_expr(val), sympy.Symbol):
            sym = to_expr(val)
            self.out.inputs.append(SizeInput(sym, int(val.node.hint)))
            self.env[node] = sym
        elif isinstance(val, (int, float, bool)) or val is None:
            # A non-symbolic scalar input: keep it a program input under its own name.
            sym = sympy.Symbol(f"arg{index}", integer=True)
            self.out.inputs.append(SizeInput(sym, int(val or 0)))
            self.env[node] = sym
        else:
            raise UnsupportedNode(f"graph input {node.name} with value {val!r} is not supported "
                                  f"on target {self.target_name}")

    def call_function(self, node: torch.fx.Node) -> None:
        target = node.target
        val = node.meta.get("val")
        if target is operator.getitem:
            self.env[node] = self.value(node.args[0])[node.args[1]]
            return
        if isinstance(val, _SYM_TYPES) or (not isinstance(target, torch._ops.OpOverload)
                                            and isinstance(val, (int, float, bool))):
            # Size arithmetic (sym_size, operator.mul on SymInts): an expression.
            if isinstance(val, torch.SymInt):
                self.env[node] = simplest(to_expr(val))
                return
            if not isinstance(val, _SYM_TYPES):
                self.env[node] = val
                return
        if not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            raise UnsupportedNode(
                f"node {node.name}: {target} is not an ATen op; fxwrap lowers ATen/prims graphs "
                f"(target {self.target_name}). Register a lowering with the fxwrap_lowerings hook "
                "or keep this call outside the compiled region.")
        self.emit(Comment(f"{node.name}: {target}"))
        args = self.value(node.args)
        kwargs = tuple((k, self.value(v)) for k, v in node.kwargs.items())
        if extern.is_view(target) and isinstance(val, torch.Tensor):
            self.view(node, args, val)
        elif extern.is_mutating(target):
            self.emit(CallExtern(target, args, kwargs, None))
            written = [i for i, a in enumerate(target._schema.arguments)
                       if a.alias_info is not None and a.alias_info.is_write]
            self.env[node] = self._argument(target, node, written[0]) if written else None
        else:
            self.functional(node, target, args, kwargs, val)

    def _argument(self, op, node: torch.fx.Node, index: int):
        arg = op._schema.arguments[index]
        if index < len(node.args):
            return self.value(node.args[index])
        return self.value(node.kwargs[arg.name])

    def view(self, node: torch.fx.Node, args, val: torch.Tensor) -> None:
        source = next(a for a in _flatten(args) if isinstance(a, Buffer))
        base = self.roots[source.name]
        buf = buffer_from_fake(self.fresh(), val)
        self.out.fake_values[buf.name] = val
        self.roots[buf.name] = base
        self.emit(View(buf, base))
        self.env[node] = buf

    def functional(self, node, op, args, kwargs, val) -> None:
        results = list(val) if isinstance(val, (tuple, list)) else [val]
        variant = extern.out_variant(op)
        hints = self.out.hints
        if variant is not None and all(isinstance(r, torch.Tensor) for r in results):
            bufs = [self.new_buffer(r) for r in results]
            if all(_is_dense(b, hints) for b in bufs):
                for b in bufs:
                    self.emit(Allocate(b))
                out_kwargs = tuple(zip(variant.out_names, bufs))
                self.emit(CallExtern(variant.op, args, kwargs + out_kwargs, None))
                self.env[node] = bufs[0] if not isinstance(val, (tuple, list)) else tuple(bufs)
                return
            for b in bufs:  # not dense: let the op pick its own storage
                del self.roots[b.name]
                del self.out.fake_values[b.name]
        if isinstance(val, torch.Tensor):
            buf = self.new_buffer(val)
            self.emit(CallExtern(op, args, kwargs, buf))
            self.env[node] = buf
        elif isinstance(val, (tuple, list)):
            name = self.fresh("tuple")
            self.emit(CallExtern(op, args, kwargs, name))
            items = []
            for i, r in enumerate(val):
                if isinstance(r, torch.Tensor):
                    buf = self.new_buffer(r)
                    self.emit(GetItem(buf, name, i))
                    items.append(buf)
                else:
                    items.append(None if r is None else self._scalar_item(name, i, r))
            self.env[node] = tuple(items)
        else:
            name = self._scalar_name(val)
            self.emit(CallExtern(op, args, kwargs, name))
            self.env[node] = sympy.Symbol(name, integer=True) if isinstance(val, torch.SymInt) else name

    def _scalar_name(self, val) -> str:
        if isinstance(val, torch.SymInt) and isinstance(to_expr(val), sympy.Symbol):
            return to_expr(val).name
        return self.fresh("scalar")

    def _scalar_item(self, src: str, index: int, val):
        name = self._scalar_name(val)
        self.emit(GetItem(name, src, index))
        return sympy.Symbol(name, integer=True) if isinstance(val, torch.SymInt) else name


def _flatten(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    else:
        yield value


def build_lines(gm: torch.fx.GraphModule, target_name: str = "cpu") -> BuiltProgram:
    """Lines for an ATen graph; every op an extern call or a view (see module doc)."""
    return _Builder(gm, target_name).run()
