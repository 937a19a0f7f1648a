"""Loop IR: interned records ``Op(op, dtype, src, arg)`` and the scheduled kernels made
of them.

``torch.relu(x) * 2`` over a contiguous ``(s0, 64)`` float tensor is the kernel::

    x = Op.load("arg0", 64*x0 + x1, f32)
    ScheduledKernel(name="fxwrap_kernel_0",
        ranges=(s0, 64), reduction_ranges=(),
        stores=(Store("buf1", 64*x0 + x1,
            Op("mul", f32, (Op("maximum", f32, (x, Op.const(0.0, f32))),
                            Op.const(2.0, f32)))),))

and its values print (``format_ssa``) one line per distinct node, operands first::

    %0 = load.f32 arg0[64*x0 + x1]
    %1 = const.f32 0.0
    %2 = maximum.f32 %0 %1
    %3 = const.f32 2.0
    %4 = mul.f32 %2 %3

A node is ``op`` (an ``OpCode``), ``dtype`` (a ``torch.dtype``), ``src`` (its operand
nodes, a tuple of ``Op``) and ``arg`` (what is not a node: a buffer name, an index
expression, a constant).  Nodes are *interned*: building a node equal to one that
exists returns that node, so equal nodes are the same object, ``==`` is ``is`` and
the hash is computed once from the children's.  A graph with shared sub-expressions
(``x * sigmoid(x)`` repeated) is a DAG whose size is its number of distinct nodes;
every walk over it (``walk``, ``rewrite``, ``fold``, ``format_ssa``) visits each node
once and never recurses in Python.

Iteration variables are the sympy symbols ``x0, x1, ...`` (one per entry of
``ranges``, outermost first) and ``r0, r1, ...`` (one per entry of
``reduction_ranges``).  Index expressions are sympy expressions over them and over
the program's size symbols.

Op codes (``OP_INFO`` holds what is known of each: operand count, bool result,
exact in 16-bit floats):

* leaves (``src=()``): ``const`` (``arg``: a Python number, normalized to the dtype);
  ``index`` (``arg``: an int expression, its value: iota/arange); ``acc``
  (``arg``: ``(reduction_name, field)``, the result of a reduction of this kernel;
  field 0 except for ``welford``: 0 mean, 1 m2, 2 count; and ``argmax``/``argmin``:
  0 index, 1 value); ``template_out`` (``arg``: ``(buffer, (x0, x1))``, the accumulator
  of the kernel's template at that output element: ``fxwrap.core.templates``);
  ``load``, below.
* unary (``src=(x,)``): see ``UNARY``; ``cast`` converts ``x`` to ``dtype``.
* binary (``src=(a, b)``): see ``BINARY``; those in ``BOOL_RESULT`` give ``torch.bool``.
* ``where``: ``src=(cond, a, b)``.
* ``intrinsic``: a target's own op (``fxwrap.ir.intrinsics``), ``arg`` its name, ``src`` its
  operands; pointwise like the others, printed ``%2 = intrinsic.f32 my_gelu(%1)``.

Loads, ``Op.load(buffer, index, dtype, mask=None)``.  ``index`` is the element offset
from the buffer's data pointer:

* *direct*: a sympy expression over the iteration variables and size symbols, kept
  in ``arg``: ``Op.load("arg0", 64*x0 + x1, f32)`` is ``load`` with
  ``arg=("arg0", 64*x0 + x1)`` and no operands;
* *indirect*: an integer ``Op`` computed in the kernel, for offsets that depend on
  loaded data (gather, embedding, ``x[idx]``); it is the load's first operand and
  ``arg`` is ``(buffer, None)``.  ``F.embedding(idx, w)`` with ``w`` of size
  ``(V, 64)`` reads, at output index ``(x0, x1)``::

      %0 = index.i64 x1
      %1 = load.i64 arg0[x0]
      %2 = index.i64 64
      %3 = mul.i64 %1 %2
      %4 = add.i64 %0 %3
      %5 = load.f32 arg1[%4]

  The index values are checked on the host before the kernel runs (a
  ``check_index_bounds`` extern, ``fxwrap.runtime.checks``), so an indirect load
  never reads outside its buffer;
* *masked*: a ``torch.bool`` ``Op``, the load's last operand: where it is false
  nothing is read and the load's value is 0 (``cat``, ``constant_pad_nd``: a value
  defined piecewise over the output index is a ``where`` over masked loads).

``load_buffer(op)`` / ``load_index(op)`` / ``load_mask(op)`` read those fields.

Passes are ``rewrite(root, rule)``: bottom-up over the DAG, each distinct node once,
``rule`` seeing a node whose operands are already rewritten (``masked``, the
scheduler's load substitution and re-indexing are rules).

Reductions (``Reduction.kind``): ``sum prod max min any all argmax argmin welford``.

Scans (``Reduction.kind`` in ``SCANS``: ``cumsum cumprod logcumsumexp cummax cummin``)
are reductions whose ``acc`` is the running value: read by a store indexed by the r
var, ``acc`` at ``r0`` is the scan of the row's values at ``0..r0``.  ``torch.cumsum(x * 2,
1)`` over a contiguous ``(s0, s1)`` float tensor is::

    fxwrap_scan_0: ranges=(s0,) reduction_ranges=(s1,)
      %0 = load.f32 arg0[s1*x0 + r0]
      %1 = const.f32 2.0
      %2 = mul.f32 %0 %1
      acc0 = cumsum.f32(%2)
      %3 = acc.f32 acc0[0]
      buf0[s1*x0 + r0] = %3

``cummax``/``cummin`` have two fields, like ``argmax``: 0 the index (int64), 1 the value.
A scan kernel holds the scans of one node and the pointwise stores over its
``(x..., r)`` ranges that read them (its epilogue), nothing else.
bf16/fp16 values are loaded and stored in their type and computed in float32 (the
lowerings insert the casts; ``fxwrap.core.numerics.legalize`` makes sure of it for every
kernel before emission).
"""
from __future__ import annotations

import enum
import threading
import weakref
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass

import sympy
import torch


@dataclass(frozen=True)
class OpInfo:
    """What the compiler knows of one op code: how many operands (``src``) it takes
    (``None``: a load, 0 to 2; an intrinsic, the number its declaration takes), whether
    its result is ``torch.bool`` whatever its operands, and whether its bf16/fp16 result
    is exact when its operands are (so it needs no re-rounding to the 16-bit type)."""

    operands: int | None
    bool_result: bool = False
    exact_16bit: bool = False


def _rows(names: str, operands: int | None, **flags) -> dict[str, OpInfo]:
    return {name: OpInfo(operands, **flags) for name in names.split()}


OP_INFO: dict[str, OpInfo] = {
    **_rows("const index acc template_out", 0),
    **_rows("load", None),
    # unary
    **_rows("exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh "
            "asinh acosh atanh erf erfc erfinv sigmoid reciprocal bitwise_not cast", 1),
    **_rows("neg abs floor ceil round trunc sign", 1, exact_16bit=True),
    **_rows("logical_not isnan isinf signbit", 1, bool_result=True),
    # binary
    **_rows("add sub mul truediv floordiv truncdiv mod fmod pow atan2 bitwise_and bitwise_or bitwise_xor "
            "lshift rshift", 2),
    **_rows("maximum minimum copysign", 2, exact_16bit=True),
    **_rows("lt le gt ge eq ne logical_and logical_or logical_xor", 2, bool_result=True),
    # ternary
    **_rows("where", 3, exact_16bit=True),
    # index_check(v, low, high) is v, on a target that checks index bounds inside its
    # kernels (capabilities().index_checks == "in_kernel"): the kernel traps (a
    # device-side assert, as eager's own index kernels do) unless low <= v < high
    **_rows("index_check", 3),
    # a target-defined op (``fxwrap.ir.intrinsics.Intrinsic``): ``arg`` is its name, ``src``
    # its operands, computed and returned in ``dtype``; only a target declaring it sees it
    **_rows("intrinsic", None),
}


class _OpCodeBase(enum.StrEnum):
    """The loop-IR op codes, one member per row of ``OP_INFO``; a member is its name
    (``OpCode.ADD == "add"``), so tables keyed by name (an emitter's renderings) look
    it up directly."""

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def of(cls, name) -> OpCode:
        """``name`` (an ``OpCode`` or its string) as an ``OpCode``; unknown names raise."""
        if type(name) is cls:
            return name
        try:
            return _CODES[name]
        except (KeyError, TypeError):
            raise ValueError(f"{name!r} is not a loop-IR op code (fxwrap.ir.loops.OP_INFO lists them); "
                             "a lowering that needs another op should emit an extern call") from None


OpCode = _OpCodeBase("OpCode", [(name.upper(), name) for name in OP_INFO], module=__name__, qualname="OpCode")
OpCode.__doc__ = _OpCodeBase.__doc__
_CODES: dict[str, OpCode] = {name: OpCode(name) for name in OP_INFO}
_OPERANDS: dict[OpCode, int | None] = {code: OP_INFO[code].operands for code in _CODES.values()}

LEAVES = frozenset(c for c in _CODES.values() if OP_INFO[c].operands == 0) | {OpCode.LOAD}
UNARY = frozenset(c for c in _CODES.values() if OP_INFO[c].operands == 1)
BINARY = frozenset(c for c in _CODES.values() if OP_INFO[c].operands == 2)
BOOL_RESULT = frozenset(c for c in _CODES.values() if OP_INFO[c].bool_result)
"""Ops whose result is ``torch.bool`` (comparisons, logical ops, ``isnan``...); their
operands keep their own dtype."""
EXACT_16BIT = frozenset(c for c in _CODES.values() if OP_INFO[c].exact_16bit)
"""Ops whose bf16/fp16 result is exact when the operands are: no re-rounding needed."""

REDUCTIONS = frozenset("sum prod max min any all argmax argmin welford".split())

SCANS = frozenset("cumsum cumprod logcumsumexp cummax cummin".split())
"""Scan kinds of a ``Reduction``: the running value over the row (see ``Reduction``)."""


def result_dtype(op, compute: torch.dtype) -> torch.dtype:
    """The dtype of ``op`` computed over operands of dtype ``compute``."""
    return torch.bool if OpCode.of(op) in BOOL_RESULT else compute


def _payload_key(arg):
    """``arg`` as part of an intern key: floats by their repr, so ``0.0`` and ``-0.0``
    (equal in Python) stay two constants and every NaN is one."""
    if type(arg) is float:
        return (float, repr(arg))
    if type(arg) is tuple:
        return tuple(_payload_key(a) for a in arg)
    return arg


def _const_value(value, dtype: torch.dtype):
    """A constant in the Python type of its dtype (``2`` of float32 is ``2.0``), so equal
    constants are one node; a non-integral float of an integer dtype stays as it is."""
    if not isinstance(value, (bool, int, float, complex)):
        raise TypeError(f"const: {value!r} is not a number")
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    if not dtype.is_complex and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class Op:
    """One loop-IR value, interned: ``Op("add", torch.float32, (a, b))``.

    ``op`` is an ``OpCode`` (a name is accepted), ``src`` the operand nodes, ``arg``
    the payload of a leaf (see the module docstring).  Building a node equal to one
    that is alive returns that very node; nodes are immutable, compare by identity
    and hash in O(1).
    """

    __slots__ = ("op", "dtype", "src", "arg", "_hash", "__weakref__")

    _interned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
    _lock = threading.Lock()

    def __new__(cls, op, dtype: torch.dtype, src: Sequence[Op] = (), arg=None):
        code = OpCode.of(op)
        src = tuple(src)
        for s in src:
            if type(s) is not Op:
                raise TypeError(f"Op({code!r}): operand {s!r} is not an Op; a leaf's payload "
                                "(buffer name, index expression, constant) goes in arg")
        want = _OPERANDS[code]
        if code == OpCode.LOAD:
            arg = _load_arg(arg, src)
        elif code == OpCode.INTRINSIC:  # any number of operands: its declaration's
            if not isinstance(arg, str) or not arg.isidentifier():
                raise TypeError(f"Op('intrinsic'): arg {arg!r} must be the intrinsic's name (an identifier)")
        elif len(src) != want:
            raise TypeError(f"Op({code!r}) takes {want} operand(s), got {len(src)}")
        elif code == OpCode.CONST:
            arg = _const_value(arg, dtype)
        elif code == OpCode.INDEX:
            arg = sympy.sympify(arg)
        elif code in (OpCode.ACC, OpCode.TEMPLATE_OUT):
            arg = tuple(arg)
        key = (code, dtype, src, _payload_key(arg))
        with cls._lock:
            node = cls._interned.get(key)
            if node is None:
                node = object.__new__(cls)
                setattr_ = object.__setattr__
                setattr_(node, "op", code)
                setattr_(node, "dtype", dtype)
                setattr_(node, "src", src)
                setattr_(node, "arg", arg)
                setattr_(node, "_hash", hash(key))  # O(len(src)): the children's hashes are cached
                cls._interned[key] = node
        return node

    # -- leaf constructors ----------------------------------------------------------
    @classmethod
    def load(cls, buffer: str, index, dtype: torch.dtype, mask: Op | None = None) -> Op:
        """A read of ``buffer`` at ``index`` (a sympy expression, or an integer ``Op``:
        indirect), where the bool ``mask`` holds (everywhere when None)."""
        indirect = type(index) is Op
        src = ((index,) if indirect else ()) + ((mask,) if mask is not None else ())
        return cls(OpCode.LOAD, dtype, src, (buffer, None if indirect else index))

    @classmethod
    def const(cls, value, dtype: torch.dtype) -> Op:
        return cls(OpCode.CONST, dtype, (), value)

    @classmethod
    def index(cls, expr, dtype: torch.dtype = torch.int64) -> Op:
        """The value of an integer index expression."""
        return cls(OpCode.INDEX, dtype, (), expr)

    @classmethod
    def acc(cls, reduction: str, field: int, dtype: torch.dtype) -> Op:
        """Field ``field`` of the result of reduction ``reduction`` of this kernel."""
        return cls(OpCode.ACC, dtype, (), (reduction, field))

    def replace(self, *, src: Sequence[Op] | None = None, arg=None, dtype: torch.dtype | None = None) -> Op:
        """This node with other operands, payload or dtype (the others kept)."""
        return Op(self.op, self.dtype if dtype is None else dtype,
                  self.src if src is None else src, self.arg if arg is None else arg)

    # -- identity ---------------------------------------------------------------------
    def __hash__(self) -> int:
        return self._hash

    # ``==`` is the inherited identity comparison: interning makes it structural.

    def __setattr__(self, name, value):
        raise AttributeError(f"Op is immutable (setting {name!r}); build a new node")

    def __delattr__(self, name):
        raise AttributeError(f"Op is immutable (deleting {name!r})")

    def __reduce__(self):
        # the DAG under this node as rows, operands first: unpickling builds it again (so
        # it is interned in the loading process too) without recursing, however deep
        nodes = walk(self)
        row = {node: i for i, node in enumerate(nodes)}
        return (_from_rows, (tuple((n.op.value, n.dtype, tuple(row[c] for c in n.src), n.arg) for n in nodes),))

    def __copy__(self) -> Op:
        return self

    def __deepcopy__(self, memo) -> Op:
        return self

    def __repr__(self) -> str:
        if tree_size(self, limit=_REPR_NODES) <= _REPR_NODES:
            return _nested(self)
        return "<Op\n" + "\n".join(format_ssa([self])) + "\n>"


_REPR_NODES = 64


def _from_rows(rows) -> Op:
    """The last node of ``rows`` (``(op, dtype, operand row numbers, arg)``, operands first)."""
    built: list[Op] = []
    for code, dtype, src, arg in rows:
        built.append(Op(code, dtype, tuple(built[i] for i in src), arg))
    return built[-1]


def _load_arg(arg, src: tuple) -> tuple:
    """A load's ``(buffer, index)``: ``index`` a sympy expression, or None when the
    first operand is the (indirect) index; the operand after it, if any, is the mask."""
    buffer, index = arg
    if not isinstance(buffer, str):
        raise TypeError(f"load: buffer {buffer!r} is not a name")
    allowed = 1 if index is not None else 2
    if len(src) > allowed or (index is None and not src):
        raise TypeError(f"load of {buffer!r}: operands {src!r} do not fit index {index!r} "
                        "(indirect index first, then the mask)")
    return (buffer, None if index is None else sympy.sympify(index))


def _dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype) or str(dtype).replace("torch.", "")


_DTYPE_NAMES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
                torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
                torch.uint8: "u8", torch.bool: "bool"}


def _nested(root: Op) -> str:
    """``Op("mul", f32, (Op.load("arg0", x0, f32), Op.const(2.0, f32)))``: a small tree."""
    text: dict[Op, str] = {}
    for node in walk(root):
        dt = _dtype_name(node.dtype)
        if node.op == OpCode.LOAD:
            buffer, index = node.arg
            parts = [repr(buffer), text[node.src[0]] if index is None else str(index), dt]
            if load_mask(node) is not None:
                parts.append(f"mask={text[node.src[-1]]}")
            text[node] = f"Op.load({', '.join(parts)})"
        elif node.op == OpCode.ACC:
            text[node] = f"Op.acc({node.arg[0]!r}, {node.arg[1]}, {dt})"
        elif node.op in LEAVES:
            text[node] = f"Op.{node.op}({node.arg!r}, {dt})"
        else:
            kids = ", ".join(text[c] for c in node.src)
            name = f", {node.arg!r}" if node.op == OpCode.INTRINSIC else ""
            text[node] = f'Op("{node.op}", {dt}, ({kids}{"," if len(node.src) == 1 else ""}){name})'
    return text[root]


def xvar(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"x{i}", integer=True, nonnegative=True)


def rvar(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"r{i}", integer=True, nonnegative=True)


@dataclass(frozen=True)
class Reduction:
    """``Reduction("acc0", "sum", value)``: accumulate ``value`` over every ``r`` var.

    ``value`` is an ``Op`` over x and r vars; it may read earlier reductions'
    ``acc`` of the same kernel (softmax: max, then sum of exp(x - max)).
    """

    name: str
    kind: str
    value: Op
    dtype: torch.dtype  # the accumulator's dtype

    @property
    def is_scan(self) -> bool:
        """A scan (``SCANS``): its ``acc`` is the running value at each ``r``."""
        return self.kind in SCANS


STORE_MODES = frozenset({"add"})
"""How a store may combine with what its element holds (``Store.mode``): ``add``
accumulates (``index_put(..., accumulate=True)``, ``scatter_add``)."""


@dataclass(frozen=True)
class Store:
    """``Store("buf1", 64*x0 + x1, value)``.

    In a reduction kernel a store whose index uses r vars runs in a final pass over
    the reduction range (the pointwise epilogue: softmax's ``exp(x-max)/sum``);
    one that uses only x vars runs once per output row.

    An *indexed* store writes at an offset computed in the kernel: ``index`` is an int64
    ``Op`` (as an indirect load's), and the kernel writes only the elements those
    offsets reach (an in-place ``index_put`` / ``scatter``: ``core/rules/indexed_writes.py``).
    ``mode="add"`` adds the value to what the element holds, each addition whole
    (two iterations may reach one element: an atomic or a serial loop).  The KV-cache
    write ``cache[:, pos] = v`` over ``v`` of size ``(2, 1, 8)`` into a ``(2, 16, 8)``
    cache (``pos`` in ``arg1``, negative positions wrapped) is, over ``v``'s ranges ``(2, 1, 8)``::

        %0 = index.i64 128*x0 + x2
        %1 = load.i64 arg1[0]
        %2 = const.i64 0
        %3 = lt.bool %1 %2
        %4 = index.i64 16
        %5 = add.i64 %1 %4
        %6 = where.i64 %3 %5 %1
        %7 = index.i64 8
        %8 = mul.i64 %6 %7
        %9 = add.i64 %0 %8
        %10 = load.f32 arg2[8*x0 + x2]
        arg0[%9] = %10

    An indexed store stays in a kernel of its own (nothing fuses with it).
    """

    buffer: str
    index: sympy.Expr | Op
    value: Op
    mode: str | None = None

    def __post_init__(self):
        if self.mode is not None and self.mode not in STORE_MODES:
            raise ValueError(f"Store mode {self.mode!r} is not one of {sorted(STORE_MODES)}")
        if self.mode is not None and type(self.index) is not Op:
            raise ValueError(f"Store into {self.buffer} with mode {self.mode!r} at a direct index: "
                             "only indexed stores combine with the element they write")

    @property
    def indexed(self) -> bool:
        """The offset is computed in the kernel (an ``Op``): the store reaches only the
        elements its offsets name, and leaves the others as they were."""
        return type(self.index) is Op

    def index_exprs(self) -> list:
        """The sympy expressions of the index (one, or those an indexed store's ``Op`` is made of)."""
        return direct_indices(self.index) if self.indexed else [sympy.sympify(self.index)]

    def roots(self) -> tuple[Op, ...]:
        """The values the store computes: its value, and an indexed store's offset first."""
        return (self.index, self.value) if self.indexed else (self.value,)

    def remapped(self, mapping: dict, value: Op) -> Store:
        """This store with ``mapping`` (symbol -> expr) applied to its index, holding ``value``."""
        if self.indexed:
            index = _subs_op_index(self.index, mapping)
        else:
            index = sympy.expand(sympy.sympify(self.index).xreplace(mapping))
        return Store(self.buffer, index, value, self.mode)


def _subs_op_index(op: Op, mapping: dict) -> Op:
    """``op`` with ``mapping`` applied to its direct load and ``index`` expressions."""
    def direct_load(load: Op) -> Op | None:
        buffer, index = load.arg
        return None if index is None else load.replace(arg=(buffer, sympy.sympify(index).xreplace(mapping)))
    return rewrite(op, {OpCode.LOAD: direct_load,
                        OpCode.INDEX: lambda node: node.replace(arg=node.arg.xreplace(mapping))})


@dataclass(frozen=True)
class ScheduledKernel:
    """A fused kernel, ready for a ``KernelEmitter.render``.

    ``inputs``/``outputs`` are the buffers (``fxwrap.lines.Buffer``) the kernel
    reads and writes, in argument order; ``size_symbols`` follow them as scalar
    arguments.  ``origins`` are the ATen nodes it computes, in program order
    (``fxwrap.runtime.provenance.Origin``s, set by the kernel builder).
    """

    name: str
    inputs: tuple
    outputs: tuple
    size_symbols: tuple[sympy.Symbol, ...]
    ranges: tuple[sympy.Expr, ...]
    reduction_ranges: tuple[sympy.Expr, ...]
    reductions: tuple[Reduction, ...]
    stores: tuple[Store, ...]
    origins: tuple[str, ...] = ()
    #: a template kernel's op (``fxwrap.core.templates.TemplateCall``): its stores are the
    #: epilogue over ``template_out``; None for a generated kernel
    template: object = None
    #: names of its buffers that share storage with another of its buffers (a view of an
    #: output read as an input): their pointers may alias (C: no ``restrict``); sorted, so
    #: that the kernel's repr (a saved kernel's digest covers it) is the same after unpickling
    #: (a frozenset's order is its hashes' and insertions', which a pickle round trip may change)
    shared_storage: tuple[str, ...] = ()

    @property
    def is_reduction(self) -> bool:
        return bool(self.reductions)

    @property
    def is_scan(self) -> bool:
        """A scan kernel: its reductions are scans (``SCANS``), run in the one pass over
        each row that also makes the stores."""
        return any(r.is_scan for r in self.reductions)

    @property
    def indexed_writes(self) -> bool:
        """A kernel of indexed stores (``Store.indexed``): it writes only the elements
        its computed offsets reach."""
        return any(st.indexed for st in self.stores)

    def in_place_pairs(self) -> tuple[tuple[str, str], ...]:
        """``(input, output)`` buffer names where the output may be written into the
        input's storage, when the input dies at this kernel (the memory planner decides,
        ``core/memory.py``).  Batch norm and ReLU after a convolution::

            fxwrap_pointwise_2: ranges=(16, 32, 64, 64) reduction_ranges=()
              %0 = load.f32 buf2[131072*x0 + x1 + 2048*x2 + 32*x3]
              ...
              %9 = maximum.f32 %8 %7
              buf7[131072*x0 + x1 + 2048*x2 + 32*x3] = %9

        gives ``(("buf2", "buf7"),)``: every load of ``buf2`` is at the offset the
        one store of ``buf7`` writes, the two have one dtype and start, and the
        store is dense (each element written by exactly one iteration); ``buf2``'s own
        sizes and strides do not matter (a (64, 256) matmul result read as (2, 32, 256)).  So each
        element of ``buf2`` is read only by the iteration that then overwrites it, in
        any order, vectorization or split of the iterations.  With several stores, an
        input that a later store reads pairs with none (the emitter writes each store
        before it loads what the next one reads: batch norm's running-statistics kernel).  A kernel with
        reductions, a scan or a template gives none (a reduction reads elements other
        iterations write).
        """
        if self.template is not None or self.reductions or self.reduction_ranges or self.indexed_writes:
            return ()
        xs = [xvar(i) for i in range(len(self.ranges))]
        loads: dict[str, list] = {}
        for node in walk(*(st.value for st in self.stores)):
            if node.op == "load":
                loads.setdefault(load_buffer(node), []).append(load_index(node))
        stored: dict[str, list[Store]] = {}
        for st in self.stores:
            stored.setdefault(st.buffer, []).append(st)
        ins = {b.name: b for b in self.inputs}
        # an emitter computes and writes the stores in order, loading what each reads as it
        # goes: an input read by a store after the output's would be read overwritten
        read_by = [{load_buffer(n) for n in walk(st.value) if n.op == "load"} for st in self.stores]
        pairs = []
        for out in self.outputs:
            if out.name in ins or len(stored.get(out.name, ())) != 1:
                continue
            index = stored[out.name][0].index
            if not _dense_store(out, self.ranges, xs, index):
                continue
            position = next(i for i, st in enumerate(self.stores) if st.buffer == out.name)
            read_later = set().union(*read_by[position + 1:])
            for inp in self.inputs:
                # the loads' offsets are the store's, so the input's own sizes and strides
                # need not be the output's (an addmm's (64, 256) result read as (2, 32, 256))
                if inp.name in stored or inp.name in read_later or (
                        inp.offset, inp.dtype, inp.device) != (out.offset, out.dtype, out.device):
                    continue
                reads = loads.get(inp.name, ())
                if reads and all(isinstance(r, sympy.Expr) and sympy.expand(r - index) == 0 for r in reads):
                    pairs.append((inp.name, out.name))
        return tuple(pairs)


def _dense_store(buf, ranges, xs, index) -> bool:
    """The store ``buf[index]`` over ``ranges`` writes every element of ``buf`` once: the
    index is a strided offset over the iteration (one coefficient per variable, no
    constant) whose strides are a dense, non-overlapping layout of as many elements as
    ``buf`` holds, and ``buf`` is itself dense and non-overlapping from its start.  Both
    then cover the offsets ``0 .. numel - 1`` exactly once, so the iteration may be another
    shape of the buffer: a (64, 256) loop storing a (2, 32, 256) result row-major."""
    if sympy.sympify(buf.offset) != 0:
        return False
    numel = sympy.Mul(*[sympy.sympify(r) for r in ranges])
    if sympy.expand(numel - sympy.Mul(*[sympy.sympify(n) for n in buf.size])) != 0:
        return False
    index = sympy.expand(sympy.sympify(index))
    used = [x for x in xs if x in index.free_symbols]
    if used and not index.is_polynomial(*used):
        return False
    poly = sympy.Poly(index, *used) if used else None
    if poly is not None and (poly.total_degree() > 1 or poly.coeff_monomial(1) != 0):
        return False
    if poly is None and index != 0:
        return False
    coeffs = [poly.coeff_monomial(x) if x in used else sympy.Integer(0) for x in xs]
    if any(sympy.sympify(c).free_symbols & set(xs) for c in coeffs):
        return False
    return _dense_layout(ranges, coeffs) and _dense_layout(buf.size, buf.stride)


def _dense_layout(sizes, strides) -> bool:
    """``(sizes, strides)`` address each of ``0 .. prod(sizes) - 1`` once: contiguous after
    some permutation of the dims (dims of size 1 aside)."""
    dims = [d for d, n in enumerate(sizes) if sympy.sympify(n) != 1]
    span = sympy.Integer(1)
    while dims:
        d = next((d for d in dims if sympy.expand(sympy.sympify(strides[d]) - span) == 0), None)
        if d is None:
            return False
        dims.remove(d)
        span = span * sympy.sympify(sizes[d])
    return True


def walk(*roots: Op, skip: Container[Op] = ()) -> list[Op]:
    """Every distinct node under ``roots``, operands before users, in a deterministic
    order (depth first, operands left to right, each root after the one before).

    Nodes in ``skip`` (a memo of earlier work) are neither listed nor entered."""
    seen: set[Op] = set()
    order: list[Op] = []
    for root in roots:
        if root in seen or root in skip:
            continue
        stack: list[tuple[Op, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                if node not in seen:
                    seen.add(node)
                    order.append(node)
                continue
            if node in seen:
                continue
            stack.append((node, True))
            for child in reversed(node.src):
                if child not in seen and child not in skip:
                    stack.append((child, False))
    return order


Rule = Callable[[Op], "Op | None"] | Mapping[str, Callable[[Op], "Op | None"]]


def rewrite(root: Op, rule: Rule, memo: dict[Op, Op] | None = None) -> Op:
    """``root`` rewritten bottom-up: each distinct node once, operands first.

    ``rule(node)`` sees the node with its operands already rewritten and returns its
    replacement, or None to keep it; ``rule`` may also be ``{op_code: fn}``, where
    nodes of other codes are kept.  ``memo`` (old node -> new) can be shared by the
    calls over one kernel's values.  Turning every ``sigmoid`` into
    ``1 / (1 + exp(-x))``::

        rewrite(value, {"sigmoid": lambda n: Op("reciprocal", n.dtype, (Op("add", n.dtype, (
            Op.const(1.0, n.dtype), Op("exp", n.dtype, (Op("neg", n.dtype, n.src),)))),))})
    """
    memo = {} if memo is None else memo
    by_code = rule if isinstance(rule, Mapping) else None
    for node in walk(root, skip=memo):
        src = tuple(memo[c] for c in node.src)
        new = node if src == node.src else node.replace(src=src)
        if by_code is not None:
            fn = by_code.get(new.op)
            out = fn(new) if fn is not None else None
        else:
            out = rule(new)
        memo[node] = new if out is None else out
    return memo[root]


def fold(root: Op, fn: Callable[[Op, list], object], memo: dict | None = None):
    """``fn(node, [values of its operands])`` for every distinct node, operands first;
    the value of ``root``.  ``memo`` (node -> value) can be shared between calls."""
    memo = {} if memo is None else memo
    for node in walk(root, skip=memo):
        memo[node] = fn(node, [memo[c] for c in node.src])
    return memo[root]


def tree_size(root: Op, limit: int | None = None) -> int:
    """How many nodes ``root`` has written out as a tree (shared nodes counted at each
    use), capped just above ``limit``: the size of a nested print."""
    cap = float("inf") if limit is None else limit + 1
    return fold(root, lambda node, kids: min(cap, 1 + sum(kids)))


def format_ssa(roots: Sequence[Op], names: dict[Op, str] | None = None) -> list[str]:
    """One line per distinct node under ``roots``, operands first: ``%2 = mul.f32 %0 %1``.

    ``names`` (node -> name) is filled in and may carry names over from an earlier
    call (a kernel's reductions, then its stores); the text grows with the number of
    distinct nodes, not with the size of the tree.
    """
    names = {} if names is None else names
    lines = []
    for node in walk(*roots, skip=names):
        name = f"%{len(names)}"
        names[node] = name
        head = f"{name} = {node.op}.{_dtype_name(node.dtype)}"
        if node.op == OpCode.LOAD:
            buffer, index = node.arg
            where = names[node.src[0]] if index is None else str(index)
            mask = load_mask(node)
            lines.append(f"{head} {buffer}[{where}]" + (f" if {names[mask]}" if mask is not None else ""))
        elif node.op == OpCode.ACC:
            lines.append(f"{head} {node.arg[0]}[{node.arg[1]}]")
        elif node.op == OpCode.TEMPLATE_OUT:
            lines.append(f"{head} {node.arg[0]}[{', '.join(map(str, node.arg[1]))}]")
        elif node.op in LEAVES:
            lines.append(f"{head} {node.arg}")
        elif node.op == OpCode.INTRINSIC:
            lines.append(f"{head} {node.arg}({', '.join(names[c] for c in node.src)})")
        else:
            lines.append(f"{head} {' '.join(names[c] for c in node.src)}")
    return lines


def format_kernel(kernel: ScheduledKernel) -> str:
    """A scheduled kernel's loop IR as text (the ``lowering`` log, the debug dump)::

        fxwrap_pointwise_0: ranges=(4, 8) reduction_ranges=()
          %0 = load.f32 arg0[8*x0 + x1]
          %1 = exp.f32 %0
          buf0[8*x0 + x1] = %1
    """
    names: dict[Op, str] = {}
    head = f"{kernel.name}: ranges={tuple(kernel.ranges)} reduction_ranges={tuple(kernel.reduction_ranges)}"
    if kernel.template is not None:
        head += f"  template={kernel.template.op}"
    lines = [head]
    for r in kernel.reductions:
        lines += [f"  {t}" for t in format_ssa([r.value], names)]
        lines.append(f"  {r.name} = {r.kind}.{_dtype_name(r.dtype)}({names[r.value]})")
    for st in kernel.stores:
        lines += [f"  {t}" for t in format_ssa([st.index, st.value] if st.indexed else [st.value], names)]
        lines.append(f"  {format_store(st, names)}")
    return "\n".join(lines)


def format_store(st: Store, names: dict[Op, str]) -> str:
    """``buf0[8*x0 + x1] = %3``; an indexed store (its index's nodes named first, through
    ``format_ssa``) ``arg0[%4] = %5``, or ``arg0[%4] += %5`` when it accumulates."""
    where = names[st.index] if st.indexed else str(st.index)
    return f"{st.buffer}[{where}] {'+=' if st.mode == 'add' else '='} {names[st.value]}"


def load_buffer(load: Op) -> str:
    """The name of the buffer a ``load`` reads."""
    return load.arg[0]


def load_index(load: Op):
    """A ``load``'s index: a sympy expression (direct) or an integer ``Op`` (indirect)."""
    index = load.arg[1]
    return load.src[0] if index is None else index


def load_mask(load: Op) -> Op | None:
    """A ``load``'s mask (a bool ``Op``), or None when it reads unconditionally."""
    first = 1 if load.arg[1] is None else 0
    return load.src[first] if len(load.src) > first else None


def load_key(load: Op) -> tuple:
    """``(buffer, index)`` of a load: what a store at that place would overwrite."""
    return (load.arg[0], load_index(load))


def acc_key(acc: Op) -> tuple[str, int]:
    """``(reduction_name, field)`` of an ``acc``."""
    name, *field = acc.arg
    return (name, int(field[0]) if field else 0)


def is_indirect(index) -> bool:
    """True for an index computed in the kernel (an ``Op``) rather than a sympy expression."""
    return type(index) is Op


def direct_indices(root: Op) -> list:
    """The sympy index expressions of the ``load`` and ``index`` nodes under ``root``
    (an indirect index contributes those of the nodes it is made of), in walk order."""
    out = []
    for node in walk(root):
        if node.op == OpCode.INDEX:
            out.append(node.arg)
        elif node.op == OpCode.LOAD and node.arg[1] is not None:
            out.append(node.arg[1])
    return out


def is_loop_var(s: sympy.Symbol) -> bool:
    """True for a loop variable (``x0``, ``r1``); false for a size symbol (``s0``)."""
    return s.name[:1] in ("x", "r") and s.name[1:].isdigit()


def loop_var_names(expr) -> frozenset[str]:
    """The names of the loop variables a sympy index expression uses."""
    return frozenset(s.name for s in sympy.sympify(expr).free_symbols if is_loop_var(s))


def value_deps(op: Op, cache: dict) -> frozenset:
    """What ``op`` needs to be computed inside a kernel: the names of the loop variables
    its indices (and masks) use, and ``("acc", name)`` for each reduction result it
    reads.  Emitters declare a value in the outermost scope that provides all of it.
    Memoised in ``cache`` (an ``{Op: frozenset}`` shared by one kernel's scopes)."""
    return fold(op, _deps_of, cache)


def _deps_of(node: Op, operand_deps: list) -> frozenset:
    if node.op == OpCode.ACC:
        own = frozenset([("acc", node.arg[0])])
    elif node.op == OpCode.TEMPLATE_OUT:  # the accumulator at the output element: its loop vars
        own = frozenset(s.name for i in node.arg[1] for s in sympy.sympify(i).free_symbols if is_loop_var(s))
    elif node.op == OpCode.INDEX:
        own = loop_var_names(node.arg)
    elif node.op == OpCode.LOAD and node.arg[1] is not None:
        own = loop_var_names(node.arg[1])
    else:
        own = frozenset()
    return own.union(*operand_deps) if operand_deps else own


def split_stores(stores, rvars) -> tuple[list[Store], list[Store]]:
    """A reduction kernel's stores as ``(r_stores, x_stores)``: those whose index uses one
    of the r vars ``rvars`` (they run in a final pass over the reduction range), and
    those that run once per output row; each in kernel order."""
    rnames = {v.name for v in rvars}
    r_stores: list[Store] = []
    x_stores: list[Store] = []
    for st in stores:
        uses_r = any(s.name in rnames for e in st.index_exprs() for s in e.free_symbols)
        (r_stores if uses_r else x_stores).append(st)
    return r_stores, x_stores
