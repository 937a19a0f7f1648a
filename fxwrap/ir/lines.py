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

Every line is a frozen, hashable dataclass that carries its own behaviour (see
``Line``): what it reads, writes and defines, its text (``to_source``) and its FX
nodes (``to_fx``).  ``wrapper_ir.fx`` turns the list into a ``torch.fx.GraphModule``
and ``wrapper_ir.printer`` into the text above by asking each line; no pass switches
on a line's type, so a new line type is one class.  This module imports no pass: the
printer and the converter are passed in, and a line calls back into them.
"""
from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import sympy
import torch

from fxwrap.ir.line_hosts import LineConverter, LinePrinter
from fxwrap.ir.symbolic import storage_elements, to_expr, to_exprs
from fxwrap.runtime.provenance import Origin


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



def storage_offset_symbol(buf: "Buffer") -> sympy.Symbol:
    """The symbol a program reads ``buf``'s storage offset into when it runs
    (``buf0_offset = aten.sym_storage_offset.default(buf0)``)."""
    return sympy.Symbol(f"{buf.name}_offset", integer=True, nonnegative=True)


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
    """Base of every Wrapper IR line: a frozen record that carries its own behaviour.

    Passes ask a line, never its type.  A new kind of line is one subclass that
    overrides what differs from these defaults (a line that touches no buffer and
    has no text or FX form has nothing to override but ``to_source`` / ``to_fx``):

    * ``reads()``: the existing buffers it uses (reads, or writes into), in order;
      ``writes()``: those whose contents it changes; ``defines()``: the buffers it
      brings into existence; ``defines_values()`` / ``defines_symbols()``: the names
      of the other values it introduces (tuple or scalar results, host sizes);
      ``size_exprs()``: the size expressions whose values it needs.
    * ``to_source(printer)``: its text in ``Program.code()``, built with the
      printer's ``fmt`` / ``call`` / ``op_name`` (``wrapper_ir/printer.py``).
    * ``to_fx(converter)``: adds its FX nodes through the converter's ``add``,
      ``arg``, ``node``, ``bind`` ... (``wrapper_ir/fx.py``), the way Inductor's
      ``WrapperLine.codegen_fx`` does.
    * The memory planner's, scheduler's and guards' questions, as class
      attributes and small methods below (``allocates``, ``view_base``,
      ``alias_of`` ...).

    The defaults describe a line that touches nothing: it reads, writes and defines
    no buffer, and is a barrier to moving kernels across it.  With no
    ``to_source`` or ``to_fx`` of its own, printing or converting it is an error
    that names it.
    """

    #: The buffers it defines get storage the program allocated itself, of known
    #: size: the memory planner may hand that storage on once they are dead.
    allocates = False
    #: The buffers it reads leave the program (its outputs): never freed.
    returns_reads = False
    #: It says something about the next line (a ``Comment``): dropped with it.
    annotates_next = False
    #: Its ``in_place_pairs`` are proven at the offsets (a kernel loads each paired input
    #: at exactly the offsets it stores the output at), so a paired input that starts where
    #: the output does may have other sizes and strides (a matmul result read reshaped);
    #: otherwise the memory planner takes a paired input only with the output's layout.
    in_place_by_offset = False
    #: It runs code compiled for one device, so every buffer it reads must be on
    #: that device (an extern call dispatches on its arguments' own devices).
    binds_device = False
    #: A fused kernel may not move up across it (the scheduler's hoisting).
    fusion_barrier = True
    #: It only reads metadata (a view, a size or storage-offset read): it computes
    #: nothing and writes nothing, so it may move up to wherever its operands exist
    #: (the scheduler lifts such a line above a kernel that needs what it defines).
    metadata_only = False
    #: It launches nothing and reads no value (a view, a free, a comment): graph capture's
    #: partition pass puts it with the lines around it (``wrapper_ir/partitions.py``).
    capture_neutral = False

    def reads(self) -> list[Buffer]:
        """Existing buffers the line uses (reads, or writes into), in order."""
        return []

    def writes(self) -> list[Buffer]:
        """Buffers whose contents the line changes (a kernel's output and in-out
        arguments, an extern's ``out=`` and mutated arguments, its result)."""
        return []

    def defines(self) -> list[Buffer]:
        """Buffers the line brings into existence."""
        return []

    def defines_values(self) -> list[str]:
        """Names of the non-buffer values it introduces (a tuple or a scalar result),
        which later lines use as plain strings (``GetItem.src``, arguments)."""
        return []

    def defines_symbols(self) -> list[sympy.Symbol]:
        """Size symbols it gives a value to."""
        return []

    def size_exprs(self) -> list[sympy.Expr]:
        """Size expressions whose values the line needs (not those it defines)."""
        return []

    @property
    def view_base(self) -> Buffer | None:
        """For a line that only reinterprets existing storage (``View``): the buffer
        owning it.  Such a line computes nothing; unread, it is dropped."""
        return None

    def alias_of(self, producers: Mapping[str, "Line"]) -> Buffer | None:
        """The buffer whose storage the buffer it defines shares (a view, or an op
        result that aliases an argument), or None when it has storage of its own.
        ``producers``: the line that defined each value name so far."""
        return self.view_base

    def result_alias(self, index: int) -> Buffer | None:
        """The argument buffer that result ``index`` of the value it defines aliases."""
        return None

    @property
    def may_return_alias(self) -> bool:
        """Its result may alias any buffer it reads (storage it reads is never reused)."""
        return False

    @property
    def is_device_check(self) -> bool:
        """A check of its arguments that changes nothing and, on an accelerator, asserts
        on the device without reading back (``check_index_bounds``)."""
        return False

    def in_place_pairs(self) -> list[tuple[Buffer, Buffer]]:
        """``(input, output)`` pairs of buffers it reads and writes where the output may
        take the input's storage when the input dies at this line: each element of the
        input is read only to compute the same element of the output, before that
        element is written (the memory planner's in-place reuse)."""
        return []

    def host_readback(self) -> str | None:
        """Why the line needs a device value on the host (which a captured CUDA graph
        cannot replay), or None."""
        return None

    def capture_refusal(self, device_type: str) -> str | None:
        """Why a recorded replay of the line (graph capture on a ``device_type`` device) would
        not compute what running it computes, or None: a value it reads back to the host
        (``host_readback``), or a buffer it uses that lives on another device."""
        reason = self.host_readback()
        if reason is not None:
            return reason
        for buf in self.reads() + self.defines():
            if buf.device.type != device_type:
                return f"{self.label} uses {buf.name} on {buf.device.type}, not on the {device_type} device"
        return None

    @property
    def label(self) -> str:
        """How messages name the line."""
        return type(self).__name__

    def to_source(self, printer: LinePrinter) -> str:
        """Its text in the printed program (``wrapper_ir.printer.Printer``)."""
        return printer.unknown(self)

    def to_fx(self, converter: LineConverter) -> None:
        """Add its FX nodes to ``converter`` (``wrapper_ir.fx.FxConverter``)."""
        converter.unknown(self)

    #: The ATen nodes it computes (``provenance.Origin``): kernel and extern calls only;
    #: memory-planning lines compute nothing and carry none.
    origins = ()
    #: The ``fxwrap.Kernel`` it defines or launches (``DefineKernel``, ``CallKernel``), else None.
    #: (A subclass declares its own as ``kernel: Any = field()``: a dataclass would take this
    #: class attribute as the field's default.)
    kernel = None
    #: The value name it takes an item of (``GetItem``), else None.
    src = None
    #: The operator it calls (``CallExtern``: an ATen or custom op; ``WaitCollective``), else None.
    op = None
    #: It issues a communication whose result is ready at its ``WaitCollective``
    #: (``core/overlap.py`` raises it and keeps the issue order).
    issues_collective = False
    #: It waits for a communication (``core/overlap.py`` sinks it to its first reader).
    waits_collective = False

    @property
    def programs(self) -> tuple:
        """The nested programs it runs (``Conditional``, ``WhileLoop``: ``control_flow.NestedProgram``)."""
        return ()

    def scratch(self) -> list[Buffer]:
        """The workspace buffers among what it writes: written, meaningless after it (the
        debug modes check and print the other buffers it writes)."""
        return []

    def with_origins(self, origins: tuple[Origin, ...]) -> "Line":
        """This line computing ``origins``, where it is a line that computes (a call
        without origins yet); any other line as it is."""
        return self


def _layout_exprs(buf: Buffer) -> list[sympy.Expr]:
    return [*buf.size, *buf.stride, buf.offset]


def _exprs_in(value) -> list[sympy.Expr]:
    if isinstance(value, (list, tuple)):
        return [e for v in value for e in _exprs_in(v)]
    return [value] if isinstance(value, sympy.Expr) else []


@dataclass(frozen=True)
class Allocate(Line):
    """``buf0 = empty_strided(size, stride, dtype=, device=)``: new storage."""

    buf: Buffer

    allocates = True
    fusion_barrier = False

    def defines(self):
        return [self.buf]

    def size_exprs(self):
        return _layout_exprs(self.buf)

    def to_source(self, printer: LinePrinter):
        b = self.buf
        return (f"{b.name} = empty_strided({printer.fmt(b.size)}, {printer.fmt(b.stride)}, "
                f"dtype={b.dtype}, device={printer.fmt(b.device)})")

    def to_fx(self, converter: LineConverter):
        b = self.buf
        converter.bind(b, converter.add(
            torch.empty_strided, (converter.sizes(b.size), converter.sizes(b.stride)),
            {"dtype": b.dtype, "device": b.device}, name=b.name, buf=b))


@dataclass(frozen=True)
class Reuse(Line):
    """``buf3 = buf0  # reuse``: ``new`` takes the storage of dead buffer ``old``."""

    capture_neutral = True

    old: Buffer
    new: Buffer

    allocates = True

    @property
    def same_layout(self) -> bool:
        o, n = self.old, self.new
        return (o.size, o.stride, o.offset, o.dtype) == (n.size, n.stride, n.offset, n.dtype)

    def reads(self):
        return [self.old]

    def defines(self):
        return [self.new]

    def size_exprs(self):
        return _layout_exprs(self.new)

    def to_source(self, printer: LinePrinter):
        n = self.new
        if self.same_layout:
            return f"{n.name} = {self.old.name}  # reuse"
        return (f"{n.name} = as_strided({self.old.name}, {printer.fmt(n.size)}, "
                f"{printer.fmt(n.stride)}, {printer.fmt(n.offset)})  # reuse")

    def to_fx(self, converter: LineConverter):
        old, new = self.old, self.new
        if old.dtype != new.dtype or old.device != new.device:
            raise NotImplementedError(
                f"{self!r}: reuse across dtypes or devices ({old.dtype} on {old.device} -> "
                f"{new.dtype} on {new.device}) has no FX form; reuse only same-dtype storage")
        if self.same_layout:
            converter.bind(new, converter.node(old))
            return
        converter.bind(new, converter.add(
            torch.as_strided, (converter.node(old), converter.sizes(new.size),
                               converter.sizes(new.stride), converter.expr(new.offset)),
            name=new.name, buf=new))


@dataclass(frozen=True)
class View(Line):
    """``buf2 = as_strided(buf0, size, stride, offset)``: reinterpret storage.

    ``buf`` carries the view's layout; ``base`` is the buffer that owns the storage.
    """

    capture_neutral = True

    buf: Buffer
    base: Buffer

    fusion_barrier = False
    metadata_only = True

    @property
    def name(self) -> str:
        return self.buf.name

    @property
    def view_base(self):
        return self.base

    def reads(self):
        return [self.base]

    def defines(self):
        return [self.buf]

    def size_exprs(self):
        return _layout_exprs(self.buf)

    def to_source(self, printer: LinePrinter):
        b = self.buf
        return (f"{b.name} = as_strided({self.base.name}, {printer.fmt(b.size)}, "
                f"{printer.fmt(b.stride)}, {printer.fmt(b.offset)})  # view")

    def to_fx(self, converter: LineConverter):
        b = self.buf
        args = (converter.node(self.base), converter.sizes(b.size), converter.sizes(b.stride))
        if b.offset != storage_offset_symbol(self.base):  # else as_strided keeps the base's offset
            args += (converter.expr(b.offset),)
        converter.bind(b, converter.add(torch.as_strided, args, name=b.name, buf=b))


@dataclass(frozen=True)
class DefineKernel(Line):
    """``# kernel fxwrap_pointwise_0 defined``: source and signature of a kernel."""

    capture_neutral = True

    kernel: Any = field()  # fxwrap.runtime.Kernel

    def to_source(self, printer: LinePrinter):
        k = self.kernel
        return f"# kernel {k.name} ({k.target}): " + ", ".join(f"{a.name}:{a.role}" for a in k.signature)

    def to_fx(self, converter: LineConverter):
        converter.kernels.append(self.kernel)


@dataclass(frozen=True)
class CallKernel(Line):
    """``fxwrap_pointwise_0(buf0, arg1, s0)``: launch; writes its output args.

    ``origins``: every ATen node the kernel computes, in program order; printed above
    the call (``# exp, mm, relu (model.py:12 in forward, fc)``) and kept in
    ``meta["fxwrap_origins"]`` of its FX node.
    """

    kernel: Any = field()
    args: tuple
    grid: tuple = ()
    origins: tuple[Origin, ...] = field(default=(), compare=False)

    binds_device = True
    in_place_by_offset = True

    @property
    def label(self):
        return f"kernel {self.kernel.name}"

    def reads(self):
        return buffers_in(self.args)

    def writes(self):
        return [value for arg, value in zip(self.kernel.signature, self.args)
                if getattr(arg, "role", "input") in ("output", "inout", "workspace") and isinstance(value, Buffer)]

    def scratch(self):
        """The workspace arguments: written by the kernel, meaningless after it (the debug
        modes check and print the other buffers it writes)."""
        return [value for arg, value in zip(self.kernel.signature, self.args)
                if getattr(arg, "role", "input") == "workspace" and isinstance(value, Buffer)]

    def size_exprs(self):
        return _exprs_in(self.args)

    def in_place_pairs(self):
        """The pairs its kernel's emitter allowed (``launch.in_place``, argument names:
        ``ScheduledKernel.in_place_pairs``), as the buffers passed for them."""
        pairs = self.kernel.launch.in_place
        if not pairs:
            return []
        by_arg = {arg.name: value for arg, value in zip(self.kernel.signature, self.args)
                  if isinstance(value, Buffer)}
        return [(by_arg[i], by_arg[o]) for i, o in pairs if i in by_arg and o in by_arg]

    def with_origins(self, origins):
        return self if self.origins else replace(self, origins=tuple(origins))

    def to_source(self, printer: LinePrinter):
        grid = f"  # grid={printer.fmt(tuple(self.grid))}" if self.grid else ""
        return printer.provenance(self.origins, f"{self.kernel.name}({printer.call(self.args, ())}){grid}")

    def to_fx(self, converter: LineConverter):
        if self.kernel not in converter.kernels:
            converter.kernels.append(self.kernel)
        node = converter.add(self.kernel, converter.arg(tuple(self.args)), name=self.kernel.name)
        converter.provenance(node, self.origins)


@dataclass(frozen=True)
class CallExtern(Line):
    """``aten.mm.out(arg0, arg1, out=buf0)``: an ATen or custom op.

    ``out`` names the result when the program uses it: a ``Buffer`` for a single
    tensor, a ``str`` for a tuple or a scalar (read through ``GetItem``), ``None``
    when the op writes into buffers passed in ``kwargs`` (its out= overload) or
    mutates an argument in place.
    """

    op: Any = field()
    args: tuple
    kwargs: tuple[tuple[str, Any], ...] = ()
    out: Buffer | str | None = None
    origins: tuple[Origin, ...] = field(default=(), compare=False)  # the ATen node it computes

    fusion_barrier = False

    def with_origins(self, origins):
        if self.origins or self.op in _METADATA_OPS:  # a size read computes no op of the program
            return self
        return replace(self, origins=tuple(origins))

    @property
    def label(self):
        return str(self.op)

    @property
    def out_name(self) -> str | None:
        return self.out.name if isinstance(self.out, Buffer) else self.out

    def reads(self):
        return buffers_in(self.args) + buffers_in([v for _, v in self.kwargs])

    def writes(self):
        """Its result, and the arguments its schema marks written (``Tensor(a!)``); every
        buffer it reads when the op has no schema (not an ATen overload): kernels reading
        them stay after it (a bounds check before the kernel it guards)."""
        written = [self.out] if isinstance(self.out, Buffer) else []
        if not isinstance(self.op, torch._ops.OpOverload):
            return written + self.reads()
        kwargs = dict(self.kwargs)
        for i, arg in enumerate(self.op._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = self.args[i] if i < len(self.args) and not arg.kwarg_only else kwargs.get(arg.name)
            written += buffers_in(value)
        return written

    def defines(self):
        return [self.out] if isinstance(self.out, Buffer) else []

    def defines_values(self):
        return [self.out] if isinstance(self.out, str) else []

    def size_exprs(self):
        return _exprs_in((self.args, tuple(v for _, v in self.kwargs)))

    def alias_of(self, producers):
        return self.result_alias(0) if isinstance(self.out, Buffer) else None

    def result_alias(self, index):
        return _aliased_argument(self.op, index, self.args)

    @property
    def allocates(self):
        """Its result is new storage the op allocated (an ``aten`` op whose schema says no
        result aliases an argument, and no view op): the planner may hand it on once dead,
        to a kernel writing in place into it (batch norm after a convolution) or to a new
        buffer that fits in it."""
        op = self.op
        return (isinstance(self.out, Buffer) and isinstance(op, torch._ops.OpOverload)
                and op.namespace == "aten" and not op.is_view and op not in _ALIASING_ATEN_OPS
                and all(r.alias_info is None for r in op._schema.returns))

    @property
    def may_return_alias(self):
        return self.out is not None

    @property
    def is_device_check(self):
        return bool(getattr(self.op, "is_device_check", False))

    def in_place_pairs(self):
        """A pointwise op writing into ``out=`` buffers: each input with each output
        (an elementwise op reads each element before it writes the same element; the
        planner also checks that the input is read with the output's exact layout)."""
        if self.out is not None or not is_pointwise_op(self.op):
            return []
        outs = buffers_in([v for _, v in self.kwargs])
        names = {b.name for b in outs}
        inputs = [b for b in self.reads() if b.name not in names]
        return [(i, o) for o in outs for i in inputs]

    @property
    def metadata_only(self):
        schema = getattr(self.op, "_schema", None)
        return schema is not None and schema.name.split("::")[-1].startswith(_METADATA_READS)

    def host_readback(self):
        schema = getattr(self.op, "_schema", None)
        if schema is None:  # a Python callable: safe only where it says so
            if self.is_device_check:
                return None
            return f"{self.label} is not an ATen op (it may read a value back to the CPU)"
        returns = [str(r.type) for r in schema.returns]
        if returns and "Tensor" not in "".join(returns) and \
                not schema.name.split("::")[-1].startswith(_METADATA_READS):
            return f"{self.op} reads a value back to the CPU"
        return None

    def capture_refusal(self, device_type):
        """Also an op whose output size depends on the data (``aten.nonzero``: it reads the
        count back)."""
        tags = getattr(self.op, "tags", ())
        if torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags:
            return f"{self.label} has a data-dependent output (it reads a value back to the host)"
        return super().capture_refusal(device_type)

    def to_source(self, printer: LinePrinter):
        call = f"{printer.op_name(self.op)}({printer.call(self.args, self.kwargs)})"
        return printer.provenance(self.origins, call if self.out is None else f"{self.out_name} = {call}")

    def to_fx(self, converter: LineConverter):
        name = self.out_name
        node = converter.add(self.op, converter.arg(tuple(self.args)),
                             {k: converter.arg(v) for k, v in self.kwargs}, name=name,
                             buf=self.out if isinstance(self.out, Buffer) else None)
        converter.provenance(node, self.origins)
        if name is not None:
            converter.bind_value(name, node)


#: ATen ops that read a tensor's metadata, not its data (no read back from the device)
_METADATA_READS = ("sym_size", "sym_stride", "sym_storage_offset", "sym_numel")
_METADATA_OPS = frozenset({torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int,
                           torch.ops.aten.sym_storage_offset.default, torch.ops.aten.sym_numel.default})


def _aliased_argument(op, ret_index: int, args: tuple) -> Buffer | None:
    """The argument buffer that result ``ret_index`` of ``op`` aliases, per its schema."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    returns = schema.returns
    ret = returns[0] if len(returns) == 1 else returns[ret_index] if ret_index < len(returns) else None
    if ret is None or ret.alias_info is None:
        return None
    wanted = ret.alias_info.before_set
    for i, arg in enumerate(schema.arguments[:len(args)]):
        info = arg.alias_info
        # ``Tensor(a)[]`` results (split, unbind) carry their set on the elements, which
        # the Python schema does not show; their source is the ``Tensor(a -> *)`` argument.
        if info is not None and (info.before_set == wanted if wanted else "*" in info.after_set):
            found = buffers_in(args[i])
            return found[0] if found else None
    return None


@dataclass(frozen=True)
class GetItem(Line):
    """``buf4 = buf3[1]``: one result of a multi-output extern."""

    capture_neutral = True

    buf: Buffer | str
    src: str = field()
    index: int

    fusion_barrier = False

    @property
    def out_name(self) -> str:
        return self.buf.name if isinstance(self.buf, Buffer) else self.buf

    def defines(self):
        return [self.buf] if isinstance(self.buf, Buffer) else []

    def defines_values(self):
        return [self.buf] if isinstance(self.buf, str) else []

    def alias_of(self, producers):
        source = producers.get(self.src)
        if not isinstance(self.buf, Buffer) or source is None:
            return None
        return source.result_alias(self.index)

    def to_source(self, printer: LinePrinter):
        return f"{self.out_name} = {self.src}[{self.index}]"

    def to_fx(self, converter: LineConverter):
        node = converter.add(operator.getitem, (converter.node(self.src), self.index), name=self.out_name,
                             buf=self.buf if isinstance(self.buf, Buffer) else None)
        converter.bind_value(self.out_name, node)


@dataclass(frozen=True)
class DefineSymbol(Line):
    """``u0 = s0 * 16``: a size expression computed on the host."""

    symbol: sympy.Symbol
    expr: sympy.Expr

    fusion_barrier = False

    def defines_symbols(self):
        return [self.symbol]

    def size_exprs(self):
        return [self.expr]

    def host_readback(self):
        return "a size depends on data (read back to the CPU)"

    def capture_refusal(self, device_type):
        """None: the host computes it from size inputs and values of the partitions before,
        every one of which is part of a recording's key (``runtime/graph_replay.py``)."""
        return None

    def to_source(self, printer: LinePrinter):
        return f"{self.symbol} = {self.expr}"

    def to_fx(self, converter: LineConverter):
        converter.bind_symbol(self.symbol, converter.expr(self.expr))


@dataclass(frozen=True)
class ZeroFill(Line):
    """``zero_(ws3)``: fill ``buf`` with zeros (a kernel's workspace that must start at
    zero, right after its ``Allocate``); FX: ``aten.zero_.default(ws3)``."""

    buf: Buffer

    fusion_barrier = False

    def reads(self):
        return [self.buf]

    def writes(self):
        return [self.buf]

    def to_source(self, printer: LinePrinter):
        return f"zero_({self.buf.name})"

    def to_fx(self, converter: LineConverter):
        converter.add(torch.ops.aten.zero_.default, (converter.arg(self.buf),))


@dataclass(frozen=True)
class Free(Line):
    """``free(buf1)``: last use of ``buf``; its storage may be released."""

    capture_neutral = True

    buf: Buffer

    def reads(self):
        return [self.buf]

    def to_source(self, printer: LinePrinter):
        return f"free({self.buf.name})"

    def to_fx(self, converter: LineConverter):
        converter.free(self.buf)


@dataclass(frozen=True)
class Comment(Line):
    """``# idx: every index of buf3 in range for dim 0``: a note about the next line.

    Provenance is not a comment: it is the ``origins`` of the call it belongs to."""

    capture_neutral = True

    text: str

    annotates_next = True
    fusion_barrier = False

    def to_source(self, printer: LinePrinter):
        return f"# {self.text}"

    def to_fx(self, converter: LineConverter):
        converter.comment(self.text)


@dataclass(frozen=True)
class TemplateChoice(Comment):
    """``# template cpp_gemm: 0.212 ms (chosen); aten.addmm + epilogue: 0.251 ms``: which
    candidate computes a template group (``fxwrap.core.templates``), and the measured
    times (each its fastest round), printed above the launch it chose (a ``Comment``: the FX node of that launch
    gets it in ``meta["comment"]``).  ``chosen``: a template's name or ``"extern"``;
    ``times``: ``((candidate, milliseconds), ...)``, empty when nothing was timed
    (``templates="always"``, or a single candidate)."""

    chosen: str = ""
    times: tuple = ()


@dataclass(frozen=True)
class Return(Line):
    """``return (buf2, s0)``: the program's outputs.

    Each value is a ``Buffer``, a sympy size expression, a python scalar or None.
    ``bare``: the program returns its one value itself, not a tuple (``return buf0``:
    a ``while_loop`` condition, which must return a 0-dim bool tensor).
    """

    values: tuple = field(default=())
    bare: bool = False

    returns_reads = True
    capture_neutral = True

    def reads(self):
        return buffers_in(self.values)

    def size_exprs(self):
        return _exprs_in(self.values)

    def to_source(self, printer: LinePrinter):
        if self.bare:
            return f"return {printer.fmt(self.values[0])}"
        return f"return {printer.fmt(tuple(self.values))}"

    def to_fx(self, converter: LineConverter):
        values = tuple(converter.arg(v) if v is not None else None for v in self.values)
        converter.graph.output(values[0] if self.bare else values)


#: ``aten`` ops whose result may share an argument's storage although their schema says
#: nothing (``_unsafe_view`` is a view that claims not to be one)
_ALIASING_ATEN_OPS = frozenset(op for op in (
    getattr(torch.ops.aten._unsafe_view, "default", None),
    getattr(torch.ops.aten.lift_fresh, "default", None),
) if op is not None)


def is_pointwise_op(op) -> bool:
    """Pointwise per the op's tags, or its functional overload's (``relu.out`` has none)."""
    if torch.Tag.pointwise in getattr(op, "tags", ()):
        return True
    packet = getattr(op, "overloadpacket", None)
    schema = getattr(op, "_schema", None)
    if packet is None or schema is None or schema.overload_name not in ("out",):
        return False
    functional = getattr(packet, "default", None)
    return functional is not None and torch.Tag.pointwise in functional.tags


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
    """Buffers a line uses (reads or writes into an existing buffer): ``line.reads()``."""
    return line.reads()


def buffers_defined(line: Line) -> list[Buffer]:
    """Buffers a line brings into existence: ``line.defines()``."""
    return line.defines()
