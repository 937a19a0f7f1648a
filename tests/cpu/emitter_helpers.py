"""Helpers for the C++ emitter tests: build ``ScheduledKernel``s by hand, run them.

Importable by name (``import emitter_helpers``) from the tests in this folder.
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.core.ir import Op, Reduction, ScheduledKernel, Store, rvar, xvar
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.wrapper_ir.lines import Buffer

CPU = torch.device("cpu")
x0, x1, x2 = xvar(0), xvar(1), xvar(2)
r0, r1 = rvar(0), rvar(1)
s0 = sympy.Symbol("s0", integer=True, positive=True)
s1 = sympy.Symbol("s1", integer=True, positive=True)


def contiguous(size):
    strides, run = [], sympy.Integer(1)
    for n in reversed(size):
        strides.append(run)
        run = run * sympy.sympify(n)
    return tuple(reversed(strides))


def buf(name, size, dtype=torch.float32, stride=None) -> Buffer:
    size = tuple(sympy.sympify(n) for n in size)
    stride = tuple(sympy.sympify(s) for s in stride) if stride is not None else contiguous(size)
    return Buffer(name, size, stride, dtype, CPU)


def ld(name, index, dtype=torch.float32, mask=None) -> Op:
    args = (name, sympy.sympify(index)) + ((mask,) if mask is not None else ())
    return Op("load", dtype, args)


def const(value, dtype=torch.float32) -> Op:
    return Op("const", dtype, (value,))


def op(name, dtype, *args) -> Op:
    return Op(name, dtype, tuple(args))


def cast(x: Op, dtype) -> Op:
    return Op("cast", dtype, (x,))


def acc(name, dtype, field=0) -> Op:
    return Op("acc", dtype, (name, field))


def kernel(name, inputs, outputs, stores, ranges=(), reduction_ranges=(), reductions=(),
           sizes=(), origins=("test: handmade",)) -> ScheduledKernel:
    return ScheduledKernel(name, tuple(inputs), tuple(outputs), tuple(sizes),
                           tuple(sympy.sympify(r) for r in ranges),
                           tuple(sympy.sympify(r) for r in reduction_ranges),
                           tuple(reductions), tuple(stores), tuple(origins))


_EMITTER: list[CppEmitter] = []


def emitter() -> CppEmitter:
    if not _EMITTER:
        _EMITTER.append(CppEmitter())
    return _EMITTER[0]


def build(k: ScheduledKernel):
    """Render and load ``k``; returns ``(launcher, source)``."""
    em = emitter()
    src = em.render(k)
    return em.load(src), src


def rand(shape, dtype=torch.float32, low=-3.0, high=3.0, gen=None) -> torch.Tensor:
    """Fresh random values (never zeros everywhere), in ``dtype``."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(int(low), info.min), min(int(high), info.max)
    return torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64).to(dtype)


__all__ = ["CPU", "x0", "x1", "x2", "r0", "r1", "s0", "s1", "buf", "ld", "const", "op", "cast",
           "acc", "kernel", "build", "emitter", "rand", "Store", "Reduction", "Op",
           "contiguous"]
