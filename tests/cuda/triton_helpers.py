"""Shared pieces of the Triton tests: the target and device under test, differential
checks against eager, and hand-built ``ScheduledKernel``s run through the emitter.

``TARGET``/``DEVICE`` are ``cuda``/``cuda`` on a GPU machine and
``triton-interpret``/``cpu`` elsewhere (``conftest.py`` sets ``TRITON_INTERPRET``).
"""
from __future__ import annotations

import sympy
import torch

import fxwrap
from fxwrap.core.ir import Op, Reduction, ScheduledKernel, Store, rvar, xvar
from fxwrap.targets.cuda_triton import plugin as triton_plugin
from fxwrap.wrapper_ir.lines import Buffer

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
    n, m = shape
    if layout == "contiguous":
        t = torch.randn(n, m)
    elif layout == "transposed":
        t = torch.randn(m, n).t()
    elif layout == "sliced":
        t = torch.randn(n + 3, 2 * m)[2:n + 2, ::2]
    else:  # broadcast: stride 0 along dim 0
        t = torch.randn(1, m).expand(n, m)
    return (t * scale).to(device=DEVICE, dtype=dtype)


def compiled(fn, dynamic=False, target=TARGET):
    programs = []
    f = torch.compile(fn, backend=fxwrap.Backend(target, {"on_program": programs.append}), dynamic=dynamic)
    return f, programs


def kernels(programs):
    return [n.target for p in programs for n in p.graph_module.graph.nodes
            if isinstance(n.target, fxwrap.Kernel)]


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

def contiguous(size):
    strides, run = [], sympy.Integer(1)
    for n in reversed(size):
        strides.append(run)
        run = run * sympy.sympify(n)
    return tuple(reversed(strides))


def buf(name, size, dtype=torch.float32, stride=None) -> Buffer:
    size = tuple(sympy.sympify(n) for n in size)
    stride = tuple(sympy.sympify(s) for s in stride) if stride is not None else contiguous(size)
    return Buffer(name, size, stride, dtype, DEVICE)


def ld(name, index, dtype=torch.float32, mask=None) -> Op:
    args = (name, index if isinstance(index, Op) else sympy.sympify(index))
    return Op("load", dtype, args + ((mask,) if mask is not None else ()))


def const(value, dtype=torch.float32) -> Op:
    return Op("const", dtype, (value,))


def op(name, dtype, *args) -> Op:
    return Op(name, dtype, tuple(args))


def acc(name, dtype, field=0) -> Op:
    return Op("acc", dtype, (name, field))


def kernel(name, inputs, outputs, stores, ranges=(), reduction_ranges=(), reductions=(), sizes=()):
    return ScheduledKernel(name, tuple(inputs), tuple(outputs), tuple(sizes),
                           tuple(sympy.sympify(r) for r in ranges),
                           tuple(sympy.sympify(r) for r in reduction_ranges),
                           tuple(reductions), tuple(stores), ("test: handmade",))


def emitter():
    return TARGET.emitter(TARGET)


def build(k: ScheduledKernel, hints=None):
    """Render and load ``k``; returns ``(launcher, source)``."""
    em = emitter()
    em.size_hints = dict(hints or {})
    src = em.render(k)
    return em.load(src), src


__all__ = ["GPU", "TARGET", "TARGET_NAME", "DEVICE", "TOL", "make", "compiled", "kernels", "check", "x0", "x1", "x2",
           "r0", "r1", "s0", "buf", "ld", "const", "op", "acc", "kernel", "emitter", "build",
           "Store", "Reduction", "Op"]
