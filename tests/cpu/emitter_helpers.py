"""Helpers for the C++ emitter tests: build ``ScheduledKernel``s by hand, run them.

Importable by name (``import emitter_helpers``) from the tests in this folder.
"""
from __future__ import annotations

import os
import sys

import sympy
import torch

from fxwrap.ir.loops import Op, Reduction, ScheduledKernel, Store, rvar, xvar  # noqa: F401
from fxwrap.targets.cpu_cpp.emitter import CppEmitter

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:  # also when imported from a subprocess that only added this folder
    sys.path.append(_TESTS)
from shared_helpers import CPU, acc, buf, build_with, const, contiguous, kernel, ld, op  # noqa: F401

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
    """Render and load ``k`` with the C++ emitter: ``shared_helpers.build_with``."""
    return build_with(emitter(), k)


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


def unvectorized_simd_loops(source: str, folder) -> list:
    """The ``#pragma omp simd`` loops of a kernel's ``source`` that g++ (fxwrap's flags, its
    ``-fopt-info-vec-optimized`` report) does not vectorize: ``[(line, report)]`` (the 1-based
    line of the pragma), empty when every one is.  g++ reports a vectorized loop at a line
    of the loop (its ``for``, or a statement of its body); ``folder`` (a ``tmp_path``) holds
    the source and object."""
    import re
    import subprocess

    from fxwrap.targets.host.compiler import DEFAULT_FLAGS

    src = folder / "k.cpp"
    src.write_text(source)
    lines = source.splitlines()
    start = next(j for j, t in enumerate(lines) if t.startswith('extern "C"'))
    simd = [i + 1 for i, line in enumerate(lines) if i > start and line.strip() == "#pragma omp simd"]
    assert simd, "no omp simd loop in the kernel"
    flags = [f for f in DEFAULT_FLAGS if f != "-shared"]
    report = subprocess.run(["g++", *flags, "-fopt-info-vec-optimized", "-c", str(src), "-o", str(folder / "k.o")],
                            capture_output=True, text=True, check=True).stderr
    vectorized = {int(m) for m in re.findall(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", report)}

    def loop_lines(pragma: int) -> set:
        first = pragma + 1  # the loop's for line, then its body up to the brace closing it
        depth, last = 0, first
        for last in range(first, len(lines) + 1):
            depth += lines[last - 1].count("{") - lines[last - 1].count("}")
            if depth <= 0:
                break
        return set(range(first, last + 1))

    return [(p, report) for p in simd if not vectorized & loop_lines(p)]
