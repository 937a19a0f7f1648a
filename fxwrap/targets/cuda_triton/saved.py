"""The loaders a saved program's Triton kernels carry: cubins for ``cuda``, source for
``triton-interpret``.  They import Triton's runtime at most, never fxwrap's compiler.

``program.save`` replaces the loader of each kernel (``TritonEmitter.saved_loader``):

* ``cuda``: a ``CubinLoader`` holding, per launch (one; two for a split-outer
  reduction: partials and combine), the cubin and what ``cuda_driver`` needs to launch
  it -- the entry's name, its PTX parameter types, threads per block, shared memory
  bytes -- and the GPU's compute capability::

      CubinLoader(arch=(9, 0), parts=({"symbol": "fxwrap_pointwise_0", "cubin": b"...",
                                       "ptx_types": ["*u64", "*u64", "u32", ...],
                                       "threads": 128, "shared": 0}, ...))

  ``loader(kernel)`` loads the cubins (``cuModuleLoadData``) and binds a
  ``CubinLauncher`` (``cuLaunchKernel``): nothing is compiled.  A call the cubin was
  not compiled for (a pointer that is not 16-byte aligned, a grid or size beyond
  int32) goes through Triton's ``kernel[grid](...)``, which compiles that variant
  once, with a warning.  On a GPU of another compute capability the whole kernel is
  compiled again by Triton from its source (``triton_source_loader``), with a warning.
* ``triton-interpret``: ``interpreted_loader``: the kernel's source is its program
  (Triton's CPU interpreter runs it).
"""
from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Callable

from fxwrap.runtime.launch import TritonLaunch
from fxwrap.targets.cuda_triton.cuda_driver import DriverKernel, _load_cubin, ptx_parameters, slot_format
from fxwrap.targets.cuda_triton.launcher import (InterpretedLauncher, SequenceLauncher, SplitLauncher, _constexprs, _device_getter,
                                                 _options, _raw_stream_getter, bind_compiled, driver_launch,
                                                 grid_function, launch_preamble, load_module, split_launches)


def _parts(launch: TritonLaunch) -> tuple[TritonLaunch, ...]:
    """The launch metadata of each kernel launch behind one fxwrap kernel."""
    if launch.parts:
        return tuple(launch.parts)
    return split_launches(launch) if launch.plan == "split-outer" else (launch,)


def _combine(kernel, launchers: list) -> Callable:
    if kernel.launch.parts:
        return SequenceLauncher(launchers)
    return SplitLauncher(launchers[0], launchers[1], kernel.launch) if len(launchers) == 2 else launchers[0]


def interpreted_loader(kernel) -> Callable:
    """``triton-interpret`` kernels: import the source and run it in Triton's interpreter."""
    launchers = [InterpretedLauncher(getattr(load_module(kernel.source, part.symbol, True), part.symbol), part)
                 for part in _parts(kernel.launch)]
    return _combine(kernel, launchers)


interpreted_loader.fxwrap_saved = True


def _device_index(launch: TritonLaunch) -> int:
    import torch
    index = launch.device_index
    return torch.cuda.current_device() if index is None else int(index)


def triton_source_loader(kernel) -> Callable:
    """``cuda`` kernels without a usable cubin: Triton compiles the source (warmup) and the
    launcher binds it, as the emitter does at compile time."""
    import torch
    index = _device_index(kernel.launch)
    launchers = []
    with torch.cuda.device(index):
        for part in _parts(kernel.launch):
            fn = getattr(load_module(kernel.source, part.symbol, False), part.symbol)
            dtypes = [getattr(torch, d.replace("torch.", "")) for d in part.pointer_dtypes]
            launchers.append(bind_compiled(fn, part, dtypes, index, device_count=torch.cuda.device_count()))
    return _combine(kernel, launchers)


triton_source_loader.fxwrap_saved = True


def _compiled_parts(launcher) -> list:
    """The Triton ``CompiledKernel`` of each launch of a bound ``cuda`` launcher."""
    if isinstance(launcher, SplitLauncher):
        return [*_compiled_parts(launcher.partial), *_compiled_parts(launcher.combine)]
    if isinstance(launcher, SequenceLauncher):
        return [c for part in launcher.parts for c in _compiled_parts(part)]
    compiled = getattr(launcher, "compiled", None)
    return [compiled] if compiled is not None else []


def cubin_loader_of(kernel) -> Callable:
    """What ``program.save`` stores for a ``cuda`` kernel: a ``CubinLoader`` when every
    launch's cubin can be launched through the driver, else ``triton_source_loader``."""
    import torch
    launch = kernel.launch
    parts = _parts(launch)
    compiled = _compiled_parts(kernel.launcher())
    if len(compiled) != len(parts):
        return triton_source_loader
    saved = []
    for part, ck in zip(parts, compiled):
        nsizes = len(part.size_symbols)
        meta = ck.metadata
        cubin = ck.asm.get("cubin") if hasattr(ck.asm, "get") else None
        ptx = ck.asm.get("ptx") if hasattr(ck.asm, "get") else None
        if not isinstance(cubin, bytes) or not isinstance(ptx, str):
            return triton_source_loader
        types = ptx_parameters(ptx, meta.name)
        if (types is None or slot_format(types, part.pointers, nsizes) is None
                or getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0)
                or getattr(meta, "num_ctas", 1) != 1):
            return triton_source_loader
        saved.append({"symbol": meta.name, "cubin": cubin, "ptx_types": types,
                      "threads": meta.num_warps * 32, "shared": meta.shared})
    arch = tuple(torch.cuda.get_device_capability(_device_index(launch)))
    return CubinLoader(arch, tuple(saved))


class CubinLoader:
    """A saved ``cuda`` kernel's loader: its cubins (see the module docstring)."""

    fxwrap_saved = True  # a saved loader: program files store it as it is

    def __init__(self, arch: tuple[int, int], parts: tuple[TritonLaunch, ...]):
        self.arch, self.parts = tuple(arch), tuple(parts)

    def __call__(self, kernel) -> Callable:
        import torch
        index = _device_index(kernel.launch)
        here = tuple(torch.cuda.get_device_capability(index))
        if here != self.arch:
            warnings.warn(f"fxwrap: kernel {kernel.name} of a loaded program was compiled for compute "
                          f"capability {self.arch}, this GPU has {here}; Triton compiles it again from its "
                          "source", stacklevel=2)
            return triton_source_loader(kernel)
        count = torch.cuda.device_count()
        launchers = [CubinLauncher(kernel.source, part, saved, index, count)
                     for part, saved in zip(_parts(kernel.launch), self.parts)]
        return _combine(kernel, launchers)

    def __repr__(self) -> str:
        return f"CubinLoader(arch={self.arch}, {len(self.parts)} cubin(s))"


class CubinLauncher:
    """``launcher(*tensors, *sizes)``: one saved cubin launched through ``cuLaunchKernel``
    (``cuda_driver.DriverKernel``), the grid computed from the sizes as at compile time."""

    kind = "compiled"
    path = "cuda-driver"

    def __init__(self, text: str, launch: TritonLaunch, saved: dict, device_index: int, device_count: int):
        self.text, self.launch = text, launch
        self.npointers = launch.pointers
        self.aligned = tuple(range(launch.pointers))  # the cubin assumes every pointer 16-byte aligned
        nsizes = len(launch.size_symbols)
        self.grid = grid_function(launch)
        self.device = device_index
        self.other_devices = device_count > 1
        self.current_device = _device_getter()
        self.stream = _raw_stream_getter()
        module, function = _load_cubin(saved["cubin"], saved["symbol"], device_index, saved["shared"],
                                       saved["threads"])
        self.driver = DriverKernel(saved["symbol"], function, module, list(saved["ptx_types"]), self.npointers,
                                   nsizes, saved["threads"], saved["shared"], device_index)
        self.local = threading.local()  # per calling thread: (slots, params)
        self.streams: dict[int, ctypes.c_void_p] = {}
        self.triton_fn = None

    def on_own_device(self, args):
        """Launch with the kernel's device current (the caller's is restored after)."""
        import torch
        with torch.cuda.device(self.device):
            return self(*args)

    def __call__(self, *args):
        call = launch_preamble(self, args)
        if call is None:
            return
        n, pointers, sizes, fallback = call
        if fallback is not None or not driver_launch(self, self.driver, n, pointers, sizes):
            return self.generic(n, args)

    def generic(self, n: int, args):
        """Triton's own launch (compiles the variant this call needs, once)."""
        if self.triton_fn is None:
            warnings.warn(f"fxwrap: kernel {self.launch.symbol} of a loaded program got a call its saved "
                          "cubin was not compiled for (a pointer not 16-byte aligned, or a size beyond int32); "
                          "Triton compiles that variant from the kernel's source", stacklevel=3)
            self.triton_fn = getattr(load_module(self.text, self.launch.symbol, False), self.launch.symbol)
        self.triton_fn[(n,)](*args, **_constexprs(self.launch), **_options(self.launch))
