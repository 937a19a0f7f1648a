"""Helpers for the C++ emitter tests: build ``ScheduledKernel``s by hand, run them.

Importable by name (``import emitter_helpers``) from the tests in this folder.
"""
from __future__ import annotations

import os
import sys

import sympy
import torch

from fxwrap.core.ir import Op, Reduction, ScheduledKernel, Store, rvar, xvar  # noqa: F401
from fxwrap.core.numerics import legalize
from fxwrap.core.symbolic import evaluate
from fxwrap.targets.cpu_cpp.emitter import CppEmitter

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:  # also when imported from a subprocess that only added this folder
    sys.path.append(_TESTS)
from shared_helpers import CPU, acc, buf, const, contiguous, kernel, ld, op  # noqa: F401

x0, x1, x2 = xvar(0), xvar(1), xvar(2)
r0, r1 = rvar(0), rvar(1)
s0 = sympy.Symbol("s0", integer=True, positive=True)
s1 = sympy.Symbol("s1", integer=True, positive=True)


def cast(x: Op, dtype) -> Op:
    return Op("cast", dtype, (x,))


_EMITTER: list[CppEmitter] = []


def emitter() -> CppEmitter:
    if not _EMITTER:
        _EMITTER.append(CppEmitter())
    return _EMITTER[0]


def build(k: ScheduledKernel):
    """Render and load ``k``; returns ``(launcher, source)``.  The launcher takes the kernel's
    inputs, outputs and sizes and allocates the workspaces the source declares
    (``source.workspaces``), as a program's ``Allocate`` lines would."""
    em = emitter()
    src = em.render(legalize(k))  # explicit compute dtypes and 16-bit rounding, as the kernel builder does
    launcher = em.load(src)
    if not src.workspaces:
        return launcher, src
    n = len(k.inputs) + len(k.outputs)

    def with_workspaces(*args):
        sizes = {s: int(v) for s, v in zip(k.size_symbols, args[n:])}
        ws = [torch.empty(evaluate(w.numel, sizes), dtype=w.dtype) for w in src.workspaces]
        return launcher(*args[:n], *ws, *args[n:])
    return with_workspaces, src


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
