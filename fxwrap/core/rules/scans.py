"""Scan rules: cumsum, cumprod, logcumsumexp, cummax, cummin.

``aten.cumsum.default(x, 1)`` on ``(s0, s1)`` becomes a scan over the rows: outer range
``(s0,)``, scanned range ``(s1,)``, body ``x[(x0, r0)]`` (a lazy pointwise producer is
inlined: ``cumsum(x * 2)`` reads ``x`` and multiplies in the scan kernel), and one store
per element of the running value::

    acc0 = cumsum.f32(load.f32 arg0[s1*x0 + r0])
    buf0[s1*x0 + r0] = acc.f32 acc0[0]

bf16/fp16 run in float32 (eager's CPU and CUDA kernels accumulate in float32 and round
each output); integer and bool cumsum/cumprod give int64 (the node's dtype).  The scan
of a 0-d tensor is its value (index 0), of an empty one nothing: pointwise values.
"""
from __future__ import annotations

import torch

from fxwrap.ir.loops import Op
from fxwrap.core.lowering import Loops, Unsupported, as_loops, cast, compute_dtype, register

aten = torch.ops.aten


def _scan(ctx, x, dim, kind, acc_dtype, fields):
    loops = as_loops(x)
    rank = len(loops.size)
    if rank == 0 or any(n == 0 for n in loops.size):
        return _trivial(ctx, loops, fields)
    return ctx.scan(loops, dim % rank, kind, acc_dtype, fields)


def _trivial(ctx, loops: Loops, fields):
    """The scan of a 0-d tensor (its one element: the value itself, index 0) or of an
    empty one (nothing): pointwise values, no scan kernel."""
    vals = ctx.val if isinstance(ctx.val, (tuple, list)) else [ctx.val]
    out = []
    for val, field in zip(vals, fields):
        dtype = val.dtype
        if field == 0 and len(fields) == 2:  # cummax/cummin indices
            out.append(Loops(loops.size, dtype, ctx.device, lambda i, d=dtype: Op.const(0, d)))
        else:
            out.append(Loops(loops.size, dtype, ctx.device, lambda i, d=dtype: cast(loops(i), d)))
    return out[0] if len(out) == 1 else tuple(out)


@register(aten.cumsum.default)
def _cumsum(ctx, x, dim, *, dtype=None):
    acc = compute_dtype(ctx.out_dtype)
    if acc == torch.bool:
        raise Unsupported("bool cumsum")
    return _scan(ctx, x, dim, "cumsum", acc, (0,))


@register(aten.cumprod.default)
def _cumprod(ctx, x, dim, *, dtype=None):
    acc = compute_dtype(ctx.out_dtype)
    if acc == torch.bool:
        raise Unsupported("bool cumprod")
    return _scan(ctx, x, dim, "cumprod", acc, (0,))


@register(aten.logcumsumexp.default)
def _logcumsumexp(ctx, x, dim):
    acc = compute_dtype(ctx.out_dtype)
    if not acc.is_floating_point:
        raise Unsupported(f"logcumsumexp of {ctx.out_dtype}")
    return _scan(ctx, x, dim, "logcumsumexp", acc, (0,))


def _cumextreme(kind):
    def rule(ctx, x, dim):
        values = ctx.val[0]
        if values.dtype == torch.bool:
            raise Unsupported(f"{kind} of bool")
        # (values, indices): field 1 is the value, field 0 its index
        return _scan(ctx, x, dim, kind, compute_dtype(values.dtype), (1, 0))
    return rule


register(aten.cummax.default, _cumextreme("cummax"))
register(aten.cummin.default, _cumextreme("cummin"))
