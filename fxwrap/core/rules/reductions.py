"""Reduction rules: sum, mean, prod, amax, amin, argmax, argmin, any, all, var, var_mean; and
``minmax_with_indices``, the rule of max/min over a dim (values and indices) a target opts into.

``aten.sum.dim_IntList(x, [1])`` on ``(s0, 64)`` becomes a reduction with outer
range ``(s0,)``, reduced range ``(64,)`` and body ``x[(x0, r0)]``; the scheduler
fuses it with reductions and pointwise epilogues over the same rows.
"""
from __future__ import annotations

import torch

from fxwrap.ir.loops import Op
from fxwrap.core.lowering import Unsupported, as_loops, cast, compute_dtype, const, register

aten = torch.ops.aten


def _dims(x_size, dim) -> list[int]:
    n = len(x_size)
    if dim is None or dim == [] or dim == ():
        return list(range(n))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % n if n else 0 for d in dim})


def _reduce(ctx, x, dim, keepdim, kind, acc_dtype, finish=None, field=0):
    loops = as_loops(x)
    dims = _dims(loops.size, dim)
    if not loops.size:
        dims = []
    return ctx.reduction(loops, dims, keepdim, kind, acc_dtype, finish=finish, field=field)


@register([aten.sum.dim_IntList, aten.sum.default])
def _sum(ctx, x, dim=None, keepdim=False, *, dtype=None):
    acc = compute_dtype(ctx.out_dtype)
    if acc == torch.bool:
        raise Unsupported("bool sum")
    return _reduce(ctx, x, dim, keepdim, "sum", acc)


@register([aten.mean.dim, aten.mean.default])
def _mean(ctx, x, dim=None, keepdim=False, *, dtype=None):
    acc = compute_dtype(ctx.out_dtype)

    def finish(op, numel):
        return Op("truediv", acc, (op, cast(Op.index(numel), acc)))
    return _reduce(ctx, x, dim, keepdim, "sum", acc, finish=finish)


@register([aten.prod.dim_int, aten.prod.default])
def _prod(ctx, x, dim=None, keepdim=False, *, dtype=None):
    acc = compute_dtype(ctx.out_dtype)
    if acc == torch.bool:
        raise Unsupported("bool prod")
    return _reduce(ctx, x, dim, keepdim, "prod", acc)


def _minmax(kind):
    def rule(ctx, x, dim=None, keepdim=False):
        return _reduce(ctx, x, dim, keepdim, kind, compute_dtype(ctx.out_dtype))
    return rule


register([aten.amax.default], _minmax("max"))
register([aten.amin.default], _minmax("min"))
register([aten.max.default], _minmax("max"))
register([aten.min.default], _minmax("min"))


def _argminmax(kind):
    def rule(ctx, x, dim=None, keepdim=False):
        loops = as_loops(x)
        if dim is None and len(loops.size) > 1:
            raise Unsupported("flattened argmax")
        return _reduce(ctx, loops, dim, keepdim, kind, compute_dtype(loops.dtype))
    return rule


register(aten.argmax.default, _argminmax("argmax"))
register(aten.argmin.default, _argminmax("argmin"))


def minmax_with_indices(kind):
    """The rule of ``x.max(dim)`` (``kind`` ``"max"``) / ``x.min(dim)``: the values, a plain
    reduction, and the indices, an arg-reduction, over the same rows (one kernel reads them
    once).  Not a default: a target whose emitter computes both from one reduction registers
    it (the Triton targets, ``fxwrap_lowerings``); elsewhere ATen's ``max.dim`` runs (the C++
    target's max and argmax over a row were 2.7x ATen's ``max.dim`` at one thread)."""
    def rule(ctx, x, dim, keepdim=False):
        loops = as_loops(x)
        values = _reduce(ctx, loops, dim, keepdim, kind, compute_dtype(loops.dtype))
        indices = _reduce(ctx, loops, dim, keepdim, "arg" + kind, compute_dtype(loops.dtype))
        return (values, indices)
    return rule


def _anyall(kind):
    def rule(ctx, x, dim=None, keepdim=False):
        return _reduce(ctx, x, dim, keepdim, kind, torch.bool)
    return rule


for _op in ("default", "dim", "dims"):
    if _op in aten.any.overloads():
        register(getattr(aten.any, _op), _anyall("any"))
    if _op in aten.all.overloads():
        register(getattr(aten.all, _op), _anyall("all"))


def _correction(correction, unbiased=None):
    if correction is None:
        return 1 if unbiased is None or unbiased else 0
    return correction


@register(aten.var.correction)
def _var(ctx, x, dim=None, *, correction=None, keepdim=False):
    c = _correction(correction)
    acc = compute_dtype(ctx.out_dtype)
    return _reduce(ctx, x, dim, keepdim, "welford", acc, finish=_var_finish(acc, c), field=1)


def _var_finish(acc, c):
    def finish(m2, numel):
        denom = Op("maximum", acc, (Op("sub", acc, (cast(Op.index(numel), acc), const(c, acc))),
                                    const(0, acc)))
        return Op("truediv", acc, (m2, denom))
    return finish


@register(aten.var_mean.correction)
def _var_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    c = _correction(correction)
    acc = compute_dtype(ctx.val[0].dtype)
    var = _reduce(ctx, x, dim, keepdim, "welford", acc, finish=_var_finish(acc, c), field=1)
    mean = _reduce(ctx, x, dim, keepdim, "welford", acc, field=0)
    return (var, mean)

