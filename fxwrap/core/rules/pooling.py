"""Pooling rules: 2-D max pooling and its gradient.

``max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)`` is, per
output ``(n, c, oh, ow)``, a scan of the window's ``kernel[0] * kernel[1]`` positions
(unrolled; positions outside the input are masked off), with ATen's rule: a value
replaces the maximum when it is greater or NaN, and the index starts at the window's
first position inside the input.  Values and indices are one select chain on the
comparisons where one kernel stores both; values alone are the ``maximum`` (NaN-propagating:
the same rule) of the window's values.

``max_pool2d_with_indices_backward(grad, x, kernel, stride, padding, dilation, ceil_mode,
indices)`` is, for every input element ``(n, c, h, w)``, the sum of ``grad`` over the
output windows that contain it and chose it (``indices`` holds each window's choice as
``h * W + w``).  ATen's CUDA kernel scatters with atomic adds (slow in bf16, order not
fixed); here each input element *gathers* from the few windows that can contain it.
Along height (width alike) those are the outputs ``oh`` with::

    start = max(0, (h + pad - kernel) // stride + 1)     end = min(OH - 1, (h + pad) // stride)

at most ``ceil(kernel / stride)`` of them.  For ``kernel = stride = 2`` the value at
``(x0, x1, x2, x3)`` is::

    oh = max(0, (x2 + 2) // 2 - 1),  ow = max(0, (x3 + 2) // 2 - 1)
    ok = oh <= min(OH - 1, x2 // 2)  and  ow <= min(OW - 1, x3 // 2)
    where(ok and load(indices, [x0, x1, oh, ow], ok) == W*x2 + x3,
          load(grad, [x0, x1, oh, ow], ok), 0)

summed in float32 over the candidate windows.  Loads are masked by ``ok``, so a
candidate past the output is never read.  The result is stored by a kernel of its own
(``ctx.realized``) rather than inlined into its consumers.  Dilated pooling stays an
ATen extern.
"""
from __future__ import annotations

import operator

import sympy
import torch

from fxwrap.ir.loops import Op
from fxwrap.core.lowering import Loops, Unsupported, as_loops, cast, const, index_value, masked, register
from fxwrap.core.rules.indexing import _cmp, read
from fxwrap.ir.symbolic import to_expr

aten = torch.ops.aten
I64 = torch.int64


def _pair(values, default=None) -> tuple[int, int]:
    values = list(values) if values else list(default or ())
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or not all(isinstance(v, int) for v in values):
        raise Unsupported(f"pooling parameters {values!r}")
    return values[0], values[1]


def _i64(value) -> Op:
    return value if isinstance(value, Op) else index_value(value)


def _op(name: str, a, b) -> Op:
    return Op(name, I64, (_i64(a), _i64(b)))


def _windows(position, pad: int, kernel: int, stride: int, out_size):
    """``(first, last)``: the first output window that can contain input ``position``
    and the last one that does (as int64 values); see the module docstring."""
    ahead = -(-kernel // stride)  # keeps the floor division's operand non-negative
    first = _op("sub", _op("floordiv", position + (pad - kernel + stride + ahead * stride), stride), ahead)
    first = _op("maximum", first, 0)
    last = _op("minimum", _op("floordiv", position + pad, stride), out_size - 1)
    return first, last, ahead


@register(aten.max_pool2d_with_indices.default)
def _max_pool2d(ctx, x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    loops = as_loops(x)
    if len(loops.size) != 4 or _pair(dilation, (1,)) != (1, 1) or not loops.dtype.is_floating_point:
        raise Unsupported("max pooling other than 4-D, floating and undilated")
    kernel = _pair(kernel_size)
    strides = _pair(stride, kernel)
    pads = _pair(padding, (0,))
    height, width = loops.size[2], loops.size[3]
    dtype = loops.dtype
    compute = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    size = tuple(to_expr(n) for n in ctx.val[0].shape)

    # window offsets that can fall outside the input (pads, ceil_mode): only those are masked
    outside = [[_may_leave(d, pads[a], strides[a], size[2 + a], loops.size[2 + a]) for d in range(kernel[a])]
               for a in range(2)]

    def window(i):
        """The window of output ``i``: its positions as ``(value, inside or None, flat index)``,
        in scan order, and the index of its first position inside the input."""
        n, c, oh, ow = i
        top, left = oh * strides[0] - pads[0], ow * strides[1] - pads[1]
        first = index_value(top * width + left) if not (pads[0] or pads[1]) else \
            _op("add", _op("mul", _op("maximum", top, 0), width), _op("maximum", left, 0))
        positions = []
        for dh in range(kernel[0]):
            for dw in range(kernel[1]):
                h, w = top + dh, left + dw
                checks = ([_cmp("ge", h, 0), _cmp("lt", h, height)] if outside[0][dh] else []) + \
                         ([_cmp("ge", w, 0), _cmp("lt", w, width)] if outside[1][dw] else [])
                inside = None
                for check in checks:
                    inside = check if inside is None else Op("logical_and", torch.bool, (inside, check))
                value = loops((n, c, h, w))
                value = cast(value if inside is None else masked(value, inside), compute)
                positions.append((value, inside, index_value(h * width + w)))
        return positions, first

    def maximum(i):
        # ATen's "greater or NaN replaces" is ``maximum`` (NaN-propagating) of the window's
        # values: one op a position, with no select on a comparison (g++ 12 vectorizes no
        # loop whose select chain follows an inlined relu: "control flow in loop")
        best = const(float("-inf"), compute)
        for value, inside, _ in window(i)[0]:
            larger = Op("maximum", compute, (best, value))
            best = larger if inside is None else Op("where", compute, (inside, larger, best))
        return best

    def scan(i):
        """The window's maximum and its index, as one select chain on the comparisons."""
        positions, where_ = window(i)
        best = const(float("-inf"), compute)
        for value, inside, flat in positions:
            wins = Op("logical_or", torch.bool, (Op("gt", torch.bool, (value, best)),
                                                  Op("isnan", torch.bool, (value,))))
            if inside is not None:
                wins = Op("logical_and", torch.bool, (inside, wins))
            best = Op("where", compute, (wins, value, best))
            where_ = Op("where", I64, (wins, flat, where_))
        return best, where_

    used = {user.args[1] for user in ctx.node.users if user.target is operator.getitem}
    indices = Loops(size, I64, ctx.device, lambda i: scan(i)[1])
    if used == {0, 1}:  # both stored by one kernel: one chain computes both (the maximum
        # beside the chain would be a second computation, and g++ vectorizes neither then)
        values = Loops(size, dtype, ctx.device, lambda i: cast(scan(i)[0], dtype))
        return ctx.realized_output(values, 0), ctx.realized_output(indices, 1)
    return Loops(size, dtype, ctx.device, lambda i: cast(maximum(i), dtype)), indices


def _may_leave(offset: int, pad: int, stride: int, out_size, in_size) -> bool:
    """Whether window offset ``offset`` can fall outside the input, for some output
    position: before it (``offset < pad``) or past it (the last window's
    ``(out_size - 1) * stride - pad + offset >= in_size``); True unless the sizes say no."""
    if offset < pad:
        return True
    past = sympy.sympify((out_size - 1) * stride - pad + offset - in_size)
    return not (past.is_number and past < 0)


@register(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(ctx, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    if len(as_loops(x).size) != 4 or _pair(dilation, (1,)) != (1, 1):
        raise Unsupported("max pool gradient other than 4-D and undilated")
    kernel = _pair(kernel_size)
    strides = _pair(stride, kernel)
    pads = _pair(padding, (0,))
    g = ctx.stored(grad).buffer
    idx = ctx.stored(indices).buffer
    width = ctx.out_size[3]
    out_h, out_w = g.size[2], g.size[3]
    out = ctx.out_dtype
    acc = torch.float32 if out in (torch.bfloat16, torch.float16) else out

    def fn(i):
        n, c, h, w = i
        fh, lh, mh = _windows(h, pads[0], kernel[0], strides[0], out_h)
        fw, lw, mw = _windows(w, pads[1], kernel[1], strides[1], out_w)
        here = index_value(h * width + w)
        total = const(0, acc)
        for dh in range(mh):
            oh = _op("add", fh, dh) if dh else fh
            for dw in range(mw):
                ow = _op("add", fw, dw) if dw else fw
                ok = Op("logical_and", torch.bool, (Op("le", torch.bool, (oh, lh)), Op("le", torch.bool, (ow, lw))))
                at = (n, c, oh, ow)
                chosen = Op("eq", torch.bool, (cast(masked(read(idx, at), ok), I64), here))
                take = Op("logical_and", torch.bool, (ok, chosen))
                value = cast(masked(read(g, at), ok), acc)
                total = Op("add", acc, (total, Op("where", acc, (take, value, const(0, acc)))))
        return cast(total, out)
    # stored once: inlined, every consumer (a ReLU gradient, then a batch norm gradient's
    # column reductions) would repeat the gathers in its own, less friendly, loop order
    return ctx.realized(Loops(ctx.out_size, out, ctx.device, fn))
