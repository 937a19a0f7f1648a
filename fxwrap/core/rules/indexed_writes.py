"""Indexed writes as kernels: ``index_put`` (and ``index_copy_``, which AOTAutograd
decomposes into it), ``index_add``, ``scatter``, ``scatter_add``, ``scatter_reduce(sum)``.

Each is a kernel over the *source's* elements (the values put, or the index of a
scatter) that stores each one at the offset its indices name (an indexed ``Store``,
``fxwrap.ir.loops``): it writes only the elements it touches.  Where it writes is
``ctx.indexed_write_target()``: ``self``'s own storage when nothing reads the old value
afterwards and the program may write it (``core.reinplace``: a KV cache, a buffer the
program writes back, an intermediate that dies here), else a new buffer holding a copy of
``self`` (a lazy ``self`` computed straight into it).  The static-cache write
``cache.index_copy_(1, pos, v)`` on a module buffer (``(2, 16, 8)``, ``v`` of
``(2, 1, 8)``) is one kernel over ``v``'s 16 elements and nothing else::

    check_index_bounds(arg1, 16, 1, True)        # host-checked targets: every position in range
    fxwrap_pointwise_0(arg1, arg2, arg0)         # arg0[128*x0 + 8*wrap(arg1[x1]) + x2] = arg2[...]

and the write-back ``copy_(arg0, index_put)`` has nothing left to do.

Duplicate indices follow eager: ``accumulate=True`` / ``scatter_add`` store with
``mode="add"`` (each addition whole: atomics or a serial loop, as the emitter renders it);
a plain write keeps one of the values, as eager's is unspecified.  Indices are checked as
for the gathers (``indexing._checked``: a host check before the kernel, or
``index_check`` in it), so an index out of range never writes outside the tensor.  A
target whose emitter cannot render the store (``KernelEmitter.indexed_stores``: the mode,
the dtype) keeps the ATen op: the extern, on a copy of ``self``.
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.ir.loops import Op, Store, load_buffer, walk, xvar
from fxwrap.core.lowering import Loops, Stored, Unsupported, as_loops, broadcast, cast, const, index_value, register
from fxwrap.core.rules.indexing import I64, _checked, _index_tensor, _scatter_one_hot, _wrap

aten = torch.ops.aten


def _broadcast_sizes(sizes: list[tuple]) -> tuple:
    """The broadcast of several index shapes (sympy sizes): equal, or 1 against any."""
    rank = max(len(s) for s in sizes)
    out = []
    for k in range(rank):
        dim = sympy.Integer(1)
        for s in sizes:
            n = s[k - rank + len(s)] if k - rank + len(s) >= 0 else sympy.Integer(1)
            if n == 1 or n == dim:
                continue
            if dim != 1:
                raise Unsupported(f"index_put: index shapes {sizes} that do not broadcast plainly")
            dim = n
        out.append(dim)
    return tuple(out)


def _offset(buf, at) -> Op:
    """The element offset of ``buf`` at ``at`` (per dim a sympy expression or an int64
    ``Op``), as an int64 value; an ``Op`` term stays even on a dim of size 1 (its checked
    value is 0 there, and the check must run)."""
    direct = sympy.Integer(0)
    terms = []
    for e, st, n in zip(at, buf.stride, buf.size):
        if isinstance(e, Op):
            terms.append(e if st == 1 else Op("mul", I64, (e, index_value(st))))
        elif n != 1:
            direct = direct + e * st
    direct = sympy.expand(direct)
    offset = None if direct == 0 and terms else index_value(direct)
    for t in terms:
        offset = t if offset is None else Op("add", I64, (offset, t))
    return offset


def _reads_target(ctx, value, target) -> bool:
    builder = ctx.builder
    if isinstance(value, Stored):
        return builder.same_storage(value.buffer, target)
    return isinstance(value, Loops) and builder.reads_storage(value, target)


def _apart(ctx, value, target):
    """``value`` (an operand of the write) as it must be read by the kernel writing
    ``target``: realized first when it reads ``target``'s storage (otherwise the kernel
    could read elements other iterations already wrote)."""
    if _reads_target(ctx, value, target):
        stored = ctx.stored(value) if isinstance(value, Loops) else None
        if stored is None or _reads_target(ctx, stored, target):
            raise Unsupported(f"{ctx.node.target}: an operand that is a view of the tensor written")
        return stored
    return value


def _target(ctx, mode, base) -> tuple:
    """``(target buffer, in place)`` of this write; Unsupported where the target cannot
    render the store (the op stays its ATen extern)."""
    dtype = ctx.out_dtype
    if not ctx.indexed_stores(mode, dtype):
        raise Unsupported(f"{ctx.node.target}: the target renders no indexed store "
                          f"{'adding ' if mode else ''}into {dtype}")
    if len(ctx.out_size) == 0:
        raise Unsupported(f"{ctx.node.target} into a 0-d tensor")
    return ctx.indexed_write_target()


@register(aten.index_put.default)
def _index_put(ctx, base, indices, values, accumulate=False):
    """``base[indices] = values`` (``+=`` with ``accumulate``): integer index tensors,
    ``None`` for a whole dim; a kernel over the indexed result's shape."""
    size = ctx.out_size
    rank = len(size)
    if len(indices) > rank or not any(t is not None for t in indices):
        raise Unsupported("index_put with more indices than dims, or none")
    given = [k for k, t in enumerate(indices) if t is not None]
    for k in given:
        _index_tensor(indices[k])  # integer index tensors only (a bool mask stays the extern)
    ishape = _broadcast_sizes([as_loops(indices[k]).size for k in given])
    adjacent = given == list(range(given[0], given[-1] + 1))
    rest = [d for d in range(rank) if d not in given]
    before = [d for d in rest if d < given[0]] if adjacent else []
    after = [d for d in rest if d not in before]
    ranges = tuple(size[d] for d in before) + ishape + tuple(size[d] for d in after)
    mode = "add" if accumulate else None
    target, _ = _target(ctx, mode, base)
    checked = {k: _checked(ctx, _apart(ctx, indices[k], target), size[k], k, negative_ok=True) for k in given}
    vals = broadcast(as_loops(_apart(ctx, values, target)), ranges)
    ni = len(ishape)

    xs = tuple(xvar(i) for i in range(len(ranges)))
    ipos = xs[len(before):len(before) + ni]
    at: list = [None] * rank
    for j, d in enumerate(before):
        at[d] = xs[j]
    for j, d in enumerate(after):
        at[d] = xs[len(before) + ni + j]
    for k in given:
        loops = checked[k]
        own = ipos[ni - len(loops.size):]
        inner = tuple(sympy.Integer(0) if n == 1 else v for v, n in zip(own, loops.size))
        at[k] = _wrap(cast(loops(inner), I64), size[k])
    offset = _offset(target, at)
    value = cast(vals(xs), target.dtype)
    ctx.indexed_job(ranges, Store(target.name, offset, value, mode))
    return Stored(target)


@register(aten.index_add.default)
def _index_add(ctx, base, dim, index, source, *, alpha=1):
    """``base.index_add(dim, index, source, alpha=alpha)``: ``index_put`` accumulating
    ``alpha * source`` along ``dim``."""
    rank = len(ctx.out_size)
    if rank == 0 or len(_index_tensor(index).size) != 1:
        raise Unsupported("index_add of a 0-d tensor or with a multi-dimensional index")
    dim %= rank
    src = as_loops(source)
    if alpha != 1:
        dtype = ctx.out_dtype
        scaled = src
        src = Loops(scaled.size, dtype, ctx.device, lambda i: Op("mul", dtype, (cast(scaled(i), dtype),
                                                                               const(alpha, dtype))))
    return _index_put(ctx, base, [None] * dim + [index], src, accumulate=True)


def _scatter(ctx, base, dim, index, src, mode):
    """``base.scatter(dim, index, src)``: a kernel over ``index``'s elements; ``src`` a
    tensor (read at the same position) or a number."""
    size = ctx.out_size
    rank = len(size)
    idx = _index_tensor(index)
    if rank == 0 or len(idx.size) != rank:
        raise Unsupported("scatter of a 0-d tensor or with an index of another rank")
    dim %= rank
    target, _ = _target(ctx, mode, base)
    checked = _checked(ctx, _apart(ctx, index, target), size[dim], dim, negative_ok=False)
    ranges = idx.size
    xs = tuple(xvar(i) for i in range(rank))
    if isinstance(src, (Loops, Stored)):
        source = as_loops(_apart(ctx, src, target))
        value = cast(source(xs), target.dtype)
    elif isinstance(src, (bool, int, float)):
        value = const(src, target.dtype)
    else:
        raise Unsupported(f"scatter of {src!r}")
    at = tuple(cast(checked(xs), I64) if d == dim else xs[d] for d in range(rank))
    ctx.indexed_job(ranges, Store(target.name, _offset(target, at), value, mode))
    return Stored(target)


@register(aten.scatter.src)
def _scatter_src(ctx, base, dim, index, src):
    return _scatter(ctx, base, dim, index, src, None)


@register(aten.scatter.value)
def _scatter_value(ctx, base, dim, index, value):
    """In place where it may be; else the one-hot (a pass over ``base``, lazy) where the
    index is one position per row; else a kernel on a copy of ``base``."""
    if ctx.in_place_refusal() is not None or not ctx.indexed_stores(None, ctx.out_dtype):
        try:
            return _scatter_one_hot(ctx, base, dim, index, value)
        except Unsupported:
            pass
    return _scatter(ctx, base, dim, index, value, None)


@register(aten.scatter_add.default)
def _scatter_add(ctx, base, dim, index, src):
    return _scatter(ctx, base, dim, index, src, "add")


@register(aten.scatter.reduce)
def _scatter_reduce_src(ctx, base, dim, index, src, *, reduce):
    if reduce != "add":
        raise Unsupported(f"scatter with reduce={reduce!r}")
    return _scatter(ctx, base, dim, index, src, "add")


@register(aten.scatter.value_reduce)
def _scatter_reduce_value(ctx, base, dim, index, value, *, reduce):
    if reduce != "add":
        raise Unsupported(f"scatter with reduce={reduce!r}")
    return _scatter(ctx, base, dim, index, value, "add")


@register(aten.scatter_reduce.two)
def _scatter_reduce(ctx, base, dim, index, src, reduce, *, include_self=True):
    if reduce != "sum" or not include_self:
        raise Unsupported(f"scatter_reduce {reduce!r} (include_self={include_self})")
    return _scatter(ctx, base, dim, index, src, "add")
