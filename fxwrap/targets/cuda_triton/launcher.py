"""Kernel modules and launchers bound at compile time.

A rendered kernel is a Python module (``KernelSource.text``).  ``load_module`` writes
it once under ``FXWRAP_CACHE_DIR/triton`` (atomically) and imports it; the
``@triton.jit`` function it defines is then bound to a launcher:

* ``CompiledLauncher`` (GPU): the kernel is compiled ahead for the concrete
  signature and config (``JITFunction.warmup`` with dtypes only: pointers assumed
  16-byte aligned, sizes ``int32``); a call computes the grid from the size
  arguments and launches the compiled kernel directly -- no ``kernel[grid](...)``
  specialization/dispatch per call -- through ``cuda_driver.DriverKernel``
  (``cuLaunchKernel`` on the cubin: no launcher stub to build) or, where that path
  does not apply, ``CompiledKernel.run``, whose signature is the same in triton 3.6
  and 3.9: ``(gx, gy, gz, stream, function, packed_metadata, launch_metadata,
  enter_hook, exit_hook, *args)`` where ``args`` are every kernel parameter,
  constexprs included.  A call with pointers that are not 16-byte aligned (a slice
  at an odd offset: shifted labels ``tokens[:, 1:]``) launches a variant compiled
  without that assumption for those pointers (``DriverLauncher.for_alignment``, built
  on first use); a call whose sizes exceed int32 takes the generic
  ``kernel[grid](...)`` path (correct, slower), as does every unaligned call of a
  ``CompiledLauncher``.
* ``InterpretedLauncher`` (``TRITON_INTERPRET=1``): ``kernel[grid](...)``; the
  interpreter has no compiled kernel to bind, and its cost is the interpretation.

``launcher(*tensors, *sizes)`` takes the kernel's arguments in signature order.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import secrets
import struct
import threading
from contextlib import contextmanager
from functools import reduce
from operator import or_
from pathlib import Path
from types import SimpleNamespace

from fxwrap.runtime.cache_dir import cache_root
from fxwrap.runtime.launch import TritonLaunch
from fxwrap.targets.cuda_triton.native_launch import native_launch

_MODULES: dict[tuple[str, bool], object] = {}
_LOCK = threading.Lock()


def cache_dir() -> Path:
    return cache_root() / "triton"


@contextmanager
def _interpret_env(interpret: bool):
    """Make ``@triton.jit`` build interpreted functions while a module is executed."""
    old = os.environ.get("TRITON_INTERPRET")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if interpret:
            if old is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = old


def clear_modules() -> None:
    with _LOCK:
        _MODULES.clear()


def load_module(text: str, symbol: str, interpret: bool):
    """Import the kernel module of ``text`` (cached per process and on disk)."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    key = (digest, interpret)
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is not None:
            return mod
        directory = cache_dir() / digest[:2]
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{symbol}_{digest}.py"
        if not path.exists() or path.read_text() != text:
            tmp = directory / f".{path.name}.{secrets.token_hex(6)}.tmp"
            tmp.write_text(text)
            os.replace(tmp, path)
        name = f"fxwrap_triton_{symbol}_{digest}{'_interp' if interpret else ''}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        with _interpret_env(interpret):
            spec.loader.exec_module(mod)
        _MODULES[key] = mod
        return mod


# ---------------------------------------------------------------------------- grids
_HOST = {"_fx_ifloordiv": lambda a, b: a // b, "_fx_imod": lambda a, b: a % b,
         "tl": SimpleNamespace(maximum=max, minimum=min, where=lambda c, a, b: a if c else b)}


def grid_function(launch: TritonLaunch):
    """``grid(*sizes) -> number of programs`` from the launch metadata of a kernel."""
    params = ", ".join(launch.size_symbols)
    numels = launch.numels          # axis -> host expression over the size symbols
    blocks = dict(launch.config)
    terms = []
    for axis, expr in numels:
        block = blocks.get(f"{axis.upper()}BLOCK", 1) if axis != "r" else None
        if block is None:
            continue
        terms.append(f"((({expr}) + {block - 1}) // {block})")
    factor = launch.grid_factor   # split-outer partials: x tiles * NSPLIT
    if factor:
        terms.append(str(int(blocks[factor])))
    extra = launch.grid_extra     # split scans: rows * chunks per row (a host expression)
    if extra:
        terms.append(f"({extra})")
    body = " * ".join(terms) if terms else "1"
    # grid_extra may name the config's block sizes (a combo kernel's blocks: ``(21 + XBLOCK - 1) // XBLOCK``)
    names = {**_HOST, **{k: v for k, v in blocks.items() if k.isupper()}}
    return eval(f"lambda {params}: {body}", names)  # noqa: S307 - our own expression


def _constexprs(launch: TritonLaunch) -> dict:
    return {k: v for k, v in launch.config if k.isupper()}


def _options(launch: TritonLaunch) -> dict:
    return {k: v for k, v in launch.config if not k.isupper()}


class InterpretedLauncher:
    """``kernel[grid](*args, XBLOCK=...)`` under Triton's CPU interpreter."""

    kind = "interpreter"

    def __init__(self, fn, launch: TritonLaunch):
        self.fn = fn
        self.npointers = launch.pointers
        self.grid = grid_function(launch)
        self.constexprs = _constexprs(launch)

    def __call__(self, *args):
        n = self.grid(*args[self.npointers:])
        if n <= 0:
            return
        try:
            self.fn[(n,)](*args, **self.constexprs)
        except Exception as error:
            if "outside of the scope of a kernel" not in str(error):
                raise
            import triton
            raise RuntimeError(
                f"kernel {getattr(self.fn, '__name__', '?')} (target triton-interpret): Triton "
                f"{triton.__version__}'s interpreter cannot call a jitted function here (tl.sum, a "
                "helper) because triton was imported before TRITON_INTERPRET was set; run with "
                "TRITON_INTERPRET=1 in the environment (`python -m fxwrap fuzz` and the tests set it)") from error


def _hooks():
    try:
        from triton import knobs
        return knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    except Exception:  # pragma: no cover - older triton
        from triton.compiler.compiler import CompiledKernel
        return getattr(CompiledKernel, "launch_enter_hook", None), getattr(CompiledKernel, "launch_exit_hook", None)


def _device_getter():
    import torch
    getter = getattr(torch._C, "_cuda_getDevice", None)
    return getter if getter is not None else torch.cuda.current_device


def _raw_stream_getter():
    import torch
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is not None:
        return getter
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class _UnalignedPointer:
    """A ``warmup`` argument standing for a pointer of ``dtype`` that is not 16-byte
    aligned: Triton specializes on ``data_ptr() % 16`` and compiles without assuming it
    (its own ``MockTensor`` reports an aligned 0)."""

    def __init__(self, dtype):
        self.dtype = dtype

    @staticmethod
    def data_ptr() -> int:
        return 8


def compile_kernel(fn, launch: TritonLaunch, pointer_dtypes, nsizes: int, unaligned: frozenset = frozenset()):
    """Ahead-of-time compile ``fn`` for the launch's config: int32 sizes, every pointer
    16-byte aligned but those whose index is in ``unaligned``."""
    warm = [_UnalignedPointer(d) if i in unaligned else d for i, d in enumerate(pointer_dtypes)] + [2] * nsizes
    return fn.warmup(*warm, grid=(1,), **_constexprs(launch), **_options(launch))


INT32_MAX = 2147483647


def launch_preamble(launcher, args):
    """The first steps of a call of every launcher of a compiled kernel (``CompiledLauncher``,
    ``DriverLauncher``, a saved program's ``saved.CubinLauncher``), ``args`` being the kernel's
    arguments (``launcher.npointers`` tensors, then the sizes):

    * a call made while another device is current is made again with the kernel's device
      current (``launcher.on_own_device(args)``): the call is done, None;
    * the grid ``n`` from the sizes (``launcher.grid``); an empty grid launches nothing: None;
    * else ``(n, pointers, sizes, fallback)``: ``pointers`` the tensors' addresses; ``fallback``
      is None for a call the compiled kernel serves, ``"grid"`` where ``n`` exceeds int32, and
      ``"alignment"`` where a pointer it assumes 16-byte aligned (an index in ``launcher.aligned``)
      is not.

    A launcher chooses its way out of a fallback (Triton's generic ``kernel[grid]``, or a variant
    compiled for those pointers)."""
    if launcher.other_devices and launcher.current_device() != launcher.device:
        launcher.on_own_device(args)
        return None
    np_ = launcher.npointers
    sizes = args[np_:]
    n = launcher.grid(*sizes)
    if n <= 0:
        return None
    pointers = [t.data_ptr() for t in args[:np_]]
    if n > INT32_MAX:
        return n, pointers, sizes, "grid"
    if reduce(or_, pointers, 0) & 15 and any(pointers[i] & 15 for i in launcher.aligned):
        return n, pointers, sizes, "alignment"
    return n, pointers, sizes, None


def driver_launch(launcher, driver, n: int, pointers, sizes) -> bool:
    """Launch ``driver`` (a ``cuda_driver.DriverKernel``) over ``n`` programs on the current
    stream, the arguments packed into the calling thread's own slots (another thread's may be
    mid-launch; ``launcher.local``, ``launcher.streams`` hold them and the streams' ctypes
    arguments).  False where a size does not fit its int32 parameter: nothing was launched."""
    try:
        slots, params = launcher.local.buffers
    except AttributeError:
        slots, params = launcher.local.buffers = driver.buffers()
    try:
        driver.pack(slots, 0, *pointers, *sizes)
    except struct.error:  # a size beyond its int32 parameter
        return False
    raw = launcher.stream(launcher.device)
    stream = launcher.streams.get(raw)
    if stream is None:
        stream = launcher.streams.setdefault(raw, ctypes.c_void_p(raw))
    result = driver.cu_launch(driver.function, n, 1, 1, driver.threads, 1, 1, driver.shared, stream, params, None)
    if result:
        driver.recover(result)  # raises unless the thread lacked a context and has one now
        result = driver.cu_launch(driver.function, n, 1, 1, driver.threads, 1, 1, driver.shared, stream, params,
                                  None)
        if result:
            driver.check(result)
    return True


class CompiledLauncher:
    """A launcher that calls the compiled kernel's ``CompiledKernel.run`` directly (see
    module doc): for kernels the driver path does not take, or with
    ``FXWRAP_TRITON_LAUNCHER=triton``.  ``path`` is ``"triton"``."""

    kind = "compiled"
    path = "triton"

    def __init__(self, fn, launch: TritonLaunch, compiled, device_index: int, *, device_count: int):
        self.fn = fn
        self.npointers = launch.pointers
        self.grid = grid_function(launch)
        self.constexprs = _constexprs(launch)
        self.options = _options(launch)
        self.compiled = compiled
        self.trailing = tuple(self.constexprs.values())
        self.device = device_index
        self.aligned = tuple(range(launch.pointers))  # warmup assumed every pointer 16-byte aligned
        self.current_device = _device_getter()
        # with one visible device (the target's DeviceInterface.device_count(), given by the
        # emitter) the current device is always the kernel's: no check per call
        self.other_devices = device_count > 1
        self.stream = _raw_stream_getter()
        # launch hooks (profilers) get triton's launch metadata.  triton 3.6+ keeps them in
        # ``HookChain``s that are empty unless a profiler is active: checked per call
        self.enter, self.leave = _hooks()
        self.chains = tuple(h for h in (self.enter, self.leave) if hasattr(h, "calls"))
        self.plain_hooks = any(h is not None and not hasattr(h, "calls") for h in (self.enter, self.leave))

    def hooked(self) -> bool:
        if self.plain_hooks:
            return True
        for chain in self.chains:
            if chain.calls:
                return True
        return False

    def on_own_device(self, args):
        """Launch with the kernel's device current (the caller's is restored after):
        its module lives in that device's context."""
        import torch
        with torch.cuda.device(self.device):
            return self(*args)

    def __call__(self, *args):
        call = launch_preamble(self, args)
        if call is None:
            return
        n, _pointers, sizes, fallback = call
        if fallback is not None:
            return self.generic(n, args)
        for s in sizes:
            if not -2147483648 <= s <= INT32_MAX:
                return self.generic(n, args)
        self.triton_launch(n, args)

    def triton_launch(self, n, args):
        compiled = self.compiled
        stream = self.stream(self.device)
        if self.hooked():
            meta = compiled.launch_metadata((n, 1, 1), stream, *args, *self.trailing)
            compiled.run(n, 1, 1, stream, compiled.function, compiled.packed_metadata, meta, self.enter, self.leave,
                         *args, *self.trailing)
            return
        compiled.run(n, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *args, *self.trailing)

    def generic(self, n, args):
        self.fn[(n,)](*args, **self.constexprs, **self.options)


class DriverLauncher:
    """Launches the cubin through ``cuda_driver.DriverKernel`` (``cuLaunchKernel``): no
    launcher stub to build; the plain call in C (``native_launch``: ``path`` is
    ``"cuda-native"``), else a few ``ctypes`` operations per call (``"cuda-driver"``;
    ``FXWRAP_TRITON_LAUNCHER=ctypes`` asks for it).  While a Triton launch hook (a profiler)
    is set, calls go through Triton's ``run`` (``triton``: a ``CompiledLauncher`` of the same
    compiled kernel) so that the hook sees them."""

    kind = "compiled"
    path = "cuda-driver"

    def __init__(self, fn, launch: TritonLaunch, compiled, device_index: int, driver, *, device_count: int,
                 pointer_dtypes=(), unaligned: frozenset = frozenset()):
        self.triton = triton = CompiledLauncher(fn, launch, compiled, device_index, device_count=device_count)
        self.fn, self.launch, self.pointer_dtypes, self.device_count = fn, launch, tuple(pointer_dtypes), device_count
        self.compiled = compiled  # its cubin: what a saved program keeps (saved.cubin_loader_of)
        # what ``launch_preamble`` reads of a launcher, bound as for Triton's own launch
        self.npointers, self.grid, self.device = triton.npointers, triton.grid, device_index
        self.current_device, self.other_devices, self.stream = (triton.current_device, triton.other_devices,
                                                                triton.stream)
        # Triton's launch hooks, checked per call (``python_call``)
        self.chains, self.plain_hooks = triton.chains, triton.plain_hooks
        # the pointers this compiled variant assumes 16-byte aligned; a call with another
        # pointer unaligned goes to a variant compiled for it (``variants``, by the set of
        # unaligned pointers), not through Triton's per-call ``kernel[grid]`` dispatch
        self.unaligned = unaligned
        self.aligned = tuple(i for i in range(launch.pointers) if i not in unaligned)
        self.variants: dict[frozenset, DriverLauncher | None] = {}
        self.root = self  # the launcher of the aligned variant, which holds the others
        self.driver = driver
        self.local = threading.local()  # per calling thread: (slots, params) of driver.buffers()
        self.streams: dict[int, ctypes.c_void_p] = {}  # raw stream -> its ctypes argument
        # the plain case in C (native_launch: one binding for every kernel), declining to
        # ``python_call`` whatever is not plain; only for the aligned variant of a kernel of
        # the only device, without plain (non-chain) launch hooks
        self.native = None
        if (not unaligned and not self.other_devices and not self.plain_hooks
                and os.environ.get("FXWRAP_TRITON_LAUNCHER", "driver") == "driver"):
            nsizes = len(launch.size_symbols)
            fixed = max(int(self.grid()), 0) if nsizes == 0 else 0
            self.native = native_launch(driver, driver.format, self.npointers, nsizes, fixed, self.grid,
                                        self.chains, self.python_call, self.stream)
        self.path = "cuda-native" if self.native is not None else "cuda-driver"

    def on_own_device(self, args):
        """Launch with the kernel's device current (the caller's is restored after)."""
        import torch
        with torch.cuda.device(self.device):
            return self(*args)

    def triton_launch(self, n, args):
        self.triton.triton_launch(n, args)

    def generic(self, n, args):
        self.triton.generic(n, args)

    def __call__(self, *args):
        native = self.native
        if native is not None:
            return native(*args)
        return self.python_call(*args)

    def python_call(self, *args):
        call = launch_preamble(self, args)
        if call is None:
            return
        n, pointers, sizes, fallback = call
        if fallback == "grid":
            return self.generic(n, args)
        if fallback == "alignment":
            return self.for_alignment(pointers)(*args)
        # hooked() inlined (this is the per-call path): a profiler's hook sees Triton's run
        if self.plain_hooks:
            return self.triton_launch(n, args)
        for chain in self.chains:
            if chain.calls:
                return self.triton_launch(n, args)
        if not driver_launch(self, self.driver, n, pointers, sizes):
            return self.generic(n, args)

    def for_alignment(self, pointers):
        """The launcher for a call whose pointers are these: a variant compiled without
        the 16-byte alignment of the unaligned ones (built on first use, then cached;
        the generic path where it cannot be built)."""
        unaligned = frozenset(i for i, ptr in enumerate(pointers) if ptr & 15)
        variants = self.root.variants
        launcher = variants.get(unaligned, False)
        if launcher is False:
            launcher = variants[unaligned] = self.root._variant(unaligned)
        return self._generic_call if launcher is None else launcher

    def _generic_call(self, *args):
        n = self.grid(*args[self.npointers:])
        return self.generic(n, args)

    def _variant(self, unaligned: frozenset) -> "DriverLauncher | None":
        from fxwrap.targets.cuda_triton.cuda_driver import DriverKernel

        if not self.pointer_dtypes:
            return None
        nsizes = len(self.launch.size_symbols)
        compiled = compile_kernel(self.fn, self.launch, self.pointer_dtypes, nsizes, unaligned)
        driver = DriverKernel.load(compiled, self.device, self.launch.pointers, nsizes)
        if driver is None:
            return None
        variant = DriverLauncher(self.fn, self.launch, compiled, self.device, driver,
                                 device_count=self.device_count, pointer_dtypes=self.pointer_dtypes,
                                 unaligned=unaligned)
        variant.root = self
        return variant


def bind_compiled(fn, launch: TritonLaunch, pointer_dtypes, device_index: int, *, device_count: int) -> CompiledLauncher:
    """Compile ``fn`` for the launch's config and bind the fastest launcher that applies;
    ``device_count``: how many devices of its type there are (one: no device check per call)."""
    from fxwrap.targets.cuda_triton.cuda_driver import DriverKernel

    nsizes = len(launch.size_symbols)
    compiled = compile_kernel(fn, launch, pointer_dtypes, nsizes)
    driver = None
    if os.environ.get("FXWRAP_TRITON_LAUNCHER", "driver") != "triton":
        driver = DriverKernel.load(compiled, device_index, launch.pointers, nsizes)
    if driver is not None:
        return DriverLauncher(fn, launch, compiled, device_index, driver, device_count=device_count,
                              pointer_dtypes=pointer_dtypes)
    init = getattr(compiled, "_init_handles", None)
    if init is not None:  # load the binary now, not on the first call
        init()
    return CompiledLauncher(fn, launch, compiled, device_index, device_count=device_count)


# ---------------------------------------------------------------------------- split-outer
def split_launches(launch: TritonLaunch) -> tuple[TritonLaunch, TritonLaunch]:
    """The launch metadata of the two kernels of a split-outer reduction."""
    nws = len(launch.workspace_dtypes)
    config = tuple(launch.config)
    nsplit = dict(config)["NSPLIT"]
    common = {"pointers": launch.pointers + nws,
              "pointer_dtypes": tuple(launch.pointer_dtypes) + tuple(launch.workspace_dtypes)}
    partial = launch.replace(symbol=launch.partial_symbol, grid_factor="NSPLIT", **common)
    cc = dict(launch.combine_config)
    combine = launch.replace(symbol=launch.symbol, numels=tuple(kv for kv in launch.numels if kv[0] == "x"),
                             config=(("XBLOCK", cc["XBLOCK"]), ("NSPLIT", nsplit), ("num_warps", cc["num_warps"])),
                             **common)
    return partial, combine


class SplitLauncher:
    """Runs a split-outer reduction: partials into its workspaces ``[NSPLIT, xnumel]`` (one
    per reduction, arguments after the outputs: the program allocates them, see
    ``targets.base.Workspace``), then the ordered combine that writes the outputs."""

    def __init__(self, partial, combine, launch: TritonLaunch):
        self.partial, self.combine = partial, combine
        self.kind = getattr(partial, "kind", "")

    def __call__(self, *args):
        self.partial(*args)
        self.combine(*args)


class SequenceLauncher:
    """Runs the launches of one fxwrap kernel in order (``launch.parts``: a split scan's
    chunk totals, their scan, the chunks' scans), each with the kernel's arguments; the
    scratch they share is a workspace argument, allocated by the program."""

    def __init__(self, parts):
        self.parts = tuple(parts)
        self.kind = getattr(self.parts[0], "kind", "") if self.parts else ""

    def __call__(self, *args):
        for part in self.parts:
            part(*args)
