"""A plugin with a planted bug, for docs/debugging.md.  fxwrap decomposes GELU into
``x * 0.5 * (1 + erf(x / sqrt(2)))``; this plugin lowers ``aten.erf`` with a tanh
approximation, ``tanh(1.1284 v + 0.1009 v^3)``, that takes ``sqrt(v) * v`` where ``v * v``
was meant: NaN for every negative input."""
import torch

from fxwrap import hookimpl
from fxwrap.ir.loops import Op
from fxwrap.core.lowering import const

aten = torch.ops.aten


def buggy_erf(ctx, x):
    def erf(v):
        t = v.dtype
        square = Op("mul", t, (Op("sqrt", t, (v,)), v))  # the bug: meant Op("mul", t, (v, v))
        cube = Op("mul", t, (square, v))
        inner = Op("add", t, (Op("mul", t, (v, const(1.1283791670955126, t))),
                              Op("mul", t, (cube, const(0.1009, t)))))
        return Op("tanh", t, (inner,))
    return ctx.map(erf, x)


@hookimpl
def fxwrap_lowerings(registry, target):
    registry.register(aten.erf.default, buggy_erf)
