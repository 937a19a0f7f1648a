"""A plugin with a planted bug, for docs/debugging.md: GELU's ``erf`` computed with a tanh
approximation, ``tanh(1.1284 v + 0.1009 v^3)``, that takes ``sqrt(v) * v`` where ``v * v``
was meant: NaN for every negative input.

GELU reaches the lowering as ``aten.gelu`` (torch 2.13 keeps it) or decomposed into
``x * 0.5 * (1 + erf(x / sqrt(2)))`` (torch 2.11's core-ATen decompositions): the plugin
lowers both, so the walk-through finds the same bug on either."""
import torch

from fxwrap import hookimpl
from fxwrap.core.lowering import Unsupported, const
from fxwrap.ir.loops import Op

aten = torch.ops.aten


def buggy_erf_of(v):
    t = v.dtype
    square = Op("mul", t, (Op("sqrt", t, (v,)), v))  # the bug: meant Op("mul", t, (v, v))
    cube = Op("mul", t, (square, v))
    inner = Op("add", t, (Op("mul", t, (v, const(1.1283791670955126, t))),
                          Op("mul", t, (cube, const(0.1009, t)))))
    return Op("tanh", t, (inner,))


def buggy_erf(ctx, x):
    return ctx.map(buggy_erf_of, x)


def buggy_gelu(ctx, x, *, approximate="none"):
    if approximate != "none":
        raise Unsupported("the planted bug is in the exact GELU's erf")

    def gelu(v):
        t = v.dtype
        erf = buggy_erf_of(Op("mul", t, (v, const(0.7071067811865476, t))))
        return Op("mul", t, (Op("mul", t, (v, const(0.5, t))), Op("add", t, (erf, const(1.0, t)))))
    return ctx.map(gelu, x)


@hookimpl
def fxwrap_lowerings(registry, target):
    registry.register(aten.erf.default, buggy_erf)
    registry.register(aten.gelu.default, buggy_gelu)
