"""A plugin rule for ``aten.sin`` on target ``cpu`` that handles float64 only and hands
every other case back (``fxwrap.DECLINE``) to the rule it overrides.

float64: ``sin(x) + 1`` (a rule no built-in has, so the numbers show it ran).  Any other
dtype: it first realizes its operand and emits a comment line (builder state that must be
undone), then declines;
loaded after ``sin_to_cos`` the case reaches that plugin's rule (``cos``), loaded alone
fxwrap's own ``sin`` rule."""
import torch

import fxwrap
from fxwrap import hookimpl
from fxwrap.ir.lines import Comment
from fxwrap.ir.loops import Op

aten = torch.ops.aten
declined = []


def _sin_plus_one(v):
    return Op("add", v.dtype, (Op("sin", v.dtype, (v,)), Op.const(1.0, v.dtype)))


def sin_plus_one_for_float64(ctx, x):
    if ctx.out_dtype != torch.float64:
        declined.append(ctx.stored(x).buffer.name)
        ctx.emit(Comment("the declining rule ran here"))
        return fxwrap.DECLINE
    return ctx.map(_sin_plus_one, x)


@hookimpl
def fxwrap_lowerings(registry, target):
    if target.name == "cpu":
        registry.register(aten.sin.default, sin_plus_one_for_float64, target="cpu")
