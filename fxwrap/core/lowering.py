"""Registry: ATen overload -> loop-IR value, with per-target tables that win over
the default.  Anything without a rule stays a ``CallExtern`` (correct by
construction).

A rule takes a ``LoweringContext`` plus the node's arguments (tensors arrive as
``TensorValue``s) and returns a ``TensorValue`` or ``None`` (None: use the
extern).  Pointwise rules return lazy ``Loops``: a function from index
expressions to an ``Op``, inlined into whatever consumes them::

    @register(aten.sigmoid.default)
    def _sigmoid(ctx, x):
        return ctx.pointwise("sigmoid", x)

    # lowering aten.mul(aten.sigmoid(a), 2.0) over (s0, 64) gives, at index (x0, x1):
    # Op("mul", f32, (Op("sigmoid", f32, (Op.load("arg0", 64*x0 + x1, f32),)),
    #                 Op.const(2.0, f32)))
"""
from __future__ import annotations

import difflib
import operator
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from fxwrap.ir.loops import Op, OpCode, load_mask, result_dtype, rewrite
from fxwrap.core.building import RuleBuilder
from fxwrap.ir.capabilities import Capabilities
from fxwrap.ir.intrinsics import Intrinsic
from fxwrap.core.numerics import compute_dtype  # bf16/fp16 compute in float32 (rules import it from here)
from fxwrap.ir.symbolic import to_expr
from fxwrap.ir.lines import Buffer

aten = torch.ops.aten
prims = torch.ops.prims

class Loops:
    """A lazily computed tensor: ``size``, ``dtype``, and ``fn(index) -> Op``.

    ``fn`` is memoised per index, so deep graphs with fan-out inline in linear time.
    """

    def __init__(self, size: Sequence[sympy.Expr], dtype: torch.dtype, device: torch.device,
                 fn: Callable[[tuple], Op]):
        self.size = tuple(sympy.sympify(s) for s in size)
        self.dtype = dtype
        self.device = device
        self._fn = fn
        self._memo: dict[tuple, Op] = {}

    def __call__(self, index: Sequence[sympy.Expr]) -> Op:
        key = tuple(index)
        got = self._memo.get(key)
        if got is None:
            got = self._fn(key)
            self._memo[key] = got
        return got


@dataclass(frozen=True)
class Stored:
    """A tensor already in memory (an input, an extern result, a kernel output)."""

    buffer: Buffer


TensorValue = Loops | Stored


def loads(buf: Buffer) -> Loops:
    """``Loops`` reading ``buf`` through its own strides (the pointer is the tensor's
    data pointer, so the storage offset is already applied)."""
    def fn(index):
        flat = sum((i * s for i, s, n in zip(index, buf.stride, buf.size) if n != 1), sympy.Integer(0))
        return Op.load(buf.name, sympy.expand(flat), buf.dtype)
    return Loops(buf.size, buf.dtype, buf.device, fn)


def as_loops(value: TensorValue) -> Loops:
    return loads(value.buffer) if isinstance(value, Stored) else value


def cast(op: Op, dtype: torch.dtype) -> Op:
    if op.dtype == dtype:
        return op
    if op.op == OpCode.CONST:
        value = op.arg
        if not dtype.is_floating_point and dtype != torch.bool and isinstance(value, float) \
                and math.isfinite(value):
            value = int(value)
        return Op.const(value, dtype)
    return Op(OpCode.CAST, dtype, (op,))


@dataclass(frozen=True)
class SizeAssumption:
    """A relation between sizes that a lowered value relies on and that the traced graph's
    shapes do not state.  ``broadcast`` reading a value of size ``(s5, s0, 7)`` as one of
    size ``(s5, 3, 7)`` indexes dimension 1 as if ``s0 == 3``: dynamo's ShapeEnv holds that
    guard where torch's shape function checks the broadcast (``add``), but ``index_put``'s
    does not check its values, and an input with ``s0 = 4`` would run, reading the values
    with the wrong strides, where eager raises.  The program's input guard checks every
    assumption its lowering made (``wrapper_ir.guards``)::

        SizeAssumption(Eq(s0, 3), "a value of size (s5, s0, 7) as one of size (s5, 3, 7)")
    """

    condition: sympy.Basic
    what: str


# where ``broadcast`` records its assumptions: the list of the rule being run (None: not recorded)
_RECORDED_ASSUMPTIONS: ContextVar[list[SizeAssumption] | None] = ContextVar("fxwrap_size_assumptions",
                                                                            default=None)


@contextmanager
def recording_size_assumptions(into: list[SizeAssumption]) -> Iterator[list[SizeAssumption]]:
    """Within it (on this thread), the size relations lowering relies on append to ``into``
    (the kernel builder runs each rule in one: a rule that gives up leaves none)."""
    token = _RECORDED_ASSUMPTIONS.set(into)
    try:
        yield into
    finally:
        _RECORDED_ASSUMPTIONS.reset(token)


def assume_equal_size(have: sympy.Expr, want: sympy.Expr, what: str) -> None:
    """Record that the value being built is right only where ``have == want`` at run time
    (see ``SizeAssumption``); nothing where sympy sees them equal or they are numbers."""
    recorded = _RECORDED_ASSUMPTIONS.get()
    if recorded is None:
        return
    have, want = sympy.sympify(have), sympy.sympify(want)
    if have == want or not (have.free_symbols or want.free_symbols):
        return
    condition = sympy.Eq(have, want)
    if condition is sympy.true or condition is sympy.false:
        return
    assumption = SizeAssumption(condition, what)
    if assumption not in recorded:
        recorded.append(assumption)


def broadcast(loops: Loops, size: Sequence[sympy.Expr]) -> Loops:
    """``loops`` read as a value of ``size`` (numpy's rules: leading dimensions added, a
    dimension of size 1 read at 0).  Any other dimension is read as it is: its size must
    equal ``size``'s, which is recorded as a ``SizeAssumption`` where it is a relation
    between different symbols."""
    size = tuple(sympy.sympify(s) for s in size)
    if loops.size == size:
        return loops
    lead = len(size) - len(loops.size)
    for k, n in enumerate(loops.size):
        if n != 1:
            assume_equal_size(n, size[lead + k], f"a value of size {_shown(loops.size)} as one of "
                                                  f"size {_shown(size)}")

    def fn(index):
        inner = tuple(sympy.Integer(0) if n == 1 else index[lead + k] for k, n in enumerate(loops.size))
        return loops(inner)
    return Loops(size, loops.dtype, loops.device, fn)


def _shown(size) -> str:
    return f"({', '.join(str(n) for n in size)}{',' if len(size) == 1 else ''})"


class Unsupported(Exception):
    """Raised inside a rule for a case it does not cover: the node becomes an extern."""


class _Decline:
    """The type of ``DECLINE`` (one instance, named in reprs)."""

    def __repr__(self) -> str:
        return "fxwrap.DECLINE"

    def __reduce__(self):
        return "DECLINE"


#: What a rule returns to hand the case to the rule it overrides (the one registered
#: before it: an earlier plugin's, the target's own, or fxwrap's), as if it were not
#: there; with no rule beneath, the node is an ATen extern call.  Anything the rule did
#: through ``ctx`` before declining is undone.  (None or ``Unsupported``, by contrast,
#: make the node an extern at once.)::
#:
#:     def my_gelu(ctx, x, approximate="none"):
#:         if approximate != "tanh":
#:             return fxwrap.DECLINE        # fxwrap's own gelu rule handles it
#:         return ctx.map(my_tanh_gelu, x)
DECLINE = _Decline()


class LoweringError(ValueError):
    """A lowering rule was registered wrongly (an unknown target name, a key that is no ATen op)."""


def overloads_of(op) -> list:
    """The ``OpOverload``s a registry key stands for: an ``OpOverloadPacket``
    (``aten.sin``) is every overload it has (``aten.sin.default``, ``aten.sin.out``, ...)."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


class LoweringRegistry:
    """``{OpOverload: rule}`` with per-target tables that win over the default.

    ``register(aten.sin, rule)`` (a packet) registers every overload of ``aten.sin``.
    ``known_targets``: the target names ``register(..., target=name)`` accepts (None: any
    name; the process-wide ``REGISTRY`` is filled at import, before plugins load, and is
    checked when a compile session is built, see ``check_targets``)::

        >>> registry = LoweringRegistry(known_targets=["cpu", "cuda"])
        >>> registry.register(aten.sin, lambda ctx, x: x, target="cdua")
        Traceback (most recent call last):
        fxwrap.core.lowering.LoweringError: no fxwrap target named 'cdua' for the lowering of aten.sin; did you mean 'cuda'?...
    """

    def __init__(self, known_targets=None):
        self.default: dict = {}
        self.per_target: dict[str, dict] = {}
        self.known_targets = None if known_targets is None else frozenset(known_targets)

    def register(self, op, rule=None, *, target: str | None = None):
        if target is not None:
            self._check_target(target, op)

        def add(fn):
            table = self.default if target is None else self.per_target.setdefault(target, {})
            for key in (op if isinstance(op, (list, tuple)) else [op]):
                for overload in overloads_of(key):
                    if not isinstance(overload, torch._ops.OpOverload):
                        raise LoweringError(f"lowering key {overload!r} is not an ATen op (OpOverload or "
                                            "OpOverloadPacket, e.g. torch.ops.aten.sin.default)")
                    table[overload] = fn
            return fn
        return add(rule) if rule is not None else add

    def _check_target(self, target: str, op) -> None:
        if self.known_targets is None or target in self.known_targets:
            return
        raise LoweringError(_unknown_target_message(target, self.known_targets, op))

    def check_targets(self, known_targets) -> None:
        """Raise ``LoweringError`` for a per-target table whose name is no known target."""
        for target, table in self.per_target.items():
            if target not in known_targets:
                raise LoweringError(_unknown_target_message(target, known_targets, next(iter(table), None)))

    def lookup(self, op, target: str):
        table = self.per_target.get(target, {})
        return table.get(op) or self.default.get(op)

    def table(self, target: str) -> dict:
        """``{OpOverload: rule}`` for ``target``: the default rules, its own over them."""
        return {**self.default, **self.per_target.get(target, {})}


def _unknown_target_message(target: str, known, op) -> str:
    close = difflib.get_close_matches(target, sorted(known), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"no fxwrap target named {target!r} for the lowering of {op}; {hint}registered targets: "
            f"{sorted(known)}. Register with target=<one of them> (or no target: every target)")


class LoweringTable:
    """The lowering rules one compile session uses for one target, built once:
    ``table.lookup(aten.sin.default) -> rule | None``.

    ``layers`` are ``{OpOverload: rule}`` dicts, each overriding the ones before it
    (fxwrap's defaults, the target's own rules, each plugin's ``fxwrap_lowerings``).
    """

    def __init__(self, target: str, *layers: dict):
        self.target = target
        self.rules: dict = {}
        #: every rule for an op, the winning one first: where a rule returns ``DECLINE``
        #: the next one runs
        self.chains: dict = {}
        for layer in layers:
            self.rules.update(layer)
            for op, rule in layer.items():
                self.chains[op] = (rule, *self.chains.get(op, ()))

    def lookup(self, op):
        """The winning rule for ``op`` (None: no rule, an extern call)."""
        return self.rules.get(op)

    def rule(self, op):
        """What lowers ``op``: the winning rule, or, where rules lie beneath it, a
        ``DeclinableRule`` that runs the next one whenever one returns ``DECLINE``."""
        chain = self.chains.get(op, ())
        return DeclinableRule(chain) if len(chain) > 1 else self.rules.get(op)

    def __contains__(self, op) -> bool:
        return op in self.rules

    def __len__(self) -> int:
        return len(self.rules)


REGISTRY = LoweringRegistry()
register = REGISTRY.register


@dataclass(frozen=True)
class DeclinableRule:
    """Rules for one op, the winning one first: ``rule(ctx, *args)`` runs each in turn
    until one returns something other than ``DECLINE`` (``ctx.rollback()`` between, so
    a declining rule leaves no trace); all declining: None (an ATen extern call)."""

    chain: tuple

    def __call__(self, ctx, *args, **kwargs):
        for rule in self.chain:
            result = rule(ctx, *args, **kwargs)
            if result is not DECLINE:
                return result
            ctx.rollback()
        return None


def call_operands(overload: torch._ops.OpOverload) -> tuple[str, ...]:
    """The arguments of ``overload`` that an intrinsic replacing it takes as operands: its
    ``Tensor`` and ``Scalar`` arguments, in schema order (``aten.gelu.default``: ``("self",)``;
    ``aten.add.Tensor``: ``("self", "other", "alpha")``)."""
    return tuple(a.name for a in overload._schema.arguments
                 if isinstance(a.type, (torch.TensorType, torch.NumberType)))


def bound_arguments(overload: torch._ops.OpOverload, args: Sequence, kwargs: dict) -> dict:
    """``{name: value}`` of a call of ``overload``: positional ``args`` and ``kwargs`` by their
    schema names, every argument left out at its default."""
    bound = {}
    for i, a in enumerate(overload._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
    return bound


@dataclass(frozen=True)
class IntrinsicRule:
    """What lowers a call of an ATen overload that a target's intrinsics replace
    (``fxwrap.ir.intrinsics``): the first of ``intrinsics`` matching the call's arguments
    and compute dtype, elementwise over the call's operands; any other call ``DECLINE``s to
    the rules beneath (gelu's own: its erf decomposition).  ``aten.gelu.default(x)`` of
    float32 ``(s0,)`` where ``my_gelu`` replaces it, at index ``(x0,)``::

        Op("intrinsic", f32, (Op.load("arg0", x0, f32),), "my_gelu")
    """

    intrinsics: tuple

    def __call__(self, ctx, *args, **kwargs):
        overload = ctx.node.target
        compute = compute_dtype(ctx.out_dtype)
        arguments = bound_arguments(overload, args, kwargs)
        for intrinsic in self.intrinsics:
            if intrinsic.matches(arguments, compute):
                return ctx.map(intrinsic, *(arguments[n] for n in call_operands(overload)), compute=compute)
        return DECLINE


def intrinsic_rules(target: str, intrinsics: Sequence) -> dict:
    """``{OpOverload: IntrinsicRule}`` for the ``intrinsics`` of ``target`` that replace an
    ATen overload, checked: a declaration that cannot replace its overload (operand count,
    ``when`` naming no argument, an op with several results) is a ``LoweringError`` naming
    the intrinsic, the op and the target."""
    from_op: dict = {}
    names = set()
    for intrinsic in intrinsics:
        if not isinstance(intrinsic, Intrinsic):
            raise LoweringError(f"target {target!r} declares {intrinsic!r} as an intrinsic; its emitter's "
                                "intrinsics must be fxwrap.Intrinsic records")
        if intrinsic.name in names:
            raise LoweringError(f"target {target!r} declares two intrinsics named {intrinsic.name!r}; "
                                "give each its own name")
        names.add(intrinsic.name)
        overload = intrinsic.overload
        if overload is None:
            continue
        where = f"intrinsic {intrinsic.name!r} of target {target!r} replaces {intrinsic.replaces}"
        operands = call_operands(overload)
        if len(operands) != intrinsic.operands:
            raise LoweringError(f"{where}, whose call has {len(operands)} operand(s) {list(operands)} (its "
                                f"Tensor and Scalar arguments); the intrinsic takes {intrinsic.operands}. "
                                "Declare operands to match, or replace another overload")
        returns = overload._schema.returns
        if len(returns) != 1 or not isinstance(returns[0].type, torch.TensorType):
            raise LoweringError(f"{where}, which does not return one tensor; an intrinsic replaces "
                                "elementwise ops only (a rule of your own may build its node)")
        options = {a.name for a in overload._schema.arguments} - set(operands)
        unknown = sorted(k for k, _ in intrinsic.when if k not in options)
        if unknown:
            raise LoweringError(f"{where}: when= names {unknown}, which are not its non-operand arguments "
                                f"{sorted(options)}")
        from_op.setdefault(overload, []).append(intrinsic)
    return {op: IntrinsicRule(tuple(found)) for op, found in from_op.items()}


class LoweringContext:
    """What a rule sees: the node being lowered and helpers to build values."""

    def __init__(self, node: torch.fx.Node, device: torch.device):
        self.node = node
        self.device = device
        self.val = node.meta.get("val")

    @property
    def out_dtype(self) -> torch.dtype:
        return self.val.dtype

    def rollback(self) -> None:
        """Undo what the rule did through this context (a rule that returned ``DECLINE``)."""

    @property
    def capabilities(self) -> Capabilities:
        """The target device's ``capabilities()`` (nothing set without a program builder)."""
        return Capabilities()

    @property
    def out_size(self) -> tuple:
        return tuple(to_expr(s) for s in self.val.shape)

    def promoted(self, *args, kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT) -> torch.dtype:
        metas = [self.meta_of(a) for a in args]
        return elementwise_dtypes(*metas, type_promotion_kind=kind)[0]

    def meta_of(self, arg):
        if isinstance(arg, (Loops, Stored)):
            dtype = arg.dtype if isinstance(arg, Loops) else arg.buffer.dtype
            size = arg.size if isinstance(arg, Loops) else arg.buffer.size
            return torch.empty([1] * len(size), dtype=dtype, device="meta")
        if isinstance(arg, sympy.Expr):
            return 1
        return arg

    def operand(self, arg, dtype: torch.dtype, size) -> Loops:
        """``arg`` (tensor value, number or size expression) as Loops of ``dtype``."""
        if isinstance(arg, (Loops, Stored)):
            loops = broadcast(as_loops(arg), size)
            return Loops(size, dtype, self.device, lambda i, l=loops: cast(l(i), dtype))
        if isinstance(arg, sympy.Expr):
            return Loops(size, dtype, self.device, lambda i: cast(Op.index(arg), dtype))
        if isinstance(arg, (bool, int, float)):
            return Loops(size, dtype, self.device, lambda i: cast(Op.const(arg, _py_dtype(arg)), dtype))
        raise Unsupported(f"operand {arg!r}")

    def pointwise(self, name: str, *args, compute: torch.dtype | None = None) -> Loops:
        """``Op(name)`` of ``args`` elementwise, broadcast to the node's size,
        computed in ``compute`` (default: bf16/fp16 upcast of the output, or of the
        promoted inputs for bool results) and cast to the node's dtype."""
        out = self.out_dtype
        if compute is None:
            compute = compute_dtype(out if out != torch.bool else self.promoted(*args))
        size = self.out_size
        ops = [self.operand(a, compute, size) for a in args]
        result = result_dtype(name, compute)

        def fn(index):
            return cast(Op(name, result, tuple(o(index) for o in ops)), out)
        return Loops(size, out, self.device, fn)

    # -- rules that need more than a lazy value (indexing, input mutation) ------
    # They talk to the program builder (``self.builder``, set by the kernel builder)
    # through ``core.building.RuleBuilder`` only; without one they raise Unsupported
    # and the node stays an extern.
    builder: RuleBuilder | None = None

    def _builder(self) -> RuleBuilder:
        builder = self.builder
        if builder is None:
            raise Unsupported(f"{self.node.target}: needs the kernel builder")
        return builder

    def stored(self, value) -> Stored:
        """``value`` (an argument of this node) in memory: a lazy value is realized,
        by a kernel of its own, so an indirect load can address it."""
        if isinstance(value, Stored):
            return value
        buffer = self._builder().in_memory(self.node, value)
        if buffer is None:
            raise Unsupported(f"{self.node.target}: operand is not a node of the graph")
        return Stored(buffer)

    def constant_value(self, value) -> torch.Tensor | None:
        """The tensor ``value`` holds when it is a constant of the program (a ``get_attr``
        node: ``torch.tensor([0, 2, 1])`` written in the traced function) that no node of
        the graph writes: its values are known when the program is built and are the same on
        every call.  None for anything else (inputs, parameters and buffers are inputs, which
        ``param.data`` can change between calls)."""
        builder = self.builder
        buffer = value.buffer if isinstance(value, Stored) else value
        if builder is None or not isinstance(buffer, Buffer):
            return None
        for arg in self.node.all_input_nodes:
            if arg.op != "get_attr" or builder.value_of(arg) is not buffer:
                continue
            tensor = getattr(arg.graph.owning_module, arg.target, None)
            if not isinstance(tensor, torch.Tensor) or any(_writes(user, arg) for user in arg.users):
                return None
            return tensor
        return None

    def realized_output(self, loops: Loops, index: int) -> Stored:
        """Output ``index`` of this multi-output node stored by a kernel job of its own, in
        its traced layout (jobs made one after the other fuse into one kernel, so outputs
        computed by one scan are computed once)."""
        builder = self._builder()
        buf = builder.new_buffer(self.val[index])
        builder.pointwise_job(buf, loops, [self.node.name])
        return Stored(buf)

    def realized(self, loops: Loops) -> Stored:
        """This node's value ``loops`` in memory, stored by a kernel job of its own in the
        node's traced layout: for a value too costly to recompute in each consumer it would
        otherwise be inlined into (gathers through data-dependent indices)."""
        return Stored(self._builder().realize(self.node, loops))

    def emit(self, line) -> None:
        """Put a Wrapper IR line in the program before this node's kernel work.

        A line also ends the fusion group being built (``scheduler.fuse``)."""
        self._builder().emit(line)

    def write_barrier(self) -> None:
        """This node writes an existing buffer: realize every earlier value that is
        used after it, so those values hold what they held before the write."""
        self._builder().write_barrier(self.node)

    def store_into(self, buffer: Buffer, loops: Loops) -> None:
        """A pointwise kernel job writing ``loops`` into ``buffer`` through its strides."""
        self._builder().pointwise_job(buffer, loops, [self.node.name])

    def indexed_stores(self, mode: str | None, dtype: torch.dtype) -> bool:
        """Whether the target renders an indexed store (``Store.indexed``) of ``mode`` (None
        or ``"add"``) into a ``dtype`` buffer; False without a kernel builder."""
        builder = getattr(self, "builder", None)
        return builder is not None and builder.indexed_stores(mode, dtype)

    def in_place_refusal(self) -> str | None:
        """Why this indexed write may not store into its ``self`` in place (None: it may)."""
        return self._builder().in_place_refusal(self.node)

    def indexed_write_target(self) -> tuple[Buffer, bool]:
        """``(buffer, in_place)``: where this indexed write stores (``self``'s own storage,
        or a new buffer holding ``self``'s value)."""
        return self._builder().indexed_write_target(self.node)

    def indexed_job(self, ranges, store) -> None:
        """A kernel of its own making one indexed ``store`` (``Store``) over ``ranges``."""
        self._builder().indexed_job(ranges, store, [self.node.name])

    def map(self, fn: Callable[..., Op], *args, compute: torch.dtype | None = None) -> Loops:
        """Elementwise custom body: ``fn(*ops) -> Op`` over operands cast to ``compute``."""
        out = self.out_dtype
        compute = compute or compute_dtype(out)
        size = self.out_size
        ops = [self.operand(a, compute, size) for a in args]
        return Loops(size, out, self.device, lambda i: cast(fn(*(o(i) for o in ops)), out))


def _py_dtype(value) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    return torch.float64


def const(value, dtype) -> Op:
    return cast(Op.const(value, _py_dtype(value)), dtype)


def index_value(expr) -> Op:
    """An index expression as an int64 value: ``Op.index(expr)``."""
    return Op.index(expr)


def masked(op: Op, mask: Op) -> Op:
    """``op`` with every load under it reading only where ``mask`` holds.

    ``masked(x[i] + 1, i < 5)`` is ``load(x, i, i < 5) + 1``: nothing is read where the
    mask is false (a load already masked gets ``old_mask & mask``), so a value that
    is only meaningful on part of the iteration space (one input of a ``cat``) can
    be computed everywhere and picked with a ``where``.
    """
    def mask_load(load: Op) -> Op:
        old = load_mask(load)
        both = mask if old is None else Op(OpCode.LOGICAL_AND, torch.bool, (old, mask))
        src = load.src if old is None else load.src[:-1]  # the mask is a load's last operand
        return load.replace(src=src + (both,))
    return rewrite(op, {OpCode.LOAD: mask_load})


def _writes(node: torch.fx.Node, arg: torch.fx.Node) -> bool:
    """Whether ``node`` may write ``arg`` (an op whose schema marks the argument written, or
    any call fxwrap cannot read a schema of)."""
    if node.op != "call_function":
        return node.op != "output"
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return not (node.target is operator.getitem)
    for position, argument in enumerate(schema.arguments):
        given = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
        if given is arg and argument.alias_info is not None and argument.alias_info.is_write:
            return True
    return False
