"""Numeric legalization: one pass over a kernel's loop IR that makes every compute dtype,
cast, type promotion and 16-bit rounding explicit, so emitters render only the ops and
casts they are given.

What a target computes natively is a ``Numerics``: the dtypes its arithmetic runs in.
bf16/fp16 are never computed in (every target computes them in float32, as eager's CPU
kernels do); a float dtype the target lacks (float64 on Metal) is computed in float32.
``numerics_for(dtypes)`` builds it from the dtypes a target's kernels may hold
(``CompileSession.kernel_dtypes``: the device's ``capabilities().dtypes`` narrowed by
the emitter's ``supported_dtypes``).

``legalize(kernel, numerics)`` rewrites every value of the kernel (one ``rewrite`` memo
for the whole kernel) so that afterwards:

* an arithmetic node's dtype is its compute dtype, and its operands have that dtype
  (a comparison or logical op: both operands of their promoted compute dtype; ``where``:
  a bool condition and branches of the result's dtype); the one 16-bit arithmetic left
  is an op exact in that type (``EXACT_16BIT``: ``where``, ``maximum``, ``neg``...)
  over operands of it, which needs no rounding (a ``cat`` of bf16 tensors stays a
  ``where.bf16``);
* a 16-bit value is rounded where eager rounds: each bf16/fp16 op becomes the float32
  op followed by ``cast.bf16`` (the rounding), read back by ``cast.f32``;
* a ``cast`` is one conversion, PyTorch's (``c10::convert``: ``double -> bf16`` rounds
  twice, through float; float -> int8 truncates through int64), which emitters render;
* a load reads its buffer's dtype and a store writes its buffer's dtype (``cast`` nodes
  around them where the IR asked for another);
* no cast is from a dtype to itself.

A bf16 ``a * b + c`` (``mul.bf16``, ``add.bf16``) is, legalized::

    %0 = load.bf16 a[x0]          %0 = load.bf16 a[x0]
    %1 = load.bf16 b[x0]          %1 = cast.f32 %0
    %2 = mul.bf16 %0 %1     ->    %2 = load.bf16 b[x0]
    %3 = load.bf16 c[x0]          %3 = cast.f32 %2
    %4 = add.bf16 %2 %3           %4 = mul.f32 %1 %3
                                  %5 = cast.bf16 %4       (round to bf16)
                                  %6 = cast.f32 %5
                                  %7 = load.bf16 c[x0]
                                  %8 = cast.f32 %7
                                  %9 = add.f32 %6 %8
                                  %10 = cast.bf16 %9

The lowerings already build values of this form (``LoweringContext.pointwise`` computes
in ``compute_dtype`` and casts back), so for them the pass changes nothing; it
legalizes what a plugin's lowering or a hand-built kernel leaves implicit.  Emitters may
hold a 16-bit value in a float32 local (``cast.f32`` of it is then free and
``cast.bf16`` is the rounding).  Reductions keep their ``dtype`` (the accumulator's)
and value as built; the emitters convert a value to its accumulator.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fxwrap.ir.loops import BOOL_RESULT, EXACT_16BIT, LEAVES, Op, OpCode, ScheduledKernel, rewrite

LOW_PRECISION = frozenset({torch.bfloat16, torch.float16})
"""Float dtypes no target computes in: held as float32 values rounded to their precision."""


@dataclass(frozen=True)
class Numerics:
    """The dtypes a target's arithmetic runs in (``native``); every other float dtype is
    computed in float32.  ``Numerics()`` computes everything but bf16/fp16 natively."""

    native: frozenset | None = None  # None: every dtype but LOW_PRECISION

    def compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a value of ``dtype`` is computed in: bf16/fp16 (and a float dtype the
        target lacks) in float32, every other dtype in itself."""
        if dtype in LOW_PRECISION:
            return torch.float32
        if self.native is not None and dtype not in self.native and dtype.is_floating_point:
            return torch.float32
        return dtype


DEFAULT = Numerics()


def numerics_for(dtypes) -> Numerics:
    """The ``Numerics`` of a target whose kernels may hold ``dtypes``: those but
    bf16/fp16, plus float32, bool and int64 (every kernel computes in them)."""
    native = frozenset(dtypes) - LOW_PRECISION | {torch.float32, torch.bool, torch.int64}
    return Numerics(native)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """bf16/fp16 compute in float32 (``DEFAULT.compute_dtype``)."""
    return DEFAULT.compute_dtype(dtype)


def holds_exact(value: Op, dtype: torch.dtype) -> bool:
    """Whether the float32 ``value`` is, for every input, a value of the 16-bit ``dtype``
    (so ``cast.dtype`` of it rounds nothing): a 16-bit value read back (``cast.f32`` of a
    ``dtype`` value), a constant of ``dtype``, or an ``EXACT_16BIT`` op of such values.
    A NaN among them is one a ``dtype`` value holds.  Legalized bf16 ``relu`` is::

        %1 = cast.f32 %0              (%0: a bf16 load or rounding)
        %2 = maximum.f32 %1 0.0       holds_exact(%2, torch.bfloat16) -> True
        %3 = cast.bf16 %2             (a store may write %2's high half)
    """
    if value.dtype != torch.float32 or dtype not in LOW_PRECISION:
        return False
    seen: dict[Op, bool] = {}

    def exact(v: Op) -> bool:
        if v in seen:
            return seen[v]
        if v.op == OpCode.CAST:
            ok = v.src[0].dtype == dtype
        elif v.op == OpCode.CONST:
            x = v.arg
            ok = x != x or torch.tensor(x, dtype=dtype).item() == x
        elif v.op in EXACT_16BIT and v.dtype == torch.float32:
            operands = v.src[1:] if v.op == OpCode.WHERE else v.src  # where: the condition is bool
            ok = all(exact(o) for o in operands)
        else:
            ok = False
        seen[v] = ok
        return ok

    return exact(value)


def _cast(x: Op, dtype: torch.dtype) -> Op:
    """``x`` as ``dtype``: one ``cast`` node (none when it already is).

    A ``cast`` converts as PyTorch does (``c10::convert``): to bf16/fp16 it rounds once
    to nearest even, from float64 through float32 (twice, like c10); a float to an
    integer truncates, through int64.  Emitters render each cast as that conversion.
    """
    return x if x.dtype == dtype else Op(OpCode.CAST, dtype, (x,))


def _div16(code: OpCode, dtype: torch.dtype, a: Op, b: Op) -> Op:
    """bf16/fp16 ``truncdiv``/``floordiv`` of float32 operands as eager's vectorized
    kernels compute them: the float32 algorithm with every intermediate rounded to
    ``dtype`` (``R``)::

        truncdiv: trunc(R(a / b))
        floordiv: b == 0 ? R(a / b) : d == 0 ? copysign(0, R(a / b)) : f, where
                  m = fmod(a, b); d = R(R(a - m) / b), less 1 (rounded) where m != 0 and
                  m, b differ in sign; f = floor(d), plus 1 (rounded) where R(d - f) > 0.5
    """
    f32 = torch.float32

    def op(name, *src):
        return Op(name, torch.bool if OpCode.of(name) in BOOL_RESULT else f32, src)

    def r(x):
        return Op(OpCode.CAST, f32, (Op(OpCode.CAST, dtype, (x,)),))

    q = r(op("truediv", a, b))
    if code == OpCode.TRUNCDIV:
        return op("trunc", q)
    zero, one, half = Op.const(0.0, f32), Op.const(1.0, f32), Op.const(0.5, f32)
    m = op("fmod", a, b)
    d = r(op("truediv", r(op("sub", a, m)), b))
    adjust = op("logical_and", op("ne", m, zero), op("ne", op("lt", b, zero), op("lt", m, zero)))
    d = op("where", adjust, r(op("sub", d, one)), d)
    f = op("floor", d)
    f = op("where", op("gt", r(op("sub", d, f)), half), r(op("add", f, one)), f)
    f = op("where", op("eq", d, zero), op("copysign", zero, q), f)
    return op("where", op("eq", b, zero), q, f)


class _Legalizer:
    def __init__(self, kernel: ScheduledKernel, numerics: Numerics):
        self.n = numerics
        self.buffers = {b.name: b.dtype for b in (*kernel.inputs, *kernel.outputs)}
        self.memo: dict[Op, Op] = {}

    def value(self, root: Op) -> Op:
        return rewrite(root, self.rule, self.memo)

    def rule(self, node: Op) -> Op | None:
        code, n = node.op, self.n
        if code == OpCode.LOAD:
            stored = self.buffers.get(node.arg[0], node.dtype)
            if stored == node.dtype:
                return None
            return self._from(node.replace(dtype=stored), node.dtype)
        if code == OpCode.CONST:
            compute = n.compute_dtype(node.dtype)
            if compute == node.dtype or node.dtype in LOW_PRECISION:
                return None  # a 16-bit constant is a value of that type (exact in it)
            return Op.const(float(torch.tensor(node.arg, dtype=compute).item()), compute)
        if code in LEAVES:  # index: an integer; acc: a result in its reduction's dtype
            return None
        if code == OpCode.CAST:
            return self._from(node.src[0], node.dtype)
        if code in BOOL_RESULT:
            common = node.src[0].dtype
            for s in node.src[1:]:
                common = torch.promote_types(common, s.dtype)
            compute = n.compute_dtype(common)
            src = tuple(self._to(s, compute) for s in node.src)
            return None if src == node.src else node.replace(src=src)
        compute = n.compute_dtype(node.dtype)
        if node.dtype in LOW_PRECISION and code in EXACT_16BIT and \
                all(s.dtype == node.dtype for s in node.src[code == OpCode.WHERE:]):
            # exact in the 16-bit type (where, maximum, neg...): no rounding to make explicit
            compute = node.dtype
        if code == OpCode.WHERE:
            src = (self._to(node.src[0], torch.bool),) + tuple(self._to(s, compute) for s in node.src[1:])
        else:
            src = tuple(self._to(s, compute) for s in node.src)
        if compute == node.dtype:
            return None if src == node.src else node.replace(src=src)
        if code in (OpCode.TRUNCDIV, OpCode.FLOORDIV) and node.dtype in LOW_PRECISION:
            return self._from(_div16(code, node.dtype, *src), node.dtype)
        # computed in ``compute``, then rounded to (held as) its own dtype
        return self._from(Op(code, compute, src, node.arg), node.dtype)

    def _to(self, x: Op, dtype: torch.dtype) -> Op:
        """Operand ``x`` (already legal) as a value of compute dtype ``dtype``."""
        if x.dtype == dtype:
            return x
        # a value held in a dtype the target lacks (float64 on Metal) is already computed
        # in ``dtype``: read it through what it was computed in
        return _cast(x, dtype)

    def _from(self, x: Op, dtype: torch.dtype) -> Op:
        """``x`` (legal, of its compute dtype) as a value of ``dtype`` as the IR asked
        for it; a dtype the target lacks stays its compute dtype."""
        want = dtype if dtype in LOW_PRECISION else self.n.compute_dtype(dtype)
        return _cast(x, want)


def illegal(code, dtype: torch.dtype, arg_dtypes) -> str | None:
    """Why an op ``code`` of ``dtype`` over operands of ``arg_dtypes`` is not legal IR (an
    emitter's check), or None: computed in a 16-bit dtype, or over operands not of its
    compute dtype (a comparison: of one dtype; ``where``: a bool condition)."""
    try:
        code = OpCode.of(code)
    except ValueError:  # no loop-IR op: the emitter's own error names it
        return None
    if code in LEAVES or code == OpCode.CAST:
        return None
    compute = arg_dtypes[-1] if code in BOOL_RESULT else dtype
    want = [torch.bool, compute, compute] if code == OpCode.WHERE else [compute] * len(arg_dtypes)
    if (compute in LOW_PRECISION and code not in EXACT_16BIT) or list(arg_dtypes) != want:
        return (f"op {code} ({dtype}) over {[str(d) for d in arg_dtypes]} is not legalized: run "
                "fxwrap.core.numerics.legalize(kernel, numerics) before rendering (the renderer does)")
    return None


def legalize(kernel: ScheduledKernel, numerics: Numerics = DEFAULT) -> ScheduledKernel:
    """``kernel`` with every value legalized (see the module docstring); the kernel
    itself when nothing changes."""
    lg = _Legalizer(kernel, numerics)
    reductions = tuple(r if (v := lg.value(r.value)) is r.value else dataclasses.replace(r, value=v)
                       for r in kernel.reductions)
    stores = []
    for st in kernel.stores:
        v = lg.value(st.value)
        want = lg.buffers.get(st.buffer, v.dtype)
        if v.dtype != want:
            v = _cast(v, want)
        index = lg.value(st.index) if st.indexed else st.index
        stores.append(st if v is st.value and index is st.index else dataclasses.replace(st, index=index, value=v))
    stores = tuple(stores)
    if all(a is b for a, b in zip(reductions, kernel.reductions)) and \
            all(a is b for a, b in zip(stores, kernel.stores)):
        return kernel
    return dataclasses.replace(kernel, reductions=reductions, stores=stores)


