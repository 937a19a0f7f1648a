"""A plugin whose target, ``planted``, has one bug for each kind of conformance check,
for ``test_kit_reports_failures.py`` to show that the kit catches each one.

``planted`` is the C++ target (same device, emitter and wrapper as ``cpu``), plus:

* ``aten.sin`` lowered to ``cos``: wrong numbers (``test_op[sin[...]]`` fails);
* ``aten.maximum`` of two bools computed as their logical and: wrong numbers for bool
  only (``test_op[maximum_any[bool]]`` fails, ``test_op[maximum_any[float32]]`` passes);
* ``aten.relu`` as ``x > 0 ? x : 0`` and a float ``aten.maximum`` as ``a > b ? a : b`` (what
  C's comparisons, or ``fmax``, give): right on finite inputs, wrong on NaN
  (``test_op[relu[float32]]`` passes, ``test_op[relu_special[float32]]`` fails);
* ``aten.exp`` left to an ATen extern call (its rule gives up): right numbers, but not
  in a kernel (``test_op[exp[...]]`` fails its "ran in a kernel" check);
* a wrapper pass that drops the first ``Free`` line of a program: a storage is never
  freed (``test_memory_plan`` fails);
* a wrapper pass that numbers every program it sees in a comment: two lowerings of one
  function print differently (``test_deterministic`` fails).
"""
import itertools

import torch

import fxwrap
from fxwrap.core.lowering import Unsupported, const
from fxwrap.core.passes import LinesPass
from fxwrap.ir.loops import Op
from fxwrap.ir.lines import Comment, Free

aten = torch.ops.aten
NAME = "planted"


def sin_as_cos(ctx, x):
    return ctx.pointwise("cos", x)


def _greater_or(a, b):
    """``a > b ? a : b``: NaN compares false, so a NaN ``a`` gives ``b`` (eager gives NaN)."""
    return Op("where", a.dtype, (Op("gt", torch.bool, (a, b)), a, b))


def bool_maximum_as_and(ctx, a, b):
    if ctx.out_dtype == torch.bool:
        return ctx.pointwise("logical_and", a, b, compute=torch.bool)  # the bug: max(True, False) is True
    return ctx.map(_greater_or, a, b, compute=ctx.out_dtype)  # the bug: maximum(NaN, 1) is 1


def relu_as_select(ctx, x):
    return ctx.map(lambda v: _greater_or(v, const(0, v.dtype)), x)  # the bug: relu(NaN) is 0


def exp_gives_up(ctx, x):
    raise Unsupported("planted: exp stays an ATen extern")


def drop_first_free(lines):
    frees = [i for i, line in enumerate(lines) if isinstance(line, Free)]
    return [line for i, line in enumerate(lines) if not frees or i != frees[0]]


_programs_seen = itertools.count()


def number_the_program(lines):
    return [Comment(f"program number {next(_programs_seen)}"), *lines]


@fxwrap.hookimpl
def fxwrap_targets():
    return [fxwrap.Target(NAME, "cpu", fxwrap.CpuDevice(), fxwrap.CppEmitter, fxwrap.DirectCallWrapper,
                          priority=-100)]


@fxwrap.hookimpl
def fxwrap_lowerings(registry, target):
    if target.name == NAME:
        registry.register(aten.sin, sin_as_cos, target=NAME)
        registry.register(aten.exp, exp_gives_up, target=NAME)
        registry.register(aten.maximum, bool_maximum_as_and, target=NAME)
        registry.register(aten.relu, relu_as_select, target=NAME)


@fxwrap.hookimpl
def fxwrap_pipeline(pipeline, target):
    if target.name == NAME:
        pipeline.wrapper.append(LinesPass.of(drop_first_free))
        pipeline.wrapper.append(LinesPass.of(number_the_program))
