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

Each line adds its own nodes (``Line.to_fx(converter)``, through the converter's
``add`` / ``arg`` / ``node`` / ``bind`` ...); a line with no ``to_fx`` is an
error that names it.  Every buffer node carries ``meta["val"]`` (a FakeTensor; with symbolic
sizes its sizes are SymInts, and each size input's placeholder holds its SymInt),
every launch's target is a ``fxwrap.Kernel``, ``free`` nodes survive dead-code
elimination, and a ``Comment`` lands in ``meta["comment"]`` of the node that the
next line produces (its last node: the ``empty_strided`` of an ``Allocate``, not
the size arithmetic before it).

The GraphModule pickles as its graph (nodes, targets, ``meta["val"]`` and
``meta["comment"]``) rather than through FX's default of re-tracing the code,
which would run every call that does not depend on an input (``empty_strided``,
out= calls into such buffers) at load time and bake the results in as constants.
"""
from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from fxwrap.ir.symbolic import SizeArithmetic, evaluate_with
from fxwrap.runtime.graph_records import NodeRef, OpRef, attribute, decode, encode
from fxwrap.runtime.guards import check_inputs
from fxwrap.runtime.kernel import Kernel
from fxwrap.runtime.memory import free
from fxwrap.ir.lines import Buffer, Line, SizeInput
from fxwrap.wrapper_ir.guards import build_input_guard
from fxwrap.runtime.provenance import describe

#: the GraphModule attribute holding its ``InputGuard`` (``fxwrap.runtime.guards``)
INPUT_GUARD_ATTR = "_fxwrap_input_guard"


class UnknownLine(TypeError):
    """A line type the FX converter has no rule for."""


class FxwrapGraphModule(torch.fx.GraphModule):
    """The GraphModule fxwrap builds: a plain GraphModule that pickles as its graph.

    Copies (``copy.copy``, ``copy.deepcopy``) stay FxwrapGraphModules and keep the
    class name and ``_fxwrap_kernels``; kernels are shared, not copied.
    """

    def __reduce__(self):
        return (_load_graph_module, (_graph_state(self),))

    def __copy__(self):
        res = FxwrapGraphModule(self, self.graph, class_name=type(self).__name__)
        res.meta = getattr(self, "meta", {})
        res._fxwrap_kernels = getattr(self, "_fxwrap_kernels", ())
        return res

    def __deepcopy__(self, memo):
        res = super().__deepcopy__(memo)
        res.__class__.__name__ = type(self).__name__
        res._fxwrap_kernels = getattr(self, "_fxwrap_kernels", ())
        return res


class SymbolicValues:
    """SymInts for a program's size symbols, and FakeTensors whose sizes use them.

    Reuses the ShapeEnv of FakeTensors that already carry the symbols (the ones the
    builder recorded from the captured graph), so a placeholder's SymInt and the
    sizes of every buffer agree; otherwise a fresh ShapeEnv gets one symbol per
    size input (named after its source, ``s0``), mapped by name.
    """

    def __init__(self, fakes=()):
        self.fake_mode: FakeTensorMode | None = None
        self.shape_env: ShapeEnv | None = None
        for value in fakes:
            mode = getattr(value, "fake_mode", None)
            if mode is not None and mode.shape_env is not None and _symbolic(value):
                self.fake_mode, self.shape_env = mode, mode.shape_env
                break
        self.inherited = self.shape_env is not None
        self.by_name: dict[str, sympy.Expr] = {}  # program symbol name -> ShapeEnv expression
        self.hints: dict[str, int] = {}

    def add_symbol(self, name: str, hint):
        """The SymInt of size input ``name`` (its placeholder's ``meta["val"]``).

        A non-integer hint (a float or bool scalar input) stays a plain value.
        """
        if isinstance(hint, bool) or not isinstance(hint, int):
            return hint
        self.hints[name] = hint
        if self.inherited:
            backed = getattr(self.shape_env, "backed_var_to_val", None)
            known = {s.name: s for s in (backed if backed is not None else self.shape_env.var_to_val)}
            if name in known:
                self.by_name[name] = known[name]
                return self.shape_env.create_symintnode(known[name], hint=hint)
            return hint
        if self.shape_env is None:
            self.shape_env = ShapeEnv(duck_shape=False, specialize_zero_one=False)
        sym = self.shape_env.create_symbol(
            hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC,
            positive=True if hint > 0 else None, do_not_specialize_zero_one=True)
        self.by_name[name] = sym
        if not isinstance(sym, sympy.Symbol):
            return int(sym)
        return self.shape_env.create_symintnode(sym, hint=hint, source=ConstantSource(name))

    def value(self, expr):
        """``expr`` (over program symbols) as an int or a SymInt; None if a symbol is unknown."""
        expr = sympy.sympify(expr)
        if not expr.free_symbols:
            return int(expr)
        if any(s.name not in self.by_name for s in expr.free_symbols):
            return None
        env_expr = expr.xreplace({s: self.by_name[s.name] for s in expr.free_symbols})
        hint = int(expr.xreplace({s: sympy.Integer(self.hints[s.name]) for s in expr.free_symbols}))
        if not env_expr.free_symbols:
            return int(env_expr)
        return self.shape_env.create_symintnode(env_expr, hint=hint)

    def tensor(self, size, stride, offset, dtype, device):
        """A FakeTensor of this layout, or None when a size uses an unknown symbol."""
        values = [self.value(e) for e in (*size, *stride, offset)]
        if any(v is None for v in values):
            return None
        if self.fake_mode is None:
            self.fake_mode = FakeTensorMode(shape_env=self.shape_env)
        n = len(size)
        with self.fake_mode:
            t = torch.empty_strided(values[:n], values[n:2 * n], dtype=dtype, device=device)
            if not (isinstance(values[-1], int) and values[-1] == 0):
                t = torch.as_strided(t, values[:n], values[n:2 * n], values[-1])
        return t


def _symbolic(fake) -> bool:
    return any(isinstance(x, torch.SymInt) for x in (*fake.shape, *fake.stride(), fake.storage_offset()))


class FxConverter:
    """Builds one GraphModule from ``inputs`` + ``lines`` (see module docstring)."""

    def __init__(self, inputs, lines: list[Line], constants: Mapping[str, torch.Tensor] | None = None,
                 fake_values: Mapping[str, Any] | None = None, guard: bool = True,
                 size_assumptions: Sequence = ()):
        self.guard = guard
        self.size_assumptions = tuple(size_assumptions)  # ``core.lowering.SizeAssumption``s: checked by the guard
        self.inputs = list(inputs)
        self.lines = list(lines)
        self.constants = dict(constants or {})
        self.fake_values = dict(fake_values or {})
        self.graph = torch.fx.Graph()
        self.nodes: dict[str, torch.fx.Node] = {}  # buffers, scalars, tuples by name
        self.symbols: dict[str, torch.fx.Node] = {}
        self.expr_nodes: dict[sympy.Expr, torch.fx.Node] = {}
        self.size_nodes: dict[tuple, torch.fx.Node] = {}  # (fn, a, b) -> node: one node per size operation
        self.kernels: list[Kernel] = []
        self.pending_comments: list[str] = []
        self.symbolic = SymbolicValues(v for v in self.fake_values.values() if isinstance(v, torch.Tensor))

    # -- driver -------------------------------------------------------------
    def convert(self) -> torch.fx.GraphModule:
        for inp in self.inputs:
            node = self.graph.placeholder(inp.name)
            if isinstance(inp, SizeInput):
                self.symbols[inp.name] = node
                node.meta["val"] = self.symbolic.add_symbol(inp.name, inp.hint)
            else:
                self.nodes[inp.name] = node
                node.meta["val"] = self.fake(inp)
        root = self.root = torch.nn.Module()
        if self.guard:
            self._add_input_guard(root)
        for name, tensor in self.constants.items():
            if isinstance(tensor, torch.nn.Module):  # a higher-order op's subgraph
                root.add_module(name, tensor)
                self.nodes[name] = self.graph.get_attr(name)
                continue
            root.register_buffer(name, tensor)
            node = self.graph.get_attr(name)
            node.meta["val"] = self.fake(self._const_buffer(name, tensor))
            self.nodes[name] = node
        for line in self.lines:
            last = self._last_node()
            line.to_fx(self)
            if self.pending_comments and self._last_node() is not last:
                self._attach_comments(self._last_node())
        if self.pending_comments and self._last_node() is not None:
            self._attach_comments(self._last_node())  # comments after the last node-producing line
        self._drop_unread_metadata()
        gm = FxwrapGraphModule(root, self.graph, class_name="FxwrapProgram")
        gm._fxwrap_kernels = tuple(self.kernels)
        return gm

    def _drop_unread_metadata(self) -> None:
        """Erase size/stride/offset reads nothing uses (a view at its base's own offset
        is ``as_strided(base, size, stride)``, which keeps that offset): each costs an ATen
        call per run."""
        for node in reversed(list(self.graph.nodes)):
            if node.op == "call_function" and node.target in _METADATA_READS and not node.users:
                comment = node.meta.get("comment")
                if comment is not None:  # it says what the next node does
                    after = node.next.meta.get("comment")
                    node.next.meta["comment"] = comment if after is None else f"{comment}\n{after}"
                self.graph.erase_node(node)

    def _add_input_guard(self, root: torch.nn.Module) -> None:
        """``check_inputs(self._fxwrap_input_guard, *placeholders)`` as the first node."""
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        shape_env = self.symbolic.shape_env if self.symbolic.inherited else None
        setattr(root, INPUT_GUARD_ATTR, build_input_guard(self.inputs, shape_env, self.lines,
                                                              self.size_assumptions))
        guard_node = self.graph.get_attr(INPUT_GUARD_ATTR)
        self.add(check_inputs, (guard_node, *placeholders), name="check_inputs")

    def _last_node(self) -> torch.fx.Node | None:
        return next(iter(reversed(self.graph.nodes)), None)

    def _attach_comments(self, node: torch.fx.Node) -> None:
        texts = ([node.meta["comment"]] if "comment" in node.meta else []) + self.pending_comments
        node.meta["comment"] = "\n".join(texts)
        self.pending_comments = []

    @staticmethod
    def _const_buffer(name, tensor) -> Buffer:
        return Buffer.from_fake(name, tensor)

    def add(self, target, args=(), kwargs=None, name: str | None = None, buf: Buffer | None = None):
        node = self.graph.create_node("call_function", target, tuple(args), kwargs or {}, name=name)
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

    def _expr_node(self, e):
        try:
            return evaluate_with(_FxSizeArithmetic(self), e, self.symbols)
        except (KeyError, NotImplementedError) as exc:
            raise NotImplementedError(f"size expression {e} ({type(e).__name__}) has no FX form: {exc}") from exc

    # -- meta ---------------------------------------------------------------
    def fake(self, buf: Buffer):
        known = self.fake_values.get(buf.name)
        if known is not None:
            return known
        return self.symbolic.tensor(buf.size, buf.stride, buf.offset, buf.dtype, buf.device)

    # -- what a line's to_fx(converter) calls -----------------------------------
    def node(self, value) -> torch.fx.Node:
        """The node of a buffer, or of a value name (a tuple or scalar result)."""
        return self.nodes[value.name if isinstance(value, Buffer) else value]

    def bind(self, value, node) -> None:
        """Later uses of buffer (or value name) ``value`` read ``node``."""
        self.nodes[value.name if isinstance(value, Buffer) else value] = node

    def bind_value(self, name: str, node) -> None:
        """``name`` (a result) is ``node``, for later arguments and, for a scalar, sizes."""
        self.nodes[name] = node
        self.symbols.setdefault(name, node)

    def bind_symbol(self, symbol: sympy.Symbol, value) -> None:
        """Size symbol ``symbol`` has ``value`` (an FX node or an int) from here on."""
        self.symbols[symbol.name] = value

    def free(self, buf: Buffer) -> torch.fx.Node:
        """A ``fxwrap.runtime.free(buf)`` node (kept by dead-code elimination)."""
        return self.add(free, (self.node(buf),))

    def subprogram(self, program) -> torch.fx.Node:
        """A ``get_attr`` node of nested program ``program`` (``control_flow.NestedProgram``),
        converted to a GraphModule of its own (its own input check, kernels and frees)
        and added to the root as submodule ``program.name``."""
        gm = FxConverter(program.inputs, program.lines, program.constants, program.fake_values,
                         self.guard).convert()
        self.root.add_module(program.name, gm)
        return self.graph.get_attr(program.name)

    def comment(self, text: str) -> None:
        """``text`` goes to ``meta["comment"]`` of the next node a line adds."""
        self.pending_comments.append(text)

    def provenance(self, node: torch.fx.Node, origins) -> None:
        """``node`` computes ``origins`` (``provenance.Origin``s): ``meta["fxwrap_origins"]``,
        and the user's ``stack_trace`` of the last one that has one (what
        ``gm.print_readable()`` shows as ``# File: model.py:12 in forward, code: ...``)."""
        if not origins:
            return
        node.meta["fxwrap_origins"] = tuple(origins)
        trace = next((o.stack_trace for o in reversed(origins) if o.stack_trace), None)
        if trace is not None:
            node.meta["stack_trace"] = trace

    def unknown(self, line: Line):
        raise UnknownLine(f"no FX conversion for line {line!r}: a Line subclass converts itself "
                          f"through to_fx(converter)")


_METADATA_READS = frozenset({torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int,
                             torch.ops.aten.sym_storage_offset.default, torch.ops.aten.sym_numel.default})


class _FxSizeArithmetic(SizeArithmetic):
    """Size arithmetic as FX nodes of the converter's graph (Python's ``//`` and ``%`` on
    SymInts; ``sym_min``/``sym_max``); the same operation on the same nodes is one node."""

    def __init__(self, converter: "FxConverter"):
        self.converter = converter

    def _node(self, fn, a, b):
        key = (fn, a, b)
        node = self.converter.size_nodes.get(key)
        if node is None:
            node = self.converter.size_nodes[key] = self.converter.add(fn, (a, b))
        return node

    def add(self, a, b):
        return self._node(operator.add, a, b)

    def mul(self, a, b):
        return self._node(operator.mul, a, b)

    def floordiv(self, a, b):
        return self._node(operator.floordiv, a, b)

    def mod(self, a, b):
        return self._node(operator.mod, a, b)

    def minimum(self, a, b):
        return self._node(torch.sym_min, a, b)

    def maximum(self, a, b):
        return self._node(torch.sym_max, a, b)


def to_graph_module(inputs, lines, constants=None, fake_values=None, guard: bool = True,
                    size_assumptions: Sequence = ()) -> torch.fx.GraphModule:
    """The GraphModule for a program (see ``FxConverter``); ``guard``: its first node checks
    the inputs (``fxwrap.runtime.guards``), and the sizes against ``size_assumptions`` (what
    its lowering relied on: ``BuiltProgram.size_assumptions``)."""
    return FxConverter(inputs, lines, constants, fake_values, guard, size_assumptions).convert()


def input_guard_of(gm: torch.fx.GraphModule):
    """The ``InputGuard`` of a GraphModule ``to_graph_module`` made, or None."""
    return getattr(gm, INPUT_GUARD_ATTR, None)


# -- pickling ------------------------------------------------------------------
# A GraphModule pickles as a list of node records.  Targets and arguments pickle
# as themselves except nodes (by name) and ATen overloads (by qualified name);
# ``meta["val"]`` pickles as a layout over the graph's size-input names and is
# rebuilt as FakeTensors (over a fresh ShapeEnv when symbolic) on load.

# nodes and operators pickle as ``fxwrap.runtime.graph_records`` encodes them (the old
# names stay for programs pickled before that module existed)
_NodeRef, _OpRef = NodeRef, OpRef


@dataclass(frozen=True)
class _TensorSpec:
    size: tuple
    stride: tuple
    offset: Any
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True)
class _SymSpec:
    expr: Any
    hint: int


def _encode(value, names):
    return encode(value)


def _decode(value, nodes):
    return decode(value, nodes)


def _sym_expr(value, names):
    """An int / SymInt as a sympy expression over the graph's size-input names."""
    if isinstance(value, torch.SymInt):
        expr = sympy.sympify(value.node.expr)
        return expr.xreplace({s: names.get(s, s) for s in expr.free_symbols})
    return sympy.Integer(int(value))


def _encode_val(value, names):
    if isinstance(value, torch.Tensor):
        return _TensorSpec(tuple(_sym_expr(n, names) for n in value.shape),
                           tuple(_sym_expr(s, names) for s in value.stride()),
                           _sym_expr(value.storage_offset(), names), value.dtype, value.device)
    if isinstance(value, torch.SymInt):
        return _SymSpec(_sym_expr(value, names), int(value.node.hint))
    if isinstance(value, (tuple, list)):
        return type(value)(_encode_val(v, names) for v in value)
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return None  # not representable without the live objects it refers to


def _decode_val(value, symbolic: SymbolicValues):
    if isinstance(value, _TensorSpec):
        return symbolic.tensor(value.size, value.stride, value.offset, value.dtype, value.device)
    if isinstance(value, _SymSpec):
        return symbolic.value(value.expr)
    if isinstance(value, (tuple, list)):
        return type(value)(_decode_val(v, symbolic) for v in value)
    return value


_attr = attribute


def annotated_code(gm: torch.fx.GraphModule) -> str:
    """``gm.code`` with a comment naming the ATen nodes, source lines and modules
    (``provenance.describe``) above the line of every node that has
    ``meta["fxwrap_origins"]``::

        # exp, mm (model.py:12 in forward, fc)
        mm_out = torch.ops.aten.mm.out(buf0, arg1, out = buf1)
    """
    described = {n.name: describe(n.meta["fxwrap_origins"]) for n in gm.graph.nodes
                 if n.meta.get("fxwrap_origins")}
    out = []
    for line in gm.code.split("\n"):
        stripped = line.lstrip()
        name = stripped.split(" = ", 1)[0] if " = " in stripped else None
        if name in described:
            out.append(f"{line[:len(line) - len(stripped)]}# {described.pop(name)}")
        out.append(line)
    return "\n".join(out)


def _graph_state(gm: torch.fx.GraphModule) -> dict:
    names: dict[sympy.Symbol, sympy.Symbol] = {}  # ShapeEnv symbol -> size-input name
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and isinstance(val, torch.SymInt) and \
                isinstance(sympy.sympify(val.node.expr), sympy.Symbol):
            names[sympy.sympify(val.node.expr)] = sympy.Symbol(node.name, integer=True)
    records, attrs = [], {}
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            attrs[node.target] = _attr(gm, node.target)
        meta = {"val": _encode_val(node.meta["val"], names)} if "val" in node.meta else {}
        meta.update({k: v for k, v in node.meta.items()
                     if k != "val" and isinstance(v, (str, int, float, bool))})
        if node.meta.get("fxwrap_origins"):
            meta["fxwrap_origins"] = tuple(node.meta["fxwrap_origins"])
        records.append((node.op, node.name, _encode(node.target, names), _encode(node.args, names),
                        _encode(dict(node.kwargs), names), meta))
    return {"class_name": type(gm).__name__, "records": records, "attrs": attrs,
            "training": gm.training}


def _load_graph_module(state: dict) -> FxwrapGraphModule:
    graph = torch.fx.Graph()
    nodes: dict[str, torch.fx.Node] = {}
    symbolic = SymbolicValues()
    for op, name, target, args, kwargs, meta in state["records"]:
        node = graph.create_node(op, _decode(target, nodes), _decode(args, nodes),
                                 _decode(kwargs, nodes), name=name)
        nodes[name] = node
        val = meta.get("val")
        if op == "placeholder" and isinstance(val, _SymSpec) and isinstance(val.expr, sympy.Symbol):
            node.meta["val"] = symbolic.add_symbol(name, val.hint)
        elif "val" in meta:
            node.meta["val"] = _decode_val(val, symbolic)
        node.meta.update({k: v for k, v in meta.items() if k != "val"})
    gm = FxwrapGraphModule(state["attrs"], graph, class_name=state["class_name"])
    gm.train(state["training"])
    gm._fxwrap_kernels = tuple(dict.fromkeys(
        n.target for n in graph.nodes if n.op == "call_function" and isinstance(n.target, Kernel)))
    return gm
