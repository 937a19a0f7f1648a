"""View rules over lazy values: an index remap, no data movement.

``aten.permute(y, [1, 0])`` of a lazy ``y`` reads ``y[(i1, i0)]`` at index
``(i0, i1)``.  Views of tensors already in memory stay ``View`` lines (an
``as_strided``), so these rules only see ``Loops``.
"""
from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from fxwrap.core.lowering import Loops, Unsupported, register

aten = torch.ops.aten


def _lazy(x) -> Loops:
    if not isinstance(x, Loops):
        raise Unsupported("view of a stored tensor is a View line")
    return x


def _remap(ctx, x: Loops, fn) -> Loops:
    return Loops(ctx.out_size, x.dtype, ctx.device, lambda i: x(fn(i)))


@register(aten.permute.default)
def _permute(ctx, x, dims):
    x = _lazy(x)
    n = len(x.size)
    dims = [d % n for d in dims]

    def fn(i):
        src = [None] * n
        for k, d in enumerate(dims):
            src[d] = i[k]
        return tuple(src)
    return _remap(ctx, x, fn)


@register(aten.expand.default)
def _expand(ctx, x, size, implicit=False):
    x = _lazy(x)
    lead = len(ctx.out_size) - len(x.size)
    return _remap(ctx, x, lambda i: tuple(sympy.Integer(0) if n == 1 else i[lead + k]
                                          for k, n in enumerate(x.size)))


@register(aten.slice.Tensor)
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    x = _lazy(x)
    dim %= len(x.size)
    # the node's meta gives the resulting length; start is clamped like eager's
    start = 0 if start is None else start
    if isinstance(start, int) and start < 0:
        if not isinstance(x.size[dim], sympy.Integer):
            raise Unsupported("negative start on a symbolic dim")
        start = max(int(x.size[dim]) + start, 0)
    start = sympy.Min(sympy.sympify(start), x.size[dim]) if not isinstance(start, int) else \
        (min(start, int(x.size[dim])) if x.size[dim].is_Integer else start)
    return _remap(ctx, x, lambda i: tuple(start + step * v if k == dim else v for k, v in enumerate(i)))


@register(aten.select.int)
def _select(ctx, x, dim, index):
    x = _lazy(x)
    dim %= len(x.size)
    if isinstance(index, int) and index < 0:
        index = x.size[dim] + index
    return _remap(ctx, x, lambda i: tuple(i[:dim]) + (sympy.sympify(index),) + tuple(i[dim:]))


@register([aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
           aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default])
def _reshape(ctx, x, *args):
    x = _lazy(x)
    old = x.size
    new = ctx.out_size
    kept_old = [k for k, n in enumerate(old) if n != 1]
    kept_new = [k for k, n in enumerate(new) if n != 1]
    if [old[k] for k in kept_old] == [new[k] for k in kept_new]:
        # only size-1 dims added or removed
        def fn(i):
            src = [sympy.Integer(0)] * len(old)
            for ko, kn in zip(kept_old, kept_new):
                src[ko] = i[kn]
            return tuple(src)
        return _remap(ctx, x, fn)

    groups = _reshape_groups(old, new)
    if groups is None:  # symbolic sizes that do not pair up: through the whole flat index
        groups = [(range(len(old)), range(len(new)))]

    def fn(i):
        src = [sympy.Integer(0)] * len(old)
        for olds, news in groups:
            for k, v in zip(olds, _unflatten(_flatten(i, news, new), [old[k] for k in olds])):
                src[k] = v
        return tuple(src)
    return _remap(ctx, x, fn)


def _reshape_groups(old, new) -> list[tuple[list[int], list[int]]] | None:
    """The dims of a reshape from ``old`` to ``new`` sizes in groups of equal element
    count, each an (old dims, new dims) pair, size-1 dims left out (they read index 0):
    ``(2, 12, 5) -> (2, 3, 4, 5)`` is ``[([0], [0]), ([1], [1, 2]), ([2], [3])]``.  Each
    group's source index depends on its own new dims only, so the index expressions stay
    small (no modulo of the whole flat index).  None where symbolic sizes do not pair up."""
    olds = [k for k, n in enumerate(old) if n != 1]
    news = [k for k, n in enumerate(new) if n != 1]
    groups, a, b = [], 0, 0
    while a < len(olds) and b < len(news):
        go, gn = [olds[a]], [news[b]]
        po, pn = old[olds[a]], new[news[b]]
        a, b = a + 1, b + 1
        while po != pn:
            if not (po.is_Integer and pn.is_Integer):
                return None
            if po < pn and a < len(olds):
                go.append(olds[a])
                po, a = po * old[olds[a]], a + 1
            elif pn < po and b < len(news):
                gn.append(news[b])
                pn, b = pn * new[news[b]], b + 1
            else:
                return None
        groups.append((go, gn))
    if a < len(olds) or b < len(news):
        return None
    return groups


def _flatten(i, dims, sizes) -> sympy.Expr:
    """The row-major flat index of the index variables ``i[d]`` for ``d`` in ``dims``."""
    flat = sympy.Integer(0)
    for d in dims:
        flat = flat * sizes[d] + i[d]
    return flat


def _unflatten(flat, sizes) -> list[sympy.Expr]:
    """The row-major indices into ``sizes`` of flat index ``flat`` (0 for a size-1 dim)."""
    if len(sizes) == 1:
        return [flat]
    src, div = [], sympy.Integer(1)
    for n in reversed(sizes):
        src.append(ModularIndexing(flat, div, n) if n != 1 else sympy.Integer(0))
        div = div * n
    src.reverse()
    first = next((k for k, n in enumerate(sizes) if n != 1), None)
    if first is not None:  # the outermost dim needs no modulo
        src[first] = FloorDiv(flat, div / sympy.Mul(*sizes[:first + 1]))
    return src

