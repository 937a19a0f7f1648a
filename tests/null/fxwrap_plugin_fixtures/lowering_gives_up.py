"""An ``aten.sin`` rule for target ``cpu`` that realizes its operand (a kernel, a buffer,
an environment entry in the builder) and then gives up: the node must become an extern
call over the builder's state from before the rule."""
import torch
from fxwrap import hookimpl
from fxwrap.core.lowering import Unsupported

aten = torch.ops.aten
attempts = []


def realize_then_give_up(ctx, x):
    attempts.append(ctx.stored(x).buffer.name)
    raise Unsupported("gives up after realizing its operand")


@hookimpl
def fxwrap_lowerings(registry, target):
    if target.name == "cpu":
        registry.register(aten.sin.default, realize_then_give_up, target="cpu")
