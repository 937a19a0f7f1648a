"""Launching user-written Triton kernels: the ``cuda`` and ``triton-interpret`` side of a
``CallUserKernel`` line (``ir/user_kernels.py``).

The launcher takes the line's FX arguments, ``(*tensors_and_scalars, *grid0, *grid1, ...)``,
and launches the user's kernel with them by name, its constant arguments added::

    launcher(x, y, out, 100, 2, 1, 1)   ->   add_kernel[(2, 1, 1)](x_ptr=x, y_ptr=y, out_ptr=out, n=100, BLOCK=64)

* ``cuda``: the user's ``JITFunction`` itself (Triton compiles and caches it as in eager);
  an ``Autotuner`` keeps its own tuning, and the grid is the one dynamo computed for the
  config it picks (a ``meta -> grid`` lookup over the configs).
* ``triton-interpret``: Triton's CPU interpreter runs the kernel's Python function
  (``InterpretedFunction``); an autotuned kernel runs with its first config (a config changes
  speed, not results).  The ``@triton.jit`` functions the kernel calls by a global name are
  interpreted too: during the launch, those names in their modules refer to interpreted copies.

A saved program (``program.save``, the program cache) imports the kernel again by its module and
qualified name (``user_kernel_loader``): saving needs a kernel defined at the top level of an
importable module, checked when saving (``saved_loader_of``); loading checks that its source
(Triton's ``cache_key``) is the one the program was compiled with.  This module imports Triton's
runtime and torch only (no compiler module).
"""
from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from contextlib import contextmanager

from fxwrap.runtime.launch import UserTritonLaunch
from fxwrap.runtime.user_kernels import jit_function_of


class UserKernelNotSaved(RuntimeError):
    """A program launching a user Triton kernel that cannot be saved or loaded: names the kernel
    and what to do."""


def _jit_of(kernel):
    inner = jit_function_of(kernel)
    if inner is None:
        raise UserKernelNotSaved(f"{kernel!r} holds no Triton JITFunction")
    return inner


_SWAP_LOCK = threading.Lock()


def _jit_globals(fn, found: list, seen: set) -> None:
    """Every ``(module globals, name, JITFunction)`` that ``fn`` (and what they call) names."""
    from triton.runtime.jit import JITFunction
    namespace = fn.__globals__
    for name in fn.__code__.co_names:
        value = namespace.get(name)
        if isinstance(value, JITFunction) and id(value) not in seen:
            seen.add(id(value))
            found.append((namespace, name, value))
            _jit_globals(value.fn, found, seen)


@contextmanager
def _interpreted_callees(fn, cache: dict):
    """While the interpreter runs ``fn``: each ``@triton.jit`` function it calls by a global name
    is an ``InterpretedFunction`` of it (a ``JITFunction`` refuses to run outside a compiled kernel)."""
    from triton.runtime.interpreter import InterpretedFunction
    found: list = []
    _jit_globals(fn, found, set())
    if not found:
        yield
        return
    with _SWAP_LOCK:
        for namespace, name, jit in found:
            interpreted = cache.get(jit)
            if interpreted is None:
                interpreted = cache[jit] = InterpretedFunction(jit.fn)
            namespace[name] = interpreted
        try:
            yield
        finally:
            for namespace, name, jit in reversed(found):
                namespace[name] = jit


class UserKernelLauncher:
    """``launcher(*args, *grids)``: one user kernel launch (see the module docstring)."""

    kind = "user"

    def __init__(self, triton_kernel, launch: UserTritonLaunch, interpret: bool):
        self.name = launch.symbol
        self.params = tuple(launch.params)
        self.constants = dict(launch.constants)
        self.ngrids = int(launch.grids)
        self.configs = launch.configs
        self.interpret = interpret
        if interpret:
            from triton.runtime.interpreter import InterpretedFunction
            self.python_fn = _jit_of(triton_kernel).fn
            self.fn = InterpretedFunction(self.python_fn)
            self.config_kwargs = dict(self.configs[0]["kwargs"]) if self.configs else {}
            self.callees: dict = {}
        else:
            self.fn = triton_kernel

    def __call__(self, *args):
        n = len(self.params)
        kwargs = dict(zip(self.params, args[:n]))
        kwargs.update(self.constants)
        flat = args[n:]
        grids = [tuple(flat[3 * i:3 * i + 3]) for i in range(self.ngrids)]
        if self.interpret:
            kwargs.update(self.config_kwargs)
            with _interpreted_callees(self.python_fn, self.callees):
                self.fn[grids[0]](**kwargs)
            return None
        grid = grids[0] if len(grids) == 1 else self._grid_for(grids)
        self.fn[grid](**kwargs)
        return None

    def _grid_for(self, grids: list) -> Callable:
        """``meta -> grid``: the grid of the autotuning config whose kwargs ``meta`` holds."""
        configs = [c["kwargs"] for c in self.configs]

        def grid(meta):
            for config, found in zip(configs, grids):
                if all(meta.get(k) == v for k, v in config.items()):
                    return found
            return grids[0]
        return grid

    def __repr__(self) -> str:
        return f"UserKernelLauncher({self.name}, {'interpreted' if self.interpret else 'cuda'})"


def launcher_for(triton_kernel, launch: UserTritonLaunch) -> UserKernelLauncher:
    return UserKernelLauncher(triton_kernel, launch, bool(launch.interpret))


# ------------------------------------------------------------------------------ saving
def _importable(launch: UserTritonLaunch) -> str | None:
    """Why the kernel cannot be imported again by name, or None."""
    module, qualname = launch.module, launch.qualname or ""
    if not module or module == "__main__":
        return f"it is defined in {module or 'no module'}, which another process cannot import"
    if "<locals>" in qualname:
        return "it is defined inside a function"
    return None


def _imported_kernel(launch: UserTritonLaunch):
    """The user's kernel object again: imported by module and qualified name, rebuilt as an
    autotuner from the saved configs where the program launched one."""
    why = _importable(launch)
    if why is not None:
        raise UserKernelNotSaved(f"user Triton kernel {launch.symbol}: {why}")
    obj = importlib.import_module(launch.module)
    for part in launch.qualname.split("."):
        obj = getattr(obj, part)
    jit = _jit_of(obj)
    if str(jit.cache_key) != launch.jit_key:
        raise UserKernelNotSaved(
            f"user Triton kernel {launch.module}.{launch.qualname} has changed since the program was "
            "compiled (its source, or a function it calls): compile the program again")
    if launch.configs is None:
        return jit
    import triton
    configs = [triton.Config(dict(c["kwargs"]), **{k: v for k, v in c.items() if k != "kwargs"})
               for c in launch.configs]
    return triton.autotune(configs=configs, key=[], reset_to_zero=list(launch.reset_to_zero) or None,
                           restore_value=list(launch.restore_value) or None)(jit)


def user_kernel_loader(kernel) -> Callable:
    """A saved program's loader of a user kernel: import it again (see the module docstring)."""
    return launcher_for(_imported_kernel(kernel.launch), kernel.launch)


user_kernel_loader.fxwrap_saved = True


def compile_time_loader(kernel) -> Callable:
    """The loader a compiled user kernel carries (its launcher is bound at compile time): the same
    import as ``user_kernel_loader``; ``program.save`` checks first that it will work
    (``saved_loader_of``)."""
    return user_kernel_loader(kernel)


def saved_loader_of(kernel) -> Callable:
    """``user_kernel_loader`` for a kernel another process can import; else ``UserKernelNotSaved``."""
    launch = kernel.launch
    why = _importable(launch)
    if why is not None:
        raise UserKernelNotSaved(
            f"this program launches the user Triton kernel {launch.symbol} ({launch.module}."
            f"{launch.qualname}), which a saved program must import again by name, but {why}: define the "
            "kernel at the top level of an importable module to save the program")
    return user_kernel_loader
