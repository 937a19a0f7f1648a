"""Indexing rules: cat, constant_pad_nd, gather, embedding, index, index_select, copy_.

Values defined piecewise over the output index are a ``where`` over *masked*
loads (nothing is read outside a piece).  ``torch.cat([a, b])`` with ``a`` of
size ``(3, 6)`` and ``b`` of size ``(s0, 6)``, both contiguous, is at ``(x0, x1)``::

    where(x0 < 3,
          load(a, 6*x0 + x1, x0 < 3),
          load(b, 6*x0 + x1 - 18, x0 >= 3))

Data-dependent reads are *indirect* loads (the offset is a value of the kernel,
see ``fxwrap.ir.loops``).  ``torch.gather(x, 1, idx)`` with ``x`` of stride
``(6, 1)`` and ``idx`` of stride ``(3, 1)`` reads, at ``(x0, x1)``::

    load(x, index(6*x0) + cast<i64>(load(idx, 3*x0 + x1)))

and puts ``check_index_bounds(idx, 6, 1, False)`` (``fxwrap.runtime.checks``) on
the host before the kernel: an index out of range raises ``IndexError`` instead of
reading outside ``x``.  ``x[idx]`` (negative indices allowed) wraps them in the
kernel: ``where(v < 0, v + n, v)``.

``x.copy_(y)`` on a graph input (what functionalization leaves for input
mutation) is a kernel storing ``y`` into ``x``'s own buffer; every earlier value
that is read later is realized first, and the write starts a kernel of its own.
"""
from __future__ import annotations

import sympy
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from fxwrap.ir.loops import Op, OpCode, Store, load_buffer, load_index, load_mask, rewrite, xvar
from fxwrap.core.lowering import (
    Loops, Stored, Unsupported, as_loops, broadcast, cast, const, index_value, masked, register,
)
from fxwrap.ir.symbolic import index_in_range, index_nonnegative
from fxwrap.runtime.checks import check_index_bounds
from fxwrap.ir.lines import CallExtern, Comment

aten = torch.ops.aten
I64 = torch.int64
_INDEX_DTYPES = (torch.int64, torch.int32)


def _and(a: Op | None, b: Op) -> Op:
    return b if a is None else Op("logical_and", torch.bool, (a, b))


def _cmp(name: str, a, b) -> Op:
    """``a <name> b`` of two index expressions, as a bool value."""
    return Op(name, torch.bool, (index_value(a), index_value(b)))


# -- piecewise: cat, constant_pad_nd -------------------------------------------------

@register(aten.cat.default)
def _cat(ctx, tensors, dim=0):
    rank = len(ctx.out_size)
    if rank == 0:
        raise Unsupported("cat of 0-d tensors")
    dim %= rank
    out = ctx.out_dtype
    pieces, start = [], sympy.Integer(0)  # (first index along dim, length, values)
    for t in tensors:
        loops = as_loops(t)
        if len(loops.size) != rank:
            if len(loops.size) == 1 and loops.size[0] == 0:
                continue  # cat skips legacy empty 1-d tensors
            raise Unsupported("cat of tensors of different ranks")
        n = loops.size[dim]
        if n == 0:
            continue
        pieces.append((start, n, loops))
        start = start + n
    if not pieces:
        raise Unsupported("cat of empty tensors")

    def fn(i):
        d = i[dim]
        value = None
        for k in reversed(range(len(pieces))):
            lo, n, loops = pieces[k]
            piece = cast(loops(tuple(v - lo if j == dim else v for j, v in enumerate(i))), out)
            mask = _cmp("ge", d, lo) if k > 0 else None
            if value is None:  # the last piece: everything from its start on
                value = masked(piece, mask) if mask is not None else piece
                continue
            below = _cmp("lt", d, lo + n)
            value = Op("where", out, (below, masked(piece, _and(mask, below)), value))
        return value
    return Loops(ctx.out_size, out, ctx.device, fn)


@register(aten.constant_pad_nd.default)
def _constant_pad_nd(ctx, x, pad, value=0):
    loops = as_loops(x)
    rank = len(loops.size)
    if len(pad) % 2 or len(pad) // 2 > rank or not all(isinstance(p, int) for p in pad):
        raise Unsupported("constant_pad_nd: symbolic or malformed pad")
    left, right = [0] * rank, [0] * rank
    for k in range(len(pad) // 2):  # pad lists (left, right) pairs from the last dim back
        left[rank - 1 - k], right[rank - 1 - k] = pad[2 * k], pad[2 * k + 1]
    out = ctx.out_dtype
    fill = const(value, out)

    def fn(i):
        src = tuple(v - lo for v, lo in zip(i, left))
        mask = None  # inside x along every padded dim (a negative pad only crops)
        for d in range(rank):
            if left[d] > 0:
                mask = _and(mask, _cmp("ge", i[d], left[d]))
            if right[d] > 0:
                mask = _and(mask, _cmp("lt", src[d], loops.size[d]))
        v = cast(loops(src), out)
        return v if mask is None else Op("where", out, (mask, masked(v, mask), fill))
    return Loops(ctx.out_size, out, ctx.device, fn)


def _overwrite(ctx, base, mask: Op, value_at):
    """``where(mask, value_at(i), base[i])``: ``base`` with the places ``mask`` selects
    replaced; ``value_at`` is only read where ``mask`` holds."""
    base_loops, out = as_loops(base), ctx.out_dtype

    def fn(i):
        inside = mask(i)
        return Op("where", out, (inside, masked(cast(value_at(i), out), inside), cast(base_loops(i), out)))
    return Loops(ctx.out_size, out, ctx.device, fn)


def _write_slice_in_place(ctx, src: Loops, position) -> Stored | None:
    """``base`` with a slice of it overwritten by ``src``, as a kernel over ``src``'s elements
    writing into ``base``'s own storage, where the write may go in place (``core.reinplace``:
    ``cache[:, 3] = v`` on a buffer, which the program writes back anyway); None otherwise
    (the caller makes the one pass over ``base``).  ``position(i)``: the element of ``base``
    that ``src[i]`` replaces.  The store's offset is an ``index`` value, which makes it an
    indexed store (``Store.indexed``): a kernel of its own that leaves every other element."""
    if ctx.in_place_refusal() is not None or not ctx.indexed_stores(None, ctx.out_dtype):
        return None
    if ctx.builder.reads_storage(src, ctx.builder.value_of(ctx.node.args[0])):
        return None  # src is read from the storage written: the one pass over base
    target, _ = ctx.indexed_write_target()
    xs = tuple(xvar(k) for k in range(len(src.size)))
    at = position(xs)
    offset = sympy.expand(sum((e * st for e, st, n in zip(at, target.stride, target.size) if n != 1),
                              sympy.Integer(0)))
    ctx.indexed_job(src.size, Store(target.name, index_value(offset), cast(src(xs), target.dtype)))
    return Stored(target)


@register(aten.slice_scatter.default)
def _slice_scatter(ctx, base, src, dim=0, start=None, end=None, step=1):
    """``base`` with ``base[..., start:end:step, ...] = src``: one pass over ``base``'s
    shape, ``src`` read where the index falls in the slice (the slice's backward
    scatters a gradient into zeros: a fill and a copy become one kernel)."""
    src_loops = as_loops(src)
    rank = len(ctx.out_size)
    if rank == 0 or not isinstance(step, int) or step < 1:
        raise Unsupported("slice_scatter of a 0-d tensor or with a non-constant step")
    dim %= rank
    n, length = ctx.out_size[dim], src_loops.size[dim]
    start = 0 if start is None else start
    if not isinstance(start, int):
        raise Unsupported("slice_scatter with a symbolic start")
    if start < 0:
        if not n.is_Integer:
            raise Unsupported("slice_scatter: negative start on a symbolic dim")
        start = max(int(n) + start, 0)
    if length == 0:
        return as_loops(base)
    in_place = _write_slice_in_place(ctx, src_loops, lambda i: tuple(
        start + step * v if k == dim else v for k, v in enumerate(i)))
    if in_place is not None:
        return in_place

    def mask(i):
        d = i[dim]
        inside = _and(_cmp("ge", d, start) if start else None, _cmp("lt", d, start + step * length))
        if step > 1:
            inside = _and(inside, _cmp("eq", ModularIndexing(d - start, 1, step), 0))
        return inside

    def value_at(i):
        at = FloorDiv(i[dim] - start, step) if step > 1 else i[dim] - start
        return src_loops(tuple(at if k == dim else v for k, v in enumerate(i)))
    return _overwrite(ctx, base, mask, value_at)


@register(aten.select_scatter.default)
def _select_scatter(ctx, base, src, dim, index):
    """``base`` with ``base.select(dim, index) = src``, in one pass over ``base``."""
    src_loops = as_loops(src)
    rank = len(ctx.out_size)
    if rank == 0 or not isinstance(index, int):
        raise Unsupported("select_scatter of a 0-d tensor or at a symbolic index")
    dim %= rank
    if index < 0:
        if not ctx.out_size[dim].is_Integer:
            raise Unsupported("select_scatter: negative index on a symbolic dim")
        index += int(ctx.out_size[dim])
    in_place = _write_slice_in_place(ctx, src_loops, lambda i: tuple(i[:dim]) + (sympy.Integer(index),) + tuple(i[dim:]))
    if in_place is not None:
        return in_place
    return _overwrite(ctx, base, lambda i: _cmp("eq", i[dim], index),
                      lambda i: src_loops(tuple(i[:dim]) + tuple(i[dim + 1:])))


def _scatter_one_hot(ctx, base, dim, index, value):
    """``base.scatter(dim, index, value)`` where ``index`` holds one position per row
    along ``dim`` and covers ``base`` in every other dim (a one-hot: cross-entropy's
    gradient): ``where(i[dim] == index[..., 0, ...], value, base[i])``.  The rule of
    ``aten.scatter.value`` (``indexed_writes``) uses it where the write cannot go in place."""
    rank = len(ctx.out_size)
    idx_loops = _index_tensor(index)
    if rank == 0 or len(idx_loops.size) != rank or not isinstance(value, (bool, int, float)):
        raise Unsupported("scatter other than a one-hot of a constant value")
    dim %= rank
    if idx_loops.size[dim] != 1 or any(idx_loops.size[k] != ctx.out_size[k] for k in range(rank) if k != dim):
        raise Unsupported("scatter with an index that is not one position per row")
    idx = _checked(ctx, index, ctx.out_size[dim], dim, negative_ok=False)
    fill = const(value, ctx.out_dtype)

    def mask(i):
        at = tuple(sympy.Integer(0) if k == dim else v for k, v in enumerate(i))
        return Op("eq", torch.bool, (index_value(i[dim]), cast(idx(at), I64)))
    return _overwrite(ctx, base, mask, lambda i: fill)


# -- indirect: gather, embedding, index, index_select --------------------------------

def read(buf, index) -> Op:
    """A load of ``buf`` at ``index``: per dim a sympy expression or an int64 ``Op``.

    Sympy parts stay one index expression; ``Op`` parts make the load indirect::

        read(w, (Op(v), x1))  ->  load(w, index(x1) + v * index(64))   # w: (V, 64)
    """
    direct = sympy.Integer(0)
    terms = []
    for e, s, n in zip(index, buf.stride, buf.size):
        e = _position(e)
        if n == 1:
            continue  # index 0 (a checked indirect index is 0 there too)
        if isinstance(e, Op):
            terms.append(e if s == 1 else Op("mul", I64, (e, index_value(s))))
        else:
            direct = direct + e * s
    direct = sympy.expand(direct)
    if not terms:
        return Op.load(buf.name, direct, buf.dtype)
    offset = terms[0] if direct == 0 else Op("add", I64, (index_value(direct), terms[0]))
    for t in terms[1:]:
        offset = Op("add", I64, (offset, t))
    return Op.load(buf.name, offset, buf.dtype)


# Stand-ins for data-dependent positions while a lazy value is evaluated (see read_lazy).
_PLACEHOLDERS = tuple(sympy.Symbol(f"fxindirect{k}", integer=True, nonnegative=True) for k in range(8))


class _NotAffine(Exception):
    """A placeholder appears other than as ``base + c * placeholder`` in an index."""


def read_lazy(x: Loops, at) -> Op | None:
    """A lazy value ``x`` at ``at`` (per dim a sympy expression or an int64 ``Op``),
    without storing ``x`` first: the log-probabilities of a cross-entropy read at the
    targets, ``x - amax - log(sum)``, are computed for the one element per row that is
    read instead of stored for every element and read back.

    ``x`` is evaluated with a placeholder symbol at each data-dependent position; every
    index expression of the result must then be affine in the placeholders
    (``6*x0 + 1000*p``), and becomes an int64 ``Op`` with the data-dependent values in
    their place: its loads become indirect loads.  None when an index is not affine in
    them (a placeholder under ``//`` or ``%``: a reshape that splits that dimension):
    the caller stores ``x`` and reads it with ``read``.
    """
    values: dict = {}
    index = []
    at = tuple(map(_position, at))
    # a placeholder of an enclosing read_lazy may be in ``at`` already (a gather of a lazy
    # value, read lazily itself by an index op): this one's placeholders must be others
    taken = set().union(*(sympy.sympify(e).free_symbols for e in at if not isinstance(e, Op)))
    placeholders = [p for p in _PLACEHOLDERS if p not in taken]
    for e in at:
        if isinstance(e, Op):
            if len(values) == len(placeholders):
                return None
            symbol = placeholders[len(values)]
            values[symbol] = e
            index.append(symbol)
        else:
            index.append(e)
    value = x(tuple(index))
    if not values:
        return value

    def load(node: Op) -> Op:
        expr = load_index(node)
        if type(expr) is Op or not (expr.free_symbols & values.keys()):
            return node
        return Op.load(load_buffer(node), _affine_value(expr, values), node.dtype, load_mask(node))

    def index_node(node: Op) -> Op:
        if not (node.arg.free_symbols & values.keys()):
            return node
        return cast(_affine_value(node.arg, values), node.dtype)

    try:
        return rewrite(value, {OpCode.LOAD: load, OpCode.INDEX: index_node})
    except _NotAffine:
        return None


def _affine_value(expr, values: dict) -> Op:
    """``expr`` (affine in the placeholders of ``values``) as an int64 ``Op``."""
    base = sympy.Integer(0)
    terms = []
    for term in sympy.Add.make_args(sympy.expand(expr)):
        coeff, dependent = term.as_independent(*values, as_Add=False)
        if dependent == 1:
            base = base + term
        elif dependent in values and not (coeff.free_symbols & values.keys()):
            v = values[dependent]
            terms.append(v if coeff == 1 else Op("mul", I64, (v, index_value(coeff))))
        else:
            raise _NotAffine(str(term))
    offset = None if base == 0 else index_value(base)
    for t in terms:
        offset = t if offset is None else Op("add", I64, (offset, t))
    return offset


def _source(ctx, x, dim: int, direct: bool = False):
    """``(size of dim, reader)`` of an indexed operand: ``reader(at)`` is its value at
    ``at``, computed from a lazy ``x`` where ``read_lazy`` can (every lazy ``x`` when
    ``direct``: the positions are expressions, ``_proven``), else read from ``x``
    stored (``ctx.stored``)."""
    if isinstance(x, Loops) and direct:
        return x.size[dim], lambda at: x(tuple(_position(e) for e in at))
    if isinstance(x, Loops):
        probe = tuple(Op.const(0, I64) if k == dim else xvar(k) for k in range(len(x.size)))
        if read_lazy(x, probe) is not None:
            def reader(at):
                value = read_lazy(x, at)
                if value is None:  # affine at the probe, so at every index
                    raise AssertionError(f"{ctx.node.target}: lazy operand not affine at {at}")
                return value
            return x.size[dim], reader
    src = ctx.stored(x).buffer
    return src.size[dim], lambda at: read(src, at)


def _index_tensor(value) -> Loops:
    loops = as_loops(value)
    if loops.dtype not in _INDEX_DTYPES:
        raise Unsupported(f"index of dtype {loops.dtype}")
    return loops


# probe positions an index tensor is evaluated at to read its values as an expression
_PROBES = tuple(sympy.Symbol(f"fxprobe{k}", integer=True, nonnegative=True) for k in range(8))
_INTEGER_OPS = {OpCode.ADD: lambda a, b: a + b, OpCode.SUB: lambda a, b: a - b, OpCode.MUL: lambda a, b: a * b}


def _expression(value: Op, ranges) -> sympy.Expr | None:
    """An integer value computed from its index alone (``arange``, ``+``, ``*``, ``fmod`` /
    ``remainder`` / ``//`` by a positive divisor of a non-negative value) as a sympy
    expression: ``fmod(index(x0) + 2, 8)`` -> ``ModularIndexing(x0 + 2, 1, 8)``; None for
    anything else (a load: data-dependent)."""
    code = value.op
    if code == OpCode.INDEX:
        return value.arg
    if code == OpCode.CONST:
        return sympy.Integer(value.arg) if isinstance(value.arg, int) and not isinstance(value.arg, bool) else None
    if value.dtype not in _INDEX_DTYPES:
        return None
    if code == OpCode.CAST:
        source = value.src[0]
        return _expression(source, ranges) if source.dtype in _INDEX_DTYPES else None
    parts = [_expression(s, ranges) for s in value.src]
    if any(p is None for p in parts):
        return None
    if code in _INTEGER_OPS:
        return _INTEGER_OPS[code](*parts)
    if code in (OpCode.FMOD, OpCode.MOD, OpCode.FLOORDIV):
        a, n = parts
        if not (n.is_positive or n.is_Symbol and n.is_positive) or not index_nonnegative(a, ranges):
            return None
        return FloorDiv(a, n) if code == OpCode.FLOORDIV else ModularIndexing(a, 1, n)
    return None


def _proven(index, size) -> Loops | None:
    """The index values as ``index`` ops of expressions over the position, where every one
    is provably in ``[0, size)`` (a roll's ``(arange + k) % n``, an ``arange``): no check is
    needed, and the read is a plain strided one.  None otherwise."""
    values = as_loops(index)
    if len(values.size) > len(_PROBES):
        return None
    probes = _PROBES[:len(values.size)]
    ranges = dict(zip(probes, values.size))
    expr = _expression(values(probes), ranges)
    if expr is None or not index_in_range(expr, size, ranges):
        return None
    return Loops(values.size, I64, values.device,
                 lambda i: Op.index(expr.xreplace(dict(zip(probes, i)))))


def _position(e):
    """A position along a dim: an ``index`` op (a proven index, ``_proven``) as its
    expression, so the read through it is direct."""
    return e.arg if isinstance(e, Op) and e.op == OpCode.INDEX else e


def _checked(ctx, index, size, dim: int, negative_ok: bool) -> Loops:
    """The index values, checked to index a dim of ``size`` (``[-size, size)`` when
    ``negative_ok``) before any read through them.

    On a target that checks indices inside its kernels (``capabilities().index_checks
    == "in_kernel"``: Triton's ``tl.device_assert``, as Inductor and eager's own CUDA
    index kernels do) each value goes through ``index_check`` where it is used, and the
    index may stay lazy; lanes past the end load 0, so the size must be positive.
    Elsewhere the index tensor is put in memory and a ``check_index_bounds`` extern
    runs before the kernel: on a CPU it raises ``IndexError``, on an accelerator it
    asserts on the device without reading back (five small ATen calls).  Neither where
    the values are provably in ``[0, size)`` (``_proven``): those are ``index`` ops."""
    proven = _proven(index, size)
    if proven is not None:
        return proven
    constant = ctx.constant_value(index)
    if constant is not None and _constant_in_range(constant, size, negative_ok):
        return as_loops(index)  # a program constant's values, checked once, now
    if ctx.capabilities.index_checks == "in_kernel" and sympy.sympify(size).is_positive:
        values = as_loops(index)
        low = index_value(-sympy.sympify(size)) if negative_ok else Op.const(0, I64)

        def checked(i):
            return Op("index_check", I64, (cast(values(i), I64), low, index_value(size)))
        return Loops(values.size, I64, ctx.device, checked)
    buf = ctx.stored(index).buffer
    ctx.emit(Comment(f"{ctx.node.name}: every index of {buf.name} in range for dim {dim}"))
    ctx.emit(CallExtern(check_index_bounds, (buf, size, dim, negative_ok), (), None))
    return as_loops(Stored(buf))


def _constant_in_range(values: torch.Tensor, size, negative_ok: bool) -> bool:
    """Whether every value of a program constant indexes a dim of ``size`` (a number; a
    symbolic size is known only at run time).  Out of range, the run-time check stays and
    raises on every call, as eager does."""
    size = sympy.sympify(size)
    if not size.is_Integer or values.is_floating_point() or values.device.type == "meta":
        return False
    if values.numel() == 0:
        return True
    low = -int(size) if negative_ok else 0
    with unset_fake_temporarily():  # lowering runs under the graph's fake mode; the constant is real
        lo, hi = (int(v) for v in torch.aminmax(values.detach().cpu()))
    return low <= lo and hi < int(size)


def _is_proven(idx: Loops) -> bool:
    """Whether ``_checked`` gave expressions (``_proven``) rather than values."""
    probe = idx(_PROBES[:len(idx.size)])
    return isinstance(probe, Op) and probe.op == OpCode.INDEX


def _wrap(v: Op, n) -> Op:
    """A possibly negative index ``v`` into ``[0, n)``: ``where(v < 0, v + n, v)``."""
    neg = Op("lt", torch.bool, (v, Op.const(0, I64)))
    return Op("where", I64, (neg, Op("add", I64, (v, index_value(n))), v))


def _rank(x) -> int:
    rank = len(as_loops(x).size)
    if rank == 0:
        raise Unsupported("indexing a 0-d tensor")
    return rank


@register(aten.gather.default)
def _gather(ctx, x, dim, index, *, sparse_grad=False):
    rank = _rank(x)
    _index_tensor(index)
    if len(as_loops(index).size) != rank:
        raise Unsupported("gather with an index of another rank")
    dim %= rank
    idx = _checked(ctx, index, as_loops(x).size[dim], dim, negative_ok=False)
    size, reader = _source(ctx, x, dim, direct=_is_proven(idx))
    out = ctx.out_dtype

    def fn(i):
        at = tuple(cast(idx(i), I64) if k == dim else v for k, v in enumerate(i))
        return cast(reader(at), out)
    return Loops(ctx.out_size, out, ctx.device, fn)


@register(aten.embedding.default)
def _embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if len(as_loops(weight).size) != 2:
        raise Unsupported("embedding weight of rank != 2")
    _index_tensor(indices)
    w = ctx.stored(weight).buffer
    idx = _checked(ctx, indices, w.size[0], 0, negative_ok=False)
    nidx, out = len(idx.size), ctx.out_dtype
    return Loops(ctx.out_size, out, ctx.device,
                 lambda i: cast(read(w, (cast(idx(i[:nidx]), I64), i[nidx])), out))


@register(aten.index_select.default)
def _index_select(ctx, x, dim, index):
    rank = _rank(x)
    if len(_index_tensor(index).size) > 1:
        raise Unsupported("index_select with a multi-dimensional index")
    dim %= rank
    idx = _checked(ctx, index, as_loops(x).size[dim], dim, negative_ok=False)
    size, reader = _source(ctx, x, dim, direct=_is_proven(idx))
    out = ctx.out_dtype

    def fn(i):
        v = cast(idx((i[dim],) if idx.size else ()), I64)
        return cast(reader(tuple(v if k == dim else e for k, e in enumerate(i))), out)
    return Loops(ctx.out_size, out, ctx.device, fn)


@register(aten.index.Tensor)
def _index(ctx, x, indices):
    """``x[idx]``, ``x[:, idx]``: one integer index tensor, after ``None``s only."""
    rank = _rank(x)
    given = [k for k, t in enumerate(indices) if t is not None]
    if len(given) != 1 or given[0] != len(indices) - 1 or len(indices) > rank:
        raise Unsupported("index with other than one trailing index tensor")
    dim = given[0]
    _index_tensor(indices[dim])
    idx = _checked(ctx, indices[dim], as_loops(x).size[dim], dim, negative_ok=True)
    proven = _is_proven(idx)
    size, reader = _source(ctx, x, dim, direct=proven)
    nidx, out = len(idx.size), ctx.out_dtype

    def fn(i):
        v = cast(idx(tuple(i[dim:dim + nidx])), I64)
        v = v if proven else _wrap(v, size)  # a proven index is in [0, size) already
        at = tuple(i[:dim]) + (v,) + tuple(i[dim + nidx:])
        return cast(reader(at), out)
    return Loops(ctx.out_size, out, ctx.device, fn)


# -- input mutation -----------------------------------------------------------------

@register(aten.copy_.default)
def _copy_(ctx, dst, src, non_blocking=False):
    """``copy_(arg0, y)``: a kernel storing ``y`` (cast, broadcast) into ``arg0``."""
    if not isinstance(dst, Stored):
        raise Unsupported("copy_ into a value that is not in memory")
    buf = dst.buffer
    if isinstance(src, Stored) and src.buffer == buf:
        return dst  # a buffer copied into itself (a user kernel wrote an input in place): nothing to do
    if any(s == 0 and n != 1 for n, s in zip(buf.size, buf.stride)):
        raise Unsupported("copy_ into an expanded (overlapping) tensor")
    loops = broadcast(as_loops(src), buf.size)
    ctx.write_barrier()
    # the line ends the fusion group: no kernel that reads buf's old values stores into it
    ctx.emit(Comment(f"{ctx.node.name}: {ctx.node.target} writes {buf.name} in place"))
    out = buf.dtype
    ctx.store_into(buf, Loops(buf.size, out, ctx.device, lambda i: cast(loops(i), out)))
    return dst
