"""A planted bad lowering, on every target: ``aten.log1p`` computes ``log(-exp(x))``,
NaN for every input (what ``options={"check_nan": True}`` must catch and name)."""
import torch
from fxwrap import hookimpl

aten = torch.ops.aten


def broken_log1p(ctx, x):
    return ctx.pointwise("log", ctx.pointwise("neg", ctx.pointwise("exp", x)))


@hookimpl
def fxwrap_lowerings(registry, target):
    registry.register(aten.log1p.default, broken_log1p)
