"""User-written Triton kernels as a compiled program meets them: the ``JITFunction``
inside a kernel object (itself, or under ``triton.autotune`` / ``triton.heuristics``).

Both the compiler (``wrapper_ir/build_user_kernels.py``, which records a launch) and a
saved program's loader (``targets/cuda_triton/user_kernels.py``, which runs it without
the compiler) look the function up here; each raises its own error when there is none."""
from __future__ import annotations

import sys


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


def importable_name(kernel) -> tuple[str, str]:
    """``(module, qualified name)`` under which another process imports ``kernel`` again.

    The name its function was defined with where the module holds the kernel there
    (``@triton.jit def add_kernel``: ``add_kernel``); else the module global that holds the
    kernel (``add_kernel = JITFunction(_add)``: ``add_kernel``, not ``_add``, which is the
    plain Python function); else the function's own name (which loading then reports)."""
    jit = jit_function_of(kernel)
    module_name, qualname = jit.fn.__module__, jit.fn.__qualname__
    module = sys.modules.get(module_name)
    if module is None:
        return module_name, qualname
    found = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is kernel or (found is not None and jit_function_of(found) is jit):
        return module_name, qualname
    names = sorted(name for name, value in vars(module).items() if value is kernel)
    names = names or sorted(name for name, value in vars(module).items() if value is jit)
    return module_name, names[0] if names else qualname
