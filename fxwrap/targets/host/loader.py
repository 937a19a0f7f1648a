"""Shared object -> ctypes function -> pre-bound launcher.

A launcher is made once, at compile time, for one kernel signature; calling it only
reads the data pointers and forwards them::

    launch = launcher_for(source.text, "fxwrap_kernel_0", pointers=2, sizes=1)
    launch(x, out, 1024)      # == fn(x.data_ptr(), out.data_ptr(), int(1024))

Arguments are the kernel's signature in order: tensors for the ``pointers`` buffer
arguments (inputs, then outputs), ints for the size symbols.  The pointer a kernel
receives is ``tensor.data_ptr()``: the first element of the view, storage offset
included; kernel index expressions are relative to it.

Kernels that differ only in their names share one shared object: what is compiled is
``shared_source``'s text, the source without its header comment and with the kernel's
symbol renamed to one named by the code (``fxwrap_kernel_`` and a digest of the source with
the name taken out), so the three layers of a model, or a forward and a backward graph,
compile each distinct kernel once, and distinct kernels export distinct symbols (several
of them compile in one translation unit: ``compile_ahead``)::

    shared_source("// fxwrap kernel fxwrap_pointwise_7\n...void fxwrap_pointwise_7(...)", "fxwrap_pointwise_7")
    ("...void fxwrap_kernel_3f2a...(...)", "fxwrap_kernel_3f2a...")
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import threading
from collections.abc import Callable
from pathlib import Path

from fxwrap.targets.host.compiler import CompileError, CppCompiler, SharedPrelude, default_compiler, without_header
from fxwrap.targets.host.trampoline import c_launcher, prepare

#: the symbol a kernel's shared object exported before symbols were named by the code (program
#: files saved then bind it); ``shared_source`` uses it in place of the kernel's name to name the code
SHARED_SYMBOL = "fxwrap_kernel_entry"
#: what a kernel's shared object exports: this and 24 hex digits of its code (``shared_source``)
ENTRY_PREFIX = "fxwrap_kernel_"

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


def make_launcher(fn, pointers: int, sizes: int, name: str = "launch", trampoline: bool = True) -> Callable:
    """A launcher calling ctypes function ``fn`` with data pointers and ints: the C binding
    (``trampoline.c_launcher``: no ctypes on the call) where it serves, else a Python
    function of fixed arity going through ctypes.  Either has ``c_function`` (``fn``)."""
    fast = c_launcher(ctypes.cast(fn, ctypes.c_void_p).value, pointers, sizes, name) if trampoline else None
    if fast is not None:
        fast.c_function = fn  # and keeps the library loaded
        return fast
    params = [f"t{i}" for i in range(pointers)] + [f"s{i}" for i in range(sizes)]
    args = [f"t{i}.data_ptr()" for i in range(pointers)] + [f"int(s{i})" for i in range(sizes)]
    src = f"def {name}({', '.join(params)}):\n    fn({', '.join(args)})\n"
    namespace = {"fn": fn}
    exec(compile(src, f"<fxwrap launcher {name}>", "exec"), namespace)  # noqa: S102 - generated
    launch = namespace[name]
    launch.c_function = fn
    return launch


def shared_source(source: str, symbol: str) -> tuple[str, str]:
    """``(text, exported symbol)`` to compile for kernel ``source`` whose function is
    ``symbol``: the source less its header comment, every whole-word ``symbol`` renamed to
    ``ENTRY_PREFIX`` and a digest of that text with ``SHARED_SYMBOL`` for the name (equal
    kernels of other names give the same text, so one cache entry; other kernels, other
    symbols); the source as it is where it does not name ``symbol`` or already uses
    ``SHARED_SYMBOL``."""
    body = without_header(source)
    own = re.compile(rf"\b{re.escape(symbol)}\b")
    if re.search(rf"\b{SHARED_SYMBOL}\b", body) or not own.search(body):
        return source, symbol
    exported = ENTRY_PREFIX + hashlib.sha256(own.sub(SHARED_SYMBOL, body).encode()).hexdigest()[:24]
    return own.sub(exported, body), exported


def compile_ahead(sources: list[tuple[str, str]], compiler: CppCompiler | None = None,
                  prelude: SharedPrelude | None = None, units: int = 1) -> None:
    """Compile the kernels ``sources`` (``(source, symbol)``) not in the cache yet, a few
    translation units of them at once (``CppCompiler.compile_many``, at most ``units``):
    ``launcher_for`` then finds each compiled."""
    comp = compiler or default_compiler()
    prepare()  # the launch binding builds while the kernels compile
    if prelude is not None:
        comp.compile_many([shared_source(source, symbol)[0] for source, symbol in sources], prelude, units)


def launcher_for(source: str, symbol: str, pointers: int, sizes: int,
                 compiler: CppCompiler | None = None, prelude: SharedPrelude | None = None) -> Callable:
    """Compile (cached, shared between kernels equal but for their names: ``shared_source``;
    ``prelude`` precompiled: ``CppCompiler.compile``) and bind ``symbol`` of ``source``."""
    comp = compiler or default_compiler()
    prepare()  # the launch binding builds while this kernel compiles
    text, exported = shared_source(source, symbol)
    path = comp.compile(text, prelude=prelude)
    try:
        lib = load_library(path)
    except OSError as exc:
        # a cache entry corrupted behind our back: rebuild it once
        comp.cache.evict(comp.key(text))
        path = comp.compile(text, prelude=prelude)
        try:
            lib = load_library(path)
        except OSError:
            raise CompileError(f"kernel {symbol}: cannot load {path}: {exc}") from exc
    fn = c_function(lib, exported, pointers, sizes)
    launch = make_launcher(fn, pointers, sizes, name=symbol)
    launch.library = str(path)
    return launch


def kernel_loader(kernel) -> Callable:
    """``fxwrap.runtime.Kernel`` loader (picklable): rebuild the launcher from the source."""
    launch = kernel.launch
    return launcher_for(kernel.source, launch.symbol, launch.pointers, len(launch.size_symbols))
