"""The lowerer: one ATen graph -> a ``LoweredProgram`` (``lowered.py``), the record the
renderer (``render.py``) makes kernels and lines of.

Each node goes through its lowering rule where the target renders kernels (``rule_lowering``:
lazy loop IR, jobs, template jobs); every other node becomes a ``CallExtern`` (its out=
overload where it has one), a ``View`` (view ops), ``GetItem``s (multi-output ops), a
collective, or a nested program (``build_control_flow``, ``build_user_kernels``).  Frees and
reuse are added afterwards by ``core.memory``.
"""
from __future__ import annotations

import operator
from typing import Any

import sympy
import torch
import torch.fx

from fxwrap.core import extern
from fxwrap.core.lowering import Loops, loads
from fxwrap.ir.collectives import (
    IN_PLACE_COLLECTIVES, OUT_COLLECTIVES, CallCollective, WaitCollective, is_collective, is_wait,
)
from fxwrap.ir.symbolic import contiguous_strides, evaluate, simplest, to_expr
from fxwrap.ir.lines import (
    Allocate, Buffer, CallExtern, GetItem, Line, Return, SizeInput, View, buffers_defined, storage_offset_symbol,
)
from fxwrap.runtime.provenance import Origin
from fxwrap.wrapper_ir import build_control_flow, build_user_kernels
from fxwrap.wrapper_ir.journal import Journal, JournaledCount, JournaledDict, JournaledList, JournaledSet
from fxwrap.wrapper_ir.layouts import buffers_in_values, flatten, is_dense
from fxwrap.wrapper_ir.lowered import LoweredProgram, LoweringSettings
from fxwrap.wrapper_ir.origins import Origins

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
aten = torch.ops.aten
UNBACKED_SIZE_HINT = 8192  # planning estimate for a data-dependent size (as Inductor's)


class UnsupportedNode(NotImplementedError):
    """An FX node fxwrap cannot express; names the node, op and target."""


def plain_value(arg):
    """A non-node argument as the program holds it: a SymInt as its size expression."""
    if isinstance(arg, _SYM_TYPES):
        return simplest(to_expr(arg))
    return arg


class Lowerer:
    """One ATen graph -> a ``LoweredProgram``: each node through its lowering rule
    (``rules``: lazy loop IR, jobs, template jobs; None on a target that renders no
    kernels) or as an extern call, a view, a collective, a nested program.  Given::

        mm = aten.mm.default(arg0_1, arg1_1)
        relu = aten.relu.default(mm)

    on a target without kernels its items are the lines::

        buf0 = empty_strided((8, 16), (16, 1), dtype=torch.float32, device='cpu')
        aten.mm.out(arg0, arg1, out=buf0)
        buf1 = aten.relu.default(buf0)
        return (buf1,)

    and with the kernel rules ``aten.mm.out`` and a job storing ``relu(load(buf0))`` into
    ``buf1`` (a kernel once rendered).

    Its state is the program built so far, in journaled containers (``journal``): while a
    rule runs the journal is open, and a rule that declines is undone (``rules``).
    Control-flow subgraphs are compiled by ``compile_subprogram`` (the caller's: lowered
    and rendered as this program is), which the nested programs' code reaches through
    ``nesting.NestedLowering``.
    """

    def __init__(self, gm: torch.fx.GraphModule, settings: LoweringSettings, compile_subprogram,
                 rules_of=None):
        self.gm = gm
        self.settings = settings
        self.target_name = settings.target_name
        self.extern_nodes = settings.extern_nodes
        # a nested program (a cond branch, a loop body): one entry per result, the layout
        # (a Buffer) it must be returned in, or None (any layout); None: the top program
        self.output_layouts = settings.output_layouts
        self.compile_subprogram = compile_subprogram
        self.journal = journal = Journal()
        self.env: dict[torch.fx.Node, Any] = JournaledDict(journal)
        self.roots: dict[str, Buffer] = JournaledDict(journal)
        self.buffers: dict[str, Buffer] = JournaledDict(journal)
        self.items: list = JournaledList(journal)  # lines and Jobs in program order
        self.inputs: list[Buffer | SizeInput] = JournaledList(journal)
        self.constants: dict[str, torch.Tensor] = JournaledDict(journal)
        self.fake_values: dict[str, Any] = JournaledDict(journal)
        self.symbol_hints: dict[sympy.Symbol, int] = JournaledDict(journal)
        self.names = JournaledCount(journal)
        self.needed: set[sympy.Symbol] = JournaledSet(journal)  # size symbols the graph's values use
        # buffers whose storage the caller or an op chose (inputs, functional results):
        # their storage offset at run time may differ from the traced one
        self.foreign: set[str] = JournaledSet(journal)
        # buffer -> the storage offset its value had in the traced graph, for a buffer
        # stored at another offset (a lazy view of a larger tensor, stored on its own)
        self.traced_offsets: dict[str, sympy.Expr] = JournaledDict(journal)
        self.bound: set[sympy.Symbol] = JournaledSet(journal)  # symbols the program has a value for so far
        self.returned_roots: set[str] = JournaledSet(journal)  # storages a nested program returns so far
        # result of a collective (buffer name) -> the buffers that collective reads
        self.in_flight: dict[str, tuple[Buffer, ...]] = JournaledDict(journal)
        # the relations between size symbols the kernels rely on (``core.lowering.SizeAssumption``)
        self.size_assumptions: list = JournaledList(journal)
        self.current: torch.fx.Node | None = None  # the ATen node being lowered
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.origins = Origins(gm, journal)
        # the kernel rules (``rule_lowering.RuleLowering``), or None: every node an extern call
        self.rules = rules_of(self) if rules_of is not None else None

    @property
    def hints(self) -> dict[sympy.Symbol, int]:
        """A value for every size symbol the program uses so far (``BuiltProgram.hints``)."""
        hints = dict(self.symbol_hints)
        hints.update({i.symbol: i.hint for i in self.inputs if isinstance(i, SizeInput)})
        return hints

    def compile_nested(self, gm: torch.fx.GraphModule, name: str, output_layouts: tuple):
        """Subgraph ``gm`` (attribute ``name``) of a control-flow op, lowered and rendered as
        this program is: its ``BuiltProgram``."""
        return self.compile_subprogram(gm, self.settings.nested(name, output_layouts))

    def subgraph(self, name: str):
        """The graph module's attribute ``name`` (a control-flow op's subgraph)."""
        return getattr(self.gm, name)

    def assume_sizes(self, assumptions) -> None:
        """The program also relies on ``assumptions`` (a nested program's), each once."""
        self.size_assumptions += [a for a in assumptions if a not in self.size_assumptions]

    def foreign_buffer(self, fake: torch.Tensor) -> Buffer:
        """A new buffer whose storage an op (or the caller) chooses: its storage offset at run
        time may differ from the traced one, so views of it read the real offset."""
        buf = self.new_buffer(fake)
        self.foreign.add(buf.name)
        return buf

    def owns_storage(self, buf: Buffer) -> bool:
        """Whether ``buf`` is a whole storage of the program: not a view, not a constant."""
        return self.roots.get(buf.name) == buf and buf.name not in self.constants

    def position(self, node: torch.fx.Node) -> int:
        """``node``'s place in the graph."""
        return self.order[node]

    def user_kernel_emitter(self):
        """The target's ``KernelEmitter``, which launches user-written Triton kernels
        (``KernelEmitter.user_kernel``), or None: this lowerer makes no kernels (kernels=False)."""
        return self.rules.user_kernel_emitter() if self.rules is not None else None

    # -- naming -------------------------------------------------------------
    def fresh(self, prefix: str = "buf") -> str:
        return f"{prefix}{self.names.take()}"

    def new_buffer(self, fake: torch.Tensor, prefix: str = "buf") -> Buffer:
        buf = Buffer.from_fake(self.fresh(prefix), fake)
        self.fake_values[buf.name] = fake
        self.roots[buf.name] = buf
        self.buffers[buf.name] = buf
        return buf

    # -- values -------------------------------------------------------------
    def value(self, arg):
        """``arg`` (a node, a list of them, a number, a SymInt) as the program holds it: a
        lazy value put in memory (``rules.realize``), a size as its expression."""
        if isinstance(arg, torch.fx.Node):
            v = self.env[arg]
            if isinstance(v, Loops):
                v = self.rules.realize(arg, v)
            return v
        if isinstance(arg, (list, tuple)):
            return tuple(self.value(a) for a in arg)
        return plain_value(arg)

    def value_of(self, node: torch.fx.Node):
        """What ``node`` computed so far: a ``Buffer`` in memory or a lazy ``Loops``."""
        return self.env.get(node)

    def define(self, node: torch.fx.Node, value) -> None:
        """``node``'s value is ``value`` from now on."""
        self.env[node] = value

    def emit(self, line: Line) -> None:
        """Put ``line`` in the program (after the items so far; jobs become kernels when rendered)."""
        line = self.labelled(line)
        for buf in buffers_defined(line):
            self.buffers[buf.name] = buf
        self.items.append(line)

    def origin_of(self, node: torch.fx.Node) -> Origin:
        """The provenance of ATen node ``node`` (``provenance.origin_of``, once per node)."""
        return self.origins.origin_of(node)

    def labelled(self, line: Line) -> Line:
        """``line`` computing the node being lowered, where it is a call (``Line.with_origins``)."""
        if self.current is None:
            return line
        return line.with_origins((self.origin_of(self.current),))

    # -- size symbols -------------------------------------------------------
    def storage_offset_of(self, base: Buffer) -> sympy.Symbol:
        """A symbol holding ``base``'s storage offset, read when the program runs."""
        sym = storage_offset_symbol(base)
        if sym not in self.bound:
            self.emit(CallExtern(aten.sym_storage_offset.default, (base,), (), sym.name))
            self.bound.add(sym)
            self.symbol_hints[sym] = evaluate(base.offset, self.hints)
        return sym

    def layout_bound(self, fake: torch.Tensor) -> bool:
        """True when every symbol in ``fake``'s size, stride and offset has a value."""
        return _layout_symbols(fake) <= self.bound

    def bind_layout(self, buf: Buffer) -> None:
        """Read symbols the program needs but has no value for off ``buf``'s layout.

        A backward graph gets its saved activations but not always the symbols their
        sizes use; an op with a data-dependent result size (``nonzero``) defines an
        unbacked symbol only through its result.  ``s0 = aten.sym_size.int(arg3, 0)``
        gives the program that value.
        """
        reads = [(aten.sym_size.int, (buf, d), e) for d, e in enumerate(buf.size)]
        reads += [(aten.sym_stride.int, (buf, d), e) for d, e in enumerate(buf.stride)]
        reads.append((aten.sym_storage_offset.default, (buf,), buf.offset))
        for op, args, expr in reads:
            if isinstance(expr, sympy.Symbol) and expr in self.needed and expr not in self.bound:
                self.emit(CallExtern(op, args, (), expr.name))
                self.bound.add(expr)

    def _collect_symbols(self) -> None:
        shape_env = None
        for node in self.gm.graph.nodes:
            val = node.meta.get("val")
            if node.op != "placeholder":
                self.needed |= _value_symbols(val)
                self.needed |= _value_symbols(list(node.args) + list(node.kwargs.values()))
            shape_env = shape_env or _shape_env_of(val)
        all_symbols = set(self.needed)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                all_symbols |= _value_symbols(node.meta.get("val"))
        for sym in sorted(all_symbols, key=lambda s: s.name):
            hint = _symbol_hint(shape_env, sym) if shape_env is not None else None
            # An unbacked symbol (nonzero's result size) has no value until the program
            # runs; memory planning estimates with Inductor's fallback for it.
            self.symbol_hints[sym] = hint if hint is not None else UNBACKED_SIZE_HINT

    # -- nodes --------------------------------------------------------------
    def lower(self) -> LoweredProgram:
        """Walk the graph; the frozen record of what was built."""
        self._collect_symbols()
        n_inputs = 0
        inputs_done = False
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node, n_inputs)
                n_inputs += 1
                continue
            if not inputs_done:
                inputs_done = True
                for inp in list(self.inputs):
                    if isinstance(inp, Buffer):
                        self.bind_layout(inp)
            if node.op == "get_attr":
                tensor = getattr(self.gm, node.target)
                if isinstance(tensor, torch.fx.GraphModule):
                    # The subgraph of a higher-order op (torch.cond's branches): compiled
                    # into a nested program (build_control_flow), or, where the op stays an
                    # extern call, a constant of the program passed to the op by name.
                    self.env[node] = node.target
                    continue
                if not isinstance(tensor, torch.Tensor):
                    raise UnsupportedNode(
                        f"node {node.name}: attribute {node.target!r} is a {type(tensor).__name__}, "
                        f"neither a tensor nor a subgraph (target {self.target_name})")
                buf = self.new_buffer(tensor, prefix="const")
                self.constants[buf.name] = tensor
                self.env[node] = buf
            elif node.op == "call_function":
                self.current = node
                self.call_function(node)
                self.current = None
            elif node.op == "output":
                values = node.args[0]
                if isinstance(values, torch.fx.Node):  # a while_loop condition returns its bool itself
                    self.emit(Return((self.output_value(values, 0),), bare=True))
                else:
                    self.emit(Return(tuple(self.output_value(v, i) for i, v in enumerate(values))))
            else:
                raise UnsupportedNode(f"node {node.format_node()}: op {node.op!r} is not supported "
                                      f"on target {self.target_name}")
        return LoweredProgram(self.settings, tuple(self.inputs), tuple(self.items), self.buffers, self.roots,
                              self.constants, self.fake_values, self.symbol_hints,
                              {name: tuple(lines) for name, lines in
                               (self.rules.template_externs if self.rules is not None else {}).items()},
                              self.origins.positions, self.names.value, tuple(self.size_assumptions))

    # -- results of nested programs ------------------------------------------
    def output_value(self, arg, index: int):
        """Result ``index`` of the program.  In a nested program (``output_layouts`` set) it
        is a buffer of its own, never an input's, a constant's or another result's storage
        (a control-flow op's results are fresh tensors), in the layout asked for: a copy
        where the value is not (a lazy value is computed straight into that layout)."""
        if self.output_layouts is None:
            return self.value(arg)
        layout = self.output_layouts[index]
        lazy = self.env.get(arg) if isinstance(arg, torch.fx.Node) else None
        if layout is not None and isinstance(lazy, Loops) and not self.rules.is_lazy_view(arg):
            # computed straight into the layout the result must have: no copy
            dst = self.fresh_buffer_like(layout)
            self.rules.pointwise_job(dst, lazy, [arg.name])
            self.returned_roots.add(dst.name)
            return dst
        value = self.value(arg)
        if not isinstance(value, Buffer):
            raise UnsupportedNode(f"a nested program's result {arg} is a {type(value).__name__}, not a "
                                  f"tensor (target {self.target_name})")
        root = self.roots[value.name].name
        inputs = {b.name for b in self.inputs if isinstance(b, Buffer)}
        fits = layout is None or (tuple(value.size), tuple(value.stride), value.dtype) == \
            (tuple(layout.size), tuple(layout.stride), layout.dtype)
        if fits and root not in inputs and root not in self.constants and root not in self.returned_roots:
            self.returned_roots.add(root)
            return value
        dst = self.fresh_buffer_like(layout if layout is not None else value)
        self.copy_into(dst, value, arg)
        self.returned_roots.add(dst.name)
        return dst

    def fresh_buffer_like(self, layout: Buffer) -> Buffer:
        """A new buffer of ``layout``'s size, dtype and device, with its strides where they
        are dense, else row-major ones, at offset 0."""
        stride = layout.stride if is_dense(layout, self.hints) else contiguous_strides(layout.size)
        buf = Buffer(self.fresh(), tuple(layout.size), tuple(stride), layout.dtype, layout.device)
        self.roots[buf.name] = buf
        self.buffers[buf.name] = buf
        return buf

    def copy_into(self, dst: Buffer, src: Buffer, origin=None) -> None:
        """``dst`` (new, unallocated) gets ``src``'s values: a copy kernel (``origin``: the node
        whose value it copies), or without kernel rules an allocation and ``aten.copy_``."""
        if self.rules is not None:
            self.rules.pointwise_job(dst, loads(src), [origin.name] if isinstance(origin, torch.fx.Node) else [])
            return
        self.emit(Allocate(dst))
        self.emit(CallExtern(aten.copy_.default, (dst, src), (), None))

    def placeholder(self, node: torch.fx.Node, index: int) -> None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            buf = Buffer.from_fake(f"arg{index}", val)
            self.fake_values[buf.name] = val
            self.roots[buf.name] = buf
            self.buffers[buf.name] = buf
            self.foreign.add(buf.name)
            self.inputs.append(buf)
            self.env[node] = buf
        elif isinstance(val, torch.SymInt) and isinstance(to_expr(val), sympy.Symbol):
            sym = to_expr(val)
            self.inputs.append(SizeInput(sym, int(val.node.hint)))
            self.env[node] = sym
            self.bound.add(sym)
        elif isinstance(val, torch.SymInt):
            # A size expression passed in (a backward graph's saved ``s0 // 2``): the
            # program takes it under its own name; its uses compute it from the
            # symbols, which the tensor inputs' sizes provide (see bind_layout).
            expr = to_expr(val)
            hint = val.node.hint
            if hint is None:
                hint = evaluate(expr, self.symbol_hints)
            self.inputs.append(SizeInput(sympy.Symbol(f"arg{index}", integer=True), int(hint)))
            self.env[node] = simplest(expr)
        elif isinstance(val, (int, float, bool)) or val is None:
            # A non-symbolic scalar input: keep it a program input under its own name.
            sym = sympy.Symbol(f"arg{index}", integer=True)
            self.inputs.append(SizeInput(sym, int(val or 0)))
            self.env[node] = sym
            self.bound.add(sym)
        else:
            raise UnsupportedNode(f"graph input {node.name} with value {val!r} is not supported "
                                  f"on target {self.target_name}")

    def call_function(self, node: torch.fx.Node) -> None:
        """``node`` through its kernel rule (``rules``), else ``lower_extern``."""
        if self.rules is None or not self.rules.lower(node):
            self.lower_extern(node)

    def lower_extern(self, node: torch.fx.Node) -> None:
        """``node`` as what it is in ATen: an extern call (its out= form where the result is
        the program's to allocate), a view, a collective, a nested program, a size."""
        target = node.target
        val = node.meta.get("val")
        if target is operator.getitem:
            self.env[node] = self.value(node.args[0])[node.args[1]]
            return
        if isinstance(val, _SYM_TYPES) or (not isinstance(target, torch._ops.OpOverload)
                                            and isinstance(val, (int, float, bool))):
            # Size arithmetic (sym_size, operator.mul on SymInts): an expression.
            if isinstance(val, torch.SymInt) and to_expr(val).free_symbols <= self.bound:
                self.env[node] = simplest(to_expr(val))
                return
            if not isinstance(val, _SYM_TYPES):
                self.env[node] = val
                return
            if not isinstance(target, torch._ops.OpOverload):
                # Host scalar arithmetic that is not a size expression (a backward
                # graph's ``1.0 / (s0 * 16 / 16)`` for a mean): the same Python call at
                # run time, on the program's values.
                name = self._scalar_name(val)
                args = self.value(node.args)
                kwargs = tuple((k, self.value(v)) for k, v in node.kwargs.items())
                self.emit(CallExtern(target, args, kwargs, name))
                self.env[node] = self._scalar_value(name, val)
                return
        if not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket,
                                   torch._ops.HigherOrderOperator)):
            raise UnsupportedNode(
                f"node {node.name}: {target} is not an ATen op; fxwrap lowers ATen/prims graphs "
                f"(target {self.target_name}). Register a lowering with the fxwrap_lowerings hook "
                "or keep this call outside the compiled region.")
        if target in build_control_flow.CONTROL_FLOW_OPS and build_control_flow.build(self, node):
            return
        if build_user_kernels.is_user_kernel_launch(target):
            build_user_kernels.build(self, node)
            return
        if isinstance(target, torch._ops.HigherOrderOperator):
            for arg in node.all_input_nodes:  # its subgraphs, passed as they are
                if arg.op == "get_attr" and isinstance(getattr(self.gm, arg.target), torch.fx.GraphModule):
                    self.constants[arg.target] = getattr(self.gm, arg.target)
        if is_collective(target):
            self.collective(node, target, val)
            return
        if extern.in_place_write(target) is not None and self._writes_into_copy(node, target, val):
            return
        args = self.value(node.args)
        kwargs = tuple((k, self.value(v)) for k, v in node.kwargs.items())
        if is_wait(target):
            self.wait(node, args, val)
        elif extern.is_view(target) and isinstance(val, torch.Tensor) and self._as_strided_view(args, val):
            self.view(node, args, val)
        elif (extern.is_view(target) and isinstance(val, (tuple, list)) and val
              and all(isinstance(v, torch.Tensor) and self._as_strided_view(args, v) for v in val)):
            self.env[node] = tuple(self.view_buffer(args, v) for v in val)  # split, unbind: a View each
        elif extern.is_mutating(target):
            self.mutating(node, target, args, kwargs, val)
        else:
            self.functional(node, target, args, kwargs, val)

    # -- collectives ------------------------------------------------------------
    def collective(self, node, op, val) -> None:
        """An ``_c10d_functional`` collective: a ``CallCollective`` whose results (one
        buffer, or a list read through ``GetItem``s; for an in-place form, the argument
        it writes) a ``wait_tensor`` makes ready later.

        ``all_reduce`` / ``broadcast`` become their in-place forms on a buffer the program
        allocates (the op would clone its input into storage of its own): the buffer is
        computed straight from a lazy input, or a copy of a stored one::

            buf1 = empty_strided((8, 8), (8, 1), ...)
            fxwrap_pointwise_0(arg0, buf1)           # x * 2, into the collective's buffer
            _c10d_functional.all_reduce_.default(buf1, 'sum', '0')  # collective

        ``all_gather_into_tensor`` writes into an allocated buffer (its out= form): both are
        planned like any buffer (``core.memory``)."""
        if extern.is_mutating(op):  # all_reduce_ in the graph: what reads its argument runs first
            self.write_barrier(node)
        kwargs = tuple((k, self.value(v)) for k, v in node.kwargs.items())
        in_place = IN_PLACE_COLLECTIVES.get(op)
        out_form = OUT_COLLECTIVES.get(op)
        if in_place is not None and isinstance(val, torch.Tensor) and self.layout_bound(val):
            dst = self.fresh_buffer_like(Buffer.from_fake("", val))
            self.fake_values[dst.name] = val
            self.private_copy(dst, node.args[0])
            op, args = in_place, (dst, *self.value(tuple(node.args[1:])))
        elif out_form is not None and isinstance(val, torch.Tensor) and self.layout_bound(val) \
                and is_dense(Buffer.from_fake("", val), self.hints):
            args = self.value(node.args)
            dst = self.new_buffer(val)
            self.emit(Allocate(dst))
            op, kwargs = out_form, kwargs + (("out", dst),)
        else:
            args = self.value(node.args)
        reads = tuple(dict.fromkeys(buffers_in_values(args, kwargs)))
        if extern.is_mutating(op):  # all_reduce_, broadcast_, *_out: results alias arguments
            self.emit(CallCollective(op, args, kwargs, None))
            results = []
            for ret in op._schema.returns:
                wanted = ret.alias_info.before_set if ret.alias_info is not None else None
                index = next(i for i, a in enumerate(op._schema.arguments)
                             if a.alias_info is not None and a.alias_info.before_set == wanted)
                arg = op._schema.arguments[index]
                results.append(args[index] if index < len(args) and not arg.kwarg_only
                               else dict(kwargs)[arg.name])
            value = results[0] if len(results) == 1 else tuple(results)
        elif isinstance(val, torch.Tensor):
            value = self.foreign_buffer(val)
            self.emit(CallCollective(op, args, kwargs, value))
            self.bind_layout(value)
        else:
            name = self.fresh("tuple")
            self.emit(CallCollective(op, args, kwargs, name))
            items = []
            for i, r in enumerate(val):
                buf = self.foreign_buffer(r)
                self.emit(GetItem(buf, name, i))
                self.bind_layout(buf)
                items.append(buf)
            value = tuple(items)
        for buf in (value if isinstance(value, tuple) else (value,)):
            for b in (buf if isinstance(buf, (list, tuple)) else (buf,)):
                self.in_flight[b.name] = reads
        self.env[node] = value

    def _writes_into_copy(self, node, op, val) -> bool:
        """A functional indexed write (``extern.in_place_write``) as eager runs it: ``self``
        copied into a buffer of the program (with kernel rules a lazy ``self`` is computed
        straight into it), then the in-place op on that buffer::

            buf1 = empty_strided((1000, 64), (64, 1), ...)
            fxwrap_pointwise_0(buf1)                                  # full: zeros
            aten.index_put_.default(buf1, (buf2,), buf3, True)        # index_put

        False (nothing emitted) where the result's layout is not the program's to choose."""
        if not (isinstance(val, torch.Tensor) and self.layout_bound(val) and node.args
                and isinstance(node.args[0], torch.fx.Node)) or node.name in self.extern_nodes:
            return False
        dst = Buffer.from_fake("", val)
        if not is_dense(dst, self.hints):
            return False
        dst = self.fresh_buffer_like(dst)
        self.fake_values[dst.name] = val
        self.private_copy(dst, node.args[0])
        args = (dst, *self.value(tuple(node.args[1:])))
        kwargs = tuple((k, self.value(v)) for k, v in node.kwargs.items())
        self.emit(CallExtern(extern.in_place_write(op), args, kwargs, None))
        self.env[node] = dst
        return True

    def private_copy(self, dst: Buffer, arg) -> None:
        """``dst`` (new) gets the value of graph argument ``arg``, for a collective to work on
        in place: a lazy value read only here computed straight into it, else a copy."""
        lazy = self.env.get(arg) if isinstance(arg, torch.fx.Node) else None
        if isinstance(lazy, Loops) and not self.rules.is_lazy_view(arg) and len(arg.users) == 1:
            self.rules.pointwise_job(dst, lazy, [arg.name])  # computed straight into dst: no copy
            return
        self.copy_into(dst, self.value(arg), arg)

    def wait(self, node, args, val) -> None:
        """``wait_tensor(t)``: a ``WaitCollective`` defining the ready value (``t``'s storage)."""
        tensor = args[0]
        if not isinstance(tensor, Buffer) or not isinstance(val, torch.Tensor):
            raise UnsupportedNode(f"node {node.name}: wait_tensor of {tensor!r}, not a tensor of the "
                                  f"program (target {self.target_name})")
        in_flight = tuple(b for b in self.in_flight.get(tensor.name, ()) if b.name != tensor.name)
        buf = self.foreign_buffer(val)
        self.emit(WaitCollective(buf, tensor, in_flight))
        self.env[node] = buf

    def _argument(self, op, node: torch.fx.Node, index: int):
        arg = op._schema.arguments[index]
        if index < len(node.args):
            return self.value(node.args[index])
        return self.value(node.kwargs[arg.name])

    def _as_strided_view(self, args, val: torch.Tensor) -> bool:
        """Whether a view op's result is ``as_strided`` of its source's storage.

        Not when the view reinterprets the dtype (``view.dtype``, ``view_as_real``):
        ``as_strided`` keeps the base's dtype; and not when its layout uses a symbol
        the program has no value for yet.  Those views stay calls of the op.
        """
        source = next((a for a in flatten(args) if isinstance(a, Buffer)), None)
        if source is None or self.roots[source.name].dtype != val.dtype or not self.layout_bound(val):
            return False
        # ``_conj`` / ``_neg_view`` set a lazy conjugate / negative bit that
        # ``as_strided`` drops; a base carrying such a bit would give it to the view.
        base_fake = self.fake_values.get(self.roots[source.name].name)
        flagged = [t for t in (val, base_fake) if isinstance(t, torch.Tensor)]
        return not any(t.is_conj() or t.is_neg() for t in flagged)

    def view(self, node: torch.fx.Node, args, val: torch.Tensor) -> None:
        self.env[node] = self.view_buffer(args, val)

    def view_buffer(self, args, val: torch.Tensor) -> Buffer:
        """A ``View`` line of the view op's result ``val`` (one result of ``split`` / ``unbind``
        is one) over its source's storage, and its buffer::

            split_with_sizes(buf13, [16, 16], -1)  ->  buf15 = as_strided(buf11, (1, 8, 1, 16), (256, 32, 256, 1), 0)
                                                        buf16 = as_strided(buf11, (1, 8, 1, 16), (256, 32, 256, 1), 16)
        """
        source = next(a for a in flatten(args) if isinstance(a, Buffer))
        base = self.roots[source.name]
        buf = Buffer.from_fake(self.fresh(), val)
        if base.name in self.foreign:
            # The base's storage offset at run time is the caller's (or the op's), not
            # necessarily the traced one, symbolic or not (guards do not cover it; a
            # backward graph's tangents are fresh tensors, and its saved activations are
            # what the forward program made, maybe a buffer of their own where the traced
            # forward had a view): place the view relative to the real offset.
            offset = self.storage_offset_of(base) + (buf.offset - base.offset)
            buf = Buffer(buf.name, buf.size, buf.stride, buf.dtype, buf.device, offset)
        elif base.name in self.traced_offsets:
            # the base holds its own elements, at its offset instead of the traced one
            offset = base.offset + (buf.offset - self.traced_offsets[base.name])
            buf = Buffer(buf.name, buf.size, buf.stride, buf.dtype, buf.device, offset)
        self.fake_values[buf.name] = val
        self.roots[buf.name] = base
        self.emit(View(buf, base))
        return buf

    def mutating(self, node, op, args, kwargs, val) -> None:
        """An op that writes some arguments (``copy_``, ``add_``, out= calls).

        Each result that aliases a written argument is that argument's buffer; a
        result the op makes fresh (``_native_batch_norm_legit``'s output beside the
        running stats it updates) is read from the call's result.
        """
        if op is aten.copy_.default and len(args) >= 2 and isinstance(args[0], Buffer) and args[0] == args[1]:
            self.env[node] = args[0]  # a buffer copied into itself: nothing to do
            return
        self.write_barrier(node)
        schema = op._schema
        aliased: list = []
        for ret in schema.returns:
            arg_index = None
            if ret.alias_info is not None:
                arg_index = next((i for i, a in enumerate(schema.arguments)
                                  if a.alias_info is not None
                                  and a.alias_info.before_set == ret.alias_info.before_set), None)
            aliased.append(arg_index)
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        if all(i is not None for i in aliased) or not any(isinstance(v, torch.Tensor) for v in vals):
            self.emit(CallExtern(op, args, kwargs, None))
            results = [self._argument(op, node, i) if i is not None else None for i in aliased]
        else:
            name = self.fresh("tuple") if len(schema.returns) > 1 else None
            if name is None:
                buf = self.foreign_buffer(val)
                self.emit(CallExtern(op, args, kwargs, buf))
                self.bind_layout(buf)
                results = [buf]
            else:
                self.emit(CallExtern(op, args, kwargs, name))
                results = [self._argument(op, node, index) if index is not None else self._result_item(name, i, v)
                           for i, (index, v) in enumerate(zip(aliased, vals))]
        if not schema.returns:
            self.env[node] = None
        elif len(schema.returns) == 1 and not isinstance(val, (tuple, list)):
            self.env[node] = results[0]
        else:
            self.env[node] = tuple(results)

    def _result_item(self, name: str, i: int, value):
        """Item ``i`` of the tuple an extern call returned as ``name``: a tensor read out into a
        buffer of its own (``GetItem``), a number as a scalar, None as None."""
        if isinstance(value, torch.Tensor):
            buf = self.foreign_buffer(value)
            self.emit(GetItem(buf, name, i))
            self.bind_layout(buf)
            return buf
        return None if value is None else self._scalar_item(name, i, value)

    def write_barrier(self, node: torch.fx.Node) -> None:
        """A write is a barrier: every value made before ``node`` and used after it is
        materialized now, so it holds what it held at its place in the program.

        Here every value already is a buffer; with kernel rules, values kept lazy (loop
        IR inlined into later kernels) become buffers through ``value``,
        so ``x.add_(1); return x * 2`` does not compute ``x * 2`` from the written x.
        """
        for earlier in node.graph.nodes:
            if earlier is node:
                break
            if earlier in self.env and any(self.order[u] > self.order[node] for u in earlier.users):
                self.value(earlier)

    def functional(self, node, op, args, kwargs, val) -> None:
        results = list(val) if isinstance(val, (tuple, list)) else [val]
        devices = {r.device.type for r in results if isinstance(r, torch.Tensor)}
        variant = extern.native_out_variant(op, devices.pop()) if len(devices) == 1 else None
        hints = self.hints
        if (variant is not None and all(isinstance(r, torch.Tensor) for r in results)
                and all(self.layout_bound(r) for r in results)):
            bufs = [self.new_buffer(r) for r in results]
            if all(is_dense(b, hints) for b in bufs):
                for b in bufs:
                    self.emit(Allocate(b))
                out_kwargs = tuple(zip(variant.out_names, bufs))
                self.emit(CallExtern(variant.op, args, kwargs + out_kwargs, None))
                self.env[node] = bufs[0] if not isinstance(val, (tuple, list)) else tuple(bufs)
                return
            for b in bufs:  # not dense: let the op pick its own storage
                del self.roots[b.name]
                del self.fake_values[b.name]
        if isinstance(val, torch.Tensor):
            buf = self.foreign_buffer(val)
            self.emit(CallExtern(op, args, kwargs, buf))
            self.bind_layout(buf)
            self.env[node] = buf
        elif isinstance(val, (tuple, list)):
            name = self.fresh("tuple")
            self.emit(CallExtern(op, args, kwargs, name))
            self.env[node] = tuple(self._result_item(name, i, r) for i, r in enumerate(val))
        else:
            name = self._scalar_name(val)
            self.emit(CallExtern(op, args, kwargs, name))
            self.env[node] = self._scalar_value(name, val)

    def _scalar_name(self, val) -> str:
        if isinstance(val, torch.SymInt) and isinstance(to_expr(val), sympy.Symbol) \
                and to_expr(val) not in self.bound:
            return to_expr(val).name
        return self.fresh("scalar")

    def _scalar_value(self, name: str, val):
        if isinstance(val, torch.SymInt):
            sym = sympy.Symbol(name, integer=True)
            if name == str(to_expr(val)):
                sym = to_expr(val)  # the symbol itself (same assumptions), now defined
                self.bound.add(sym)
            return sym
        return name

    def _scalar_item(self, src: str, index: int, val):
        name = self._scalar_name(val)
        self.emit(GetItem(name, src, index))
        return self._scalar_value(name, val)


def _layout_symbols(fake: torch.Tensor) -> set[sympy.Symbol]:
    return _value_symbols(fake)


def _value_symbols(value) -> set[sympy.Symbol]:
    """Free size symbols of a meta value (FakeTensor, SymInt, or nested lists of them)."""
    found: set[sympy.Symbol] = set()
    if isinstance(value, torch.Tensor):
        parts = (*value.shape, *value.stride(), value.storage_offset())
    elif isinstance(value, (list, tuple)):
        for v in value:
            found |= _value_symbols(v)
        return found
    elif isinstance(value, dict):
        return _value_symbols(list(value.values()))
    else:
        parts = (value,)
    for p in parts:
        if isinstance(p, torch.SymInt):
            found |= to_expr(p).free_symbols
    return found


def _shape_env_of(value):
    if isinstance(value, torch.Tensor):
        mode = getattr(value, "fake_mode", None)
        return getattr(mode, "shape_env", None)
    if isinstance(value, torch.SymInt):
        return value.node.shape_env
    if isinstance(value, (list, tuple)):
        for v in value:
            env = _shape_env_of(v)
            if env is not None:
                return env
    return None


def _symbol_hint(shape_env, sym: sympy.Symbol) -> int | None:
    backed = "backed_var_to_val" if hasattr(shape_env, "backed_var_to_val") else "var_to_val"
    for table in (backed, "unbacked_var_to_val"):
        known = getattr(shape_env, table, None) or {}
        if sym in known:
            try:
                return int(known[sym])
            except TypeError:
                continue
    return None
