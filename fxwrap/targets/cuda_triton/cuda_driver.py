"""Launching compiled Triton kernels through the CUDA driver API, with no per-kernel build.

Triton 3.6 launches a compiled kernel through a C stub that it generates for the
kernel's signature and builds with the host C compiler the first time it sees that
signature (about a third of a second per signature, every cold compile).  fxwrap only
needs to launch its own kernels, whose parameters are plain device pointers and integer
sizes, so it loads the cubin and launches it itself through ``libcuda`` with ``ctypes``::

    cubin  --cuModuleLoadData-->  CUmodule  --cuModuleGetFunction-->  CUfunction
    launch: pack (data_ptr..., sizes..., 0 for Triton's scratch pointers) into one
            8-byte slot per parameter; cuLaunchKernel(f, grid, block, shared, stream, slots)

The parameter list comes from the kernel's own PTX ``.entry`` (so it matches whatever
Triton version built it); a kernel whose parameters are not ``n`` pointers and sizes
followed by Triton's (unused, size 0) scratch pointers, or that needs a launch feature
this path does not do (clusters, cooperative or programmatic-dependent launch), gets
``None`` from :func:`DriverKernel.load` and keeps Triton's own launcher.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import re
import struct
import sys
import threading

_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
_CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
_DEFAULT_SHARED_LIMIT = 48 * 1024
_CUDA_ERROR_INVALID_CONTEXT = 201

log = logging.getLogger("fxwrap")

_LIB_LOCK = threading.Lock()
_LIBS: list = []


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed; the message names the call, the kernel and the error."""


def _libraries():
    """``(cdll, pydll)`` views of libcuda: loads release the GIL (they can take
    milliseconds), launches keep it (a launch is shorter than a GIL round trip)."""
    with _LIB_LOCK:
        if not _LIBS:
            names = ["libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda"), "nvcuda.dll"]
            err = None
            for name in filter(None, names):
                try:
                    cdll, pydll = ctypes.CDLL(name), ctypes.PyDLL(name)
                    break
                except OSError as e:
                    err = e
            else:
                raise CudaDriverError(f"the CUDA driver library (libcuda) could not be loaded: {err}")
            # a second function object for the same symbol, kept free of argtypes
            pydll.cuLaunchKernel_noargtypes = pydll["cuLaunchKernel"]
            _LIBS.extend([cdll, pydll])
        return _LIBS[0], _LIBS[1]


def _check(result: int, call: str, kernel: str) -> None:
    if result == 0:
        return
    cdll, _ = _libraries()
    text = ctypes.c_char_p()
    cdll.cuGetErrorString(ctypes.c_int(result), ctypes.byref(text))
    name = text.value.decode() if text.value else "unknown error"
    raise CudaDriverError(f"{call} failed for kernel {kernel}: CUDA error {result} ({name})")


_PARAM = re.compile(r"\.param\s+\.(\w+)(\s+\.ptr)?")


def ptx_parameters(ptx: str, name: str) -> list[str] | None:
    """The PTX types of the parameters of entry ``name``, pointers starred
    (``['*u64', 'u32', ...]`` for ``.param .u64 .ptr .global ...``, ``.param .u32``)."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        return None
    return [("*" if ptr else "") + ty for ty, ptr in _PARAM.findall(m.group(1))]


_POINTER_TYPES = {"*u64", "*b64", "u64", "b64"}
_INT32_TYPES = {"u32", "b32", "s32"}
_INT64_TYPES = {"u64", "b64", "s64"}


def slot_format(ptx_types: list[str], npointers: int, nsizes: int) -> str | None:
    """``struct`` format packing one 8-byte slot per parameter, or ``None`` when the
    parameters are not ``npointers`` pointers, ``nsizes`` int32/int64 sizes and then
    only pointers (Triton's global and profile scratch)."""
    if len(ptx_types) < npointers + nsizes:
        return None
    fmt = ["<"]
    for i, ty in enumerate(ptx_types):
        if i < npointers or i >= npointers + nsizes:
            if ty not in _POINTER_TYPES:
                return None
            fmt.append("Q")
        elif ty in _INT32_TYPES:
            fmt.append("i4x")
        elif ty in _INT64_TYPES:
            fmt.append("q")
        else:
            return None
    return "".join(fmt)


class DriverKernel:
    """One compiled Triton kernel loaded into one device's primary context.

    What a launcher needs per call: ``pack(slots, 0, *pointers, *sizes)`` writes the
    arguments into parameter slots from :meth:`buffers` (``struct.error`` when a size
    does not fit its int32 parameter), then ``cu_launch(function, gx, 1, 1, threads,
    1, 1, shared, c_void_p(stream), params, None)``; a non-zero result goes to
    :meth:`check`.  A launcher keeps one ``buffers()`` pair per calling thread.
    ``cu_launch`` is called without ``argtypes`` (three times cheaper per call): every
    64-bit value is passed as a ``c_void_p``, the other arguments are ints below 2**31.
    """

    def __init__(self, name: str, function: int, module: int, types: list[str], npointers: int, nsizes: int,
                 threads: int, shared: int, device_index: int = 0):
        self.name = name
        self.device_index = device_index
        self.module = module
        self.function = ctypes.c_void_p(function)
        self.nslots = len(types)
        self.threads = threads
        self.shared = shared
        self.format = slot_format(types[:npointers + nsizes], npointers, nsizes)
        self.pack = struct.Struct(self.format).pack_into
        self.cu_launch = _libraries()[1].cuLaunchKernel_noargtypes

    def buffers(self):
        """Zeroed slots (the trailing scratch pointers stay NULL) and the pointer array."""
        n = max(self.nslots, 1)
        slots = (ctypes.c_uint64 * n)()
        base = ctypes.addressof(slots)
        params = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(self.nslots)])
        return slots, params

    def check(self, result: int) -> None:
        _check(result, "cuLaunchKernel", self.name)

    def recover(self, result: int) -> None:
        """After a failed launch: return if launching again can succeed (the calling
        thread had no current context -- a thread that never touched the CUDA runtime,
        such as autograd's device threads -- and now has the device's primary one),
        else raise the launch's error."""
        if result == _CUDA_ERROR_INVALID_CONTEXT and _make_primary_context_current(self.device_index):
            return
        self.check(result)

    @classmethod
    def load(cls, compiled, device_index: int, npointers: int, nsizes: int) -> "DriverKernel | None":
        """Load ``compiled`` (a Triton ``CompiledKernel`` for CUDA) or ``None`` when its
        parameters or launch options need Triton's own launcher."""
        try:
            _libraries()
        except CudaDriverError as e:  # no libcuda to call: Triton's launcher finds its own way
            log.info("fxwrap: kernel %s keeps Triton's launcher: %s", compiled.metadata.name, e)
            return None
        meta = compiled.metadata
        if (getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False)
                or getattr(meta, "launch_pdl", False)
                or getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0)
                or tuple(getattr(meta, "cluster_dims", (1, 1, 1)) or (1, 1, 1)) not in ((1, 1, 1), (1,), ())
                or getattr(meta, "tensordesc_meta", None)):
            return None
        cubin = compiled.asm.get("cubin") if hasattr(compiled.asm, "get") else None
        ptx = compiled.asm.get("ptx") if hasattr(compiled.asm, "get") else None
        if not isinstance(cubin, bytes) or not isinstance(ptx, str):
            return None
        types = ptx_parameters(ptx, meta.name)
        if types is None or slot_format(types, npointers, nsizes) is None:
            return None
        module, function = _load_cubin(cubin, meta.name, device_index, meta.shared, meta.num_warps * 32)
        return cls(meta.name, function, module, types, npointers, nsizes, meta.num_warps * 32, meta.shared,
                   device_index)

    def __del__(self):
        try:  # at interpreter exit module globals may already be gone: nothing to do then
            if self.module and not sys.is_finalizing():
                _libraries()[0].cuModuleUnload(ctypes.c_void_p(self.module))
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass


def _load_cubin(cubin: bytes, name: str, device_index: int, shared: int, threads: int) -> tuple[int, int]:
    """``(module, function)`` of ``name`` in ``cubin``, loaded into the primary context of
    ``device_index`` (pushed for the load and popped after: the calling thread's
    current context is unchanged)."""
    cdll, _ = _libraries()
    _check(cdll.cuInit(0), "cuInit", name)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    _check(cdll.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(device_index)), "cuDeviceGet", name)
    _check(cdll.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain", name)
    # the unsuffixed cuCtxPushCurrent/cuCtxPopCurrent are the pre-CUDA-4 entry points (floating
    # contexts only); cuda.h maps the names to the _v2 symbols
    _check(cdll.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent", name)
    try:
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        _check(cdll.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), "cuModuleLoadData", name)
        _check(cdll.cuModuleGetFunction(ctypes.byref(function), module, name.encode()),
               "cuModuleGetFunction", name)
        value = ctypes.c_int()
        _check(cdll.cuFuncGetAttribute(ctypes.byref(value), _CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function),
               "cuFuncGetAttribute", name)
        if threads > value.value:
            raise CudaDriverError(f"kernel {name} needs {threads} threads per block; the device allows "
                                  f"{value.value} with its register use (choose fewer warps)")
        if shared > _DEFAULT_SHARED_LIMIT:
            optin, static = ctypes.c_int(), ctypes.c_int()
            _check(cdll.cuDeviceGetAttribute(ctypes.byref(optin), _CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                             dev), "cuDeviceGetAttribute", name)
            if shared > optin.value:
                raise CudaDriverError(f"kernel {name} needs {shared} bytes of shared memory; the device "
                                      f"allows {optin.value} per block (choose smaller blocks)")
            _check(cdll.cuFuncGetAttribute(ctypes.byref(static), _CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
                   "cuFuncGetAttribute", name)
            _check(cdll.cuFuncSetAttribute(function, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           ctypes.c_int(optin.value - static.value)),
                   "cuFuncSetAttribute", name)
        return module.value, function.value
    finally:
        popped = ctypes.c_void_p()
        cdll.cuCtxPopCurrent_v2(ctypes.byref(popped))


def _make_primary_context_current(device_index: int) -> bool:
    """Make ``device_index``'s primary context current on this thread if no context is;
    ``True`` when it did."""
    cdll, _ = _libraries()
    ctx = ctypes.c_void_p()
    if cdll.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or ctx.value:
        return False
    dev = ctypes.c_int()
    if cdll.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(device_index)) != 0:
        return False
    if cdll.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0:
        return False
    return cdll.cuCtxSetCurrent(ctx) == 0


_THREAD = threading.local()


def ensure_thread_context() -> None:
    """Give the calling thread the current device's primary context if it has none
    (checked once per thread).  A thread the CUDA runtime has not used yet -- autograd's
    device threads -- has no current context; when a compiled backward graph's first
    CUDA work is a matrix product, cuBLAS then warns "no current CUDA context" before
    setting one itself.  What the ``cuda`` target runs calls this first."""
    if getattr(_THREAD, "ready", False):
        return
    _THREAD.ready = True
    import torch
    try:
        _make_primary_context_current(torch.cuda.current_device())
    except CudaDriverError:  # no libcuda to ask: the runtime and cuBLAS set one up themselves
        pass
