"""User-written Triton kernels as a compiled program meets them: the ``JITFunction``
inside a kernel object (itself, or under ``triton.autotune`` / ``triton.heuristics``).

Both the compiler (``wrapper_ir/build_user_kernels.py``, which records a launch) and a
saved program's loader (``targets/cuda_triton/user_kernels.py``, which runs it without
the compiler) look the function up here; each raises its own error when there is none."""
from __future__ import annotations


def jit_function_of(kernel):
    """The ``triton.runtime.jit.JITFunction`` that ``kernel`` is or wraps (through the
    ``fn`` attribute of ``Autotuner`` / ``Heuristics``), or None."""
    from triton.runtime.jit import JITFunction
    inner = kernel
    while not isinstance(inner, JITFunction):
        inner = getattr(inner, "fn", None)
        if inner is None:
            return None
    return inner
