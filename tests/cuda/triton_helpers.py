"""Shared pieces of the Triton tests: the target and device under test, differential
checks against eager, and hand-built ``ScheduledKernel``s run through the emitter.

``TARGET``/``DEVICE`` are ``cuda``/``cuda`` on a GPU machine and
``triton-interpret``/``cpu`` elsewhere (``conftest.py`` sets ``TRITON_INTERPRET``).
"""
from __future__ import annotations

import os
import sys

import sympy
import torch

import fxwrap
from fxwrap.ir.loops import Op, Reduction, ScheduledKernel, Store, rvar, xvar  # noqa: F401
from fxwrap.targets.cuda_triton import plugin as triton_plugin
from fxwrap.ir.lines import Buffer

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:  # also when imported from a subprocess that only added this folder
    sys.path.append(_TESTS)
import shared_helpers
from shared_helpers import acc, build_with, const, contiguous, kernel, kernels, ld, op, random_input  # noqa: F401

GPU = torch.cuda.is_available()
TARGET_NAME = "cuda" if GPU else "triton-interpret"
# the Target object itself (works whether or not fxwrap's entry points are installed)
TARGET = next(t for t in triton_plugin.fxwrap_targets() if t.name == TARGET_NAME)
DEVICE = torch.device("cuda" if GPU else "cpu")
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-9, atol=1e-9),
       torch.bfloat16: dict(rtol=4e-2, atol=2e-2), torch.float16: dict(rtol=4e-3, atol=4e-3)}

x0, x1, x2 = xvar(0), xvar(1), xvar(2)
r0, r1 = rvar(0), rvar(1)
s0 = sympy.Symbol("s0", integer=True, positive=True)


def make(layout: str, dtype=torch.float32, shape=(37, 65), scale=1.0):
    """A fresh random input of ``shape`` on DEVICE, laid out as asked."""
    return random_input(layout, dtype, shape, scale, DEVICE)


def compiled(fn, dynamic=False, target=TARGET):
    programs = []
    f = torch.compile(fn, backend=fxwrap.Backend(target, {"on_program": programs.append}), dynamic=dynamic)
    return f, programs


def check(fn, args, dynamic=False, tol=None, min_kernels=1):
    """Compile ``fn`` for TARGET, compare every output with eager; returns the kernels."""
    torch._dynamo.reset()
    f, programs = compiled(fn, dynamic)
    got, want = f(*args), fn(*args)
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        t = tol or TOL.get(w.dtype, dict(rtol=0, atol=0))
        torch.testing.assert_close(g, w, equal_nan=True, msg=lambda m, i=i: f"output {i}: {m}", **t)
    ks = kernels(programs)
    assert len(ks) >= min_kernels
    assert all(k.source.startswith("# fxwrap kernel") and "@triton.jit" in k.source for k in ks)
    return ks


# -- hand-built kernels ---------------------------------------------------------------

def buf(name, size, dtype=torch.float32, stride=None) -> Buffer:
    return shared_helpers.buf(name, size, dtype, stride, DEVICE)


def emitter():
    return TARGET.emitter(TARGET)


def build(k: ScheduledKernel, hints=None):
    """Render and load ``k`` with the Triton emitter (size hints ``hints``):
    ``shared_helpers.build_with`` on DEVICE."""
    em = emitter()
    em.size_hints = dict(hints or {})
    return build_with(em, k, DEVICE)


__all__ = ["GPU", "TARGET", "TARGET_NAME", "DEVICE", "TOL", "make", "compiled", "kernels", "check", "x0", "x1", "x2",
           "r0", "r1", "s0", "buf", "ld", "const", "op", "acc", "kernel", "emitter", "build",
           "Store", "Reduction", "Op"]
