"""Runs emitted Metal source on the CPU: Metal text + generated driver -> C++ -> ctypes.

The translation unit is the kernel's Metal source, unchanged (its
``#include <metal_stdlib>`` finds ``shim/metal_stdlib``, which includes
``shim/fxwrap_metal_shim.h``), followed by an ``extern "C"`` entry the driver
generates from the launch metadata::

    extern "C" int fxwrap_shim_entry(void** p, const int64_t* s, int64_t groups,
                                     int64_t tg, int mode) {
      return fx_shim_dispatch(groups, tg, mode, [&](int64_t g, int64_t t) {
        fxwrap_reduction_0(fx_any_ptr{p[0]}, fx_any_ptr{p[1]}, s[0],
                           (uint)g, (uint)t, (uint)tg);
      });
    }

It is built by the C++ target's compiler driver and atomic on-disk cache
(``host.compiler``), with the shim header's hash in the flags so a changed shim
never reuses a stale binary, and loaded with ``host.loader.load_library``.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from fxwrap.runtime.launch import MetalLaunch
from fxwrap.targets.host.compiler import CppCompiler
from fxwrap.targets.host.cache import default_cache_dir
from fxwrap.targets.host.loader import load_library

SHIM_DIR = Path(__file__).resolve().parent / "shim"
SHIM_HEADER = SHIM_DIR / "fxwrap_metal_shim.h"
MODES = {"independent": 0, "teams": 1, "sequential": 2}

# Position attributes -> the driver's value for thread t of threadgroup g.
_POSITION = {
    "thread_position_in_grid": "(uint)(g * tg + t)",
    "threadgroup_position_in_grid": "(uint)g",
    "thread_position_in_threadgroup": "(uint)t",
    "thread_index_in_threadgroup": "(uint)t",
    "threads_per_threadgroup": "(uint)tg",
    "threadgroups_per_grid": "(uint)groups",
    "thread_index_in_simdgroup": "(uint)(t % 32)",
    "simdgroup_index_in_threadgroup": "(uint)(t / 32)",
}


def _shim_flags() -> tuple[str, ...]:
    digest = hashlib.sha256(SHIM_HEADER.read_bytes() + (SHIM_DIR / "metal_stdlib").read_bytes())
    return ("-O1", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fwrapv", "-ffp-contract=off",
            "-fno-math-errno", "-Wno-attributes", f"-I{SHIM_DIR}",
            f"-DFXWRAP_SHIM_SHA={digest.hexdigest()[:16]}")


_COMPILERS: dict[tuple, CppCompiler] = {}


def shim_compiler() -> CppCompiler:
    """One compiler per ($CXX, cache dir), with the shim's flags."""
    key = (os.environ.get("CXX") or "g++", str(default_cache_dir()))
    comp = _COMPILERS.get(key)
    if comp is None:
        comp = _COMPILERS[key] = CppCompiler(cxx=key[0], flags=_shim_flags(), cache_dir=key[1])
    return comp


def translation_unit(source: str, symbol: str, pointers: int, sizes: int,
                     thread_args: Sequence[str]) -> str:
    """The Metal ``source`` plus the ``extern "C"`` entry calling ``symbol``."""
    try:
        positions = [_POSITION[a] for a in thread_args]
    except KeyError as exc:
        raise NotImplementedError(f"Metal shim: position attribute {exc.args[0]!r} of kernel {symbol} "
                                  f"is not emulated; supported: {sorted(_POSITION)}") from None
    args = ([f"fx_any_ptr{{p[{i}]}}" for i in range(pointers)] + [f"s[{i}]" for i in range(sizes)]
            + positions)
    return "\n".join([
        source.rstrip("\n"), "",
        "// ---- fxwrap Metal shim driver ----",
        'extern "C" int fxwrap_shim_entry(void** p, const int64_t* s, int64_t groups, int64_t tg, int mode) {',
        "  (void)p; (void)s;",
        "  return fx_shim_dispatch(groups, tg, mode, [&](int64_t g, int64_t t) {",
        f"    {symbol}({', '.join(args)});",
        "  });",
        "}", ""])


class ShimKernel:
    """A Metal kernel compiled for the CPU; ``run(tensors, sizes, groups, tg, mode)``.

    ``team_size`` is the number of threads the last launch ran per threadgroup
    concurrently (``mode="teams"``), 1 otherwise.
    """

    def __init__(self, source: str, symbol: str, pointers: int, sizes: int,
                 thread_args: Sequence[str], library: Path | None = None):
        """``library``: the shared object already built from this kernel (a saved
        program's); None compiles the translation unit (cached)."""
        self.symbol, self.pointers, self.sizes = symbol, pointers, sizes
        if library is None:
            library = shim_compiler().compile(translation_unit(source, symbol, pointers, sizes, thread_args))
        self.library = library
        fn = load_library(self.library).fxwrap_shim_entry
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        fn.restype = ctypes.c_int
        self.fn = fn
        self.team_size = 0

    def run(self, tensors, sizes, groups: int, tg: int, mode: str = "teams") -> None:
        ptrs = (ctypes.c_void_p * max(1, self.pointers))(*[t.data_ptr() for t in tensors])
        svals = (ctypes.c_int64 * max(1, self.sizes))(*[int(s) for s in sizes])
        ran = self.fn(ptrs, svals, int(groups), int(tg), MODES[mode])
        if ran < 0:
            raise RuntimeError(f"Metal shim: OpenMP could not start a team of {tg} threads for kernel "
                               f"{self.symbol} (check OMP_THREAD_LIMIT / nested parallelism)")
        self.team_size = ran


def grid_function(expr: str, size_names: Sequence[str]) -> Callable[..., int]:
    """``grid_function("(64 * s0)", ["s0"])(3) == 192`` (built once, at load time)."""
    params = ", ".join(size_names)
    return eval(f"lambda {params}: int({expr})", {"__builtins__": {"int": int, "max": max, "min": min}})  # noqa: S307


def shim_launcher(source: str, launch: MetalLaunch, library: Path | None = None) -> Callable:
    """A pre-bound launcher ``launch(*tensors, *sizes)`` for an emitted Metal kernel
    (``library``: its shared object, built already)."""
    pointers, names = launch.pointers, tuple(launch.size_symbols)
    kernel = ShimKernel(source, launch.symbol, pointers, len(names), launch.thread_args, library)
    numel = grid_function(launch.grid, names)
    tg = int(launch.threadgroup_size)
    reduction = launch.kind == "reduction"
    mode = "teams" if launch.sync else "independent"

    def launch_kernel(*args):
        sizes = args[pointers:]
        n = numel(*sizes)
        groups = n if reduction else -(-n // tg)
        kernel.run(args[:pointers], sizes, groups, tg, mode)

    launch_kernel.shim = kernel
    launch_kernel.threadgroup_size = tg
    return launch_kernel


def bind_shim_kernel(library: Path, kernel) -> Callable:
    """A saved shim kernel's launcher from its shared object (``host.saved``)."""
    return shim_launcher(kernel.source, kernel.launch, library)


def kernel_loader(kernel) -> Callable:
    """``fxwrap.Kernel`` loader (picklable): compile the kernel's translation unit (cached)."""
    return shim_launcher(kernel.source, kernel.launch)
