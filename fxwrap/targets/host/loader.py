"""Shared object -> ctypes function -> pre-bound launcher.

A launcher is made once, at compile time, for one kernel signature; calling it only
reads the data pointers and forwards them::

    launch = launcher_for(source.text, "fxwrap_kernel_0", pointers=2, sizes=1)
    launch(x, out, 1024)      # == fn(x.data_ptr(), out.data_ptr(), int(1024))

Arguments are the kernel's signature in order: tensors for the ``pointers`` buffer
arguments (inputs, then outputs), ints for the size symbols.  The pointer a kernel
receives is ``tensor.data_ptr()``: the first element of the view, storage offset
included; kernel index expressions are relative to it.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path

from fxwrap.targets.host.compiler import CompileError, CppCompiler, default_compiler

_LIBS: dict[str, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def load_library(path: str | Path) -> ctypes.CDLL:
    """dlopen ``path`` once per process."""
    key = str(path)
    with _LOCK:
        lib = _LIBS.get(key)
        if lib is None:
            lib = _LIBS[key] = ctypes.CDLL(key)
        return lib


def c_function(lib: ctypes.CDLL, symbol: str, pointers: int, sizes: int):
    fn = getattr(lib, symbol)
    fn.argtypes = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * sizes
    fn.restype = None
    return fn


def make_launcher(fn, pointers: int, sizes: int, name: str = "launch") -> Callable:
    """A Python function of fixed arity calling ``fn`` with data pointers and ints."""
    params = [f"t{i}" for i in range(pointers)] + [f"s{i}" for i in range(sizes)]
    args = [f"t{i}.data_ptr()" for i in range(pointers)] + [f"int(s{i})" for i in range(sizes)]
    src = f"def {name}({', '.join(params)}):\n    fn({', '.join(args)})\n"
    namespace = {"fn": fn}
    exec(compile(src, f"<fxwrap launcher {name}>", "exec"), namespace)  # noqa: S102 - generated
    launch = namespace[name]
    launch.c_function = fn
    return launch


def launcher_for(source: str, symbol: str, pointers: int, sizes: int,
                 compiler: CppCompiler | None = None) -> Callable:
    """Compile (cached) and bind ``symbol`` of ``source``."""
    comp = compiler or default_compiler()
    path = comp.compile(source)
    try:
        lib = load_library(path)
    except OSError as exc:
        # a cache entry corrupted behind our back: rebuild it once
        comp.cache.evict(comp.key(source))
        path = comp.compile(source)
        try:
            lib = load_library(path)
        except OSError:
            raise CompileError(f"kernel {symbol}: cannot load {path}: {exc}") from exc
    fn = c_function(lib, symbol, pointers, sizes)
    launch = make_launcher(fn, pointers, sizes, name=symbol)
    launch.library = str(path)
    return launch


def kernel_loader(kernel) -> Callable:
    """``fxwrap.runtime.Kernel`` loader (picklable): rebuild the launcher from the source."""
    launch = kernel.launch
    return launcher_for(kernel.source, launch["symbol"], launch["pointers"],
                        len(launch["size_symbols"]))
