"""Real-MPS launcher: ``torch.mps.compile_shader`` + explicit threads and threadgroups.

    lib = torch.mps.compile_shader(source)          # once, at load time
    lib.fxwrap_reduction_0(x, out, 29, threads=29 * 256, group_size=256)

Tensors bind to ``device`` buffers and Python ints to ``constant long&`` scalars, in
argument order (the emitted kernels number them ``[[buffer(i)]]`` in that order).
A reduction dispatches one threadgroup of ``threadgroup_size`` threads per output
row (``threads = rows * threadgroup_size``); a pointwise kernel one thread per
element.  Used where ``torch.backends.mps.is_available()``; not exercised on Linux CI.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from fxwrap.runtime.launch import MetalLaunch
from fxwrap.targets.mps_metal.shim_runner import grid_function


def mps_launcher(source: str, launch: MetalLaunch) -> Callable:
    """A pre-bound launcher ``launch(*tensors, *sizes)`` on the MPS device."""
    if not torch.backends.mps.is_available():
        raise RuntimeError(f"kernel {launch.symbol} (target mps) needs an MPS device, and "
                           "torch.backends.mps.is_available() is False; on a machine without one, "
                           "compile with options={'target': 'mps', 'execute': 'shim'} to run the "
                           "Metal kernels on CPU tensors through the C++ shim")
    library = torch.mps.compile_shader(source)
    fn = getattr(library, launch.symbol)
    pointers, names = launch.pointers, tuple(launch.size_symbols)
    numel = grid_function(launch.grid, names)
    tg = int(launch.threadgroup_size)
    reduction = launch.kind == "reduction"

    def launch_kernel(*args):
        sizes = [int(s) for s in args[pointers:]]
        n = numel(*sizes)
        if n <= 0:
            return
        if reduction:
            fn(*args[:pointers], *sizes, threads=n * tg, group_size=tg)
        else:
            fn(*args[:pointers], *sizes, threads=n, group_size=min(tg, n))

    launch_kernel.library = library
    return launch_kernel


def kernel_loader(kernel) -> Callable:
    """``fxwrap.Kernel`` loader (picklable): ``torch.mps.compile_shader`` of its source."""
    return mps_launcher(kernel.source, kernel.launch)


kernel_loader.fxwrap_saved = True  # needs the Metal driver, no fxwrap compiler
