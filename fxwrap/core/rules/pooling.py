"""Pooling rules: the gradient of 2-D max pooling.

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

import torch

from fxwrap.core.ir import Op
from fxwrap.core.lowering import Loops, Unsupported, as_loops, cast, const, index_value, masked, register
from fxwrap.core.rules.indexing import read

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
