"""The reference ``npu`` device (``npu.cpp``), built with the host's C++ compiler on first use.

``import fxwrap_npu.device`` (or ``fxwrap_npu.device.load()``) builds the library once per
torch version and source (cached under ``$FXWRAP_NPU_CACHE`` or ``~/.cache/fxwrap-npu``,
written atomically, so processes may build at once), loads it into torch, renames
PrivateUse1 to ``npu`` and registers ``torch.npu``::

    >>> import torch, fxwrap_npu.device
    >>> x = torch.randn(4).to("npu")            # queued on the current npu stream
    >>> x.data_ptr() != 0 and fxwrap_npu.device.is_device_address(x.data_ptr())
    True
    >>> (x.cpu() == x.cpu()).all().item()     # a host read waits for the stream
    True

Only ``g++`` (or ``$CXX``) and torch's headers are needed: no ninja, no pybind11.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("npu.cpp")
_LOCK = threading.Lock()
_LIB: list[ctypes.CDLL] = []


def _build() -> Path:
    from torch.utils import cpp_extension
    text = SOURCE.read_bytes()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = hashlib.sha256(text + f"{torch.__version__} {abi} {sys.version}".encode()).hexdigest()[:16]
    folder = Path(os.environ.get("FXWRAP_NPU_CACHE", Path.home() / ".cache" / "fxwrap-npu"))
    out = folder / f"npu-{key}.so"
    if out.exists():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    cmd = [os.environ.get("CXX", "g++"), "-shared", "-fPIC", "-O1", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           *(f"-I{p}" for p in cpp_extension.include_paths()), str(SOURCE), "-o", tmp,
           *(f"-L{p}" for p in cpp_extension.library_paths()),
           *(f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()), "-lc10", "-ltorch", "-ltorch_cpu", "-lpthread"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"building the npu device failed ({cmd[0]}):\n{result.stderr[-4000:]}")
    os.replace(tmp, out)
    return out


def load() -> ctypes.CDLL:
    """The device's library, built and registered with torch once per process."""
    with _LOCK:
        if _LIB:
            return _LIB[0]
        path = _build()
        torch.ops.load_library(str(path))
        lib = ctypes.CDLL(str(path))
        lib.npu_last_error.restype = ctypes.c_char_p
        lib.npu_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64),
                                   ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
        lib.npu_sleep.argtypes = [ctypes.c_double]
        lib.npu_current_stream.argtypes, lib.npu_current_stream.restype = [ctypes.c_int], ctypes.c_int64
        lib.npu_synchronize.argtypes = [ctypes.c_int]
        lib.npu_host_syncs.restype = ctypes.c_int64
        lib.npu_is_device_address.argtypes, lib.npu_is_device_address.restype = [ctypes.c_uint64], ctypes.c_int
        torch.utils.rename_privateuse1_backend("npu")
        torch._register_device_module("npu", _module(lib))
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
        _LIB.append(lib)
        return lib


def _module(lib) -> types.ModuleType:
    """``torch.npu``: what torch and fxwrap ask a device module."""
    m = types.ModuleType("torch.npu")
    m.is_available = lambda: True
    m.device_count = lambda: 2
    m.current_device = lib.npu_current_device
    m.synchronize = lambda device=None: _check(lib, lib.npu_synchronize(_index(device)))
    m.current_stream = lambda device=None: torch.Stream(stream_id=lib.npu_current_stream(_index(device)),
                                                        device_index=_index(device), device_type=_PRIVATEUSE1)
    m._is_in_bad_fork = lambda: False
    m.set_device = lambda device: lib.npu_exchange_device(_index(device))
    m.device = _DeviceContext
    # random ops run on the CPU (the fallback), drawing from its default generator: the
    # device's RNG state is that generator's (torch.random.fork_rng saves and restores it)
    # (torch's own functions, not wrappers: dynamo knows them when a traced function saves
    # and restores RNG state, as OpInfo's freeze_rng_state does on an accelerator)
    m.get_rng_state, m.set_rng_state = torch.get_rng_state, torch.set_rng_state
    m.manual_seed = lambda seed: torch.default_generator.manual_seed(seed) and None
    m.manual_seed_all = lambda seed: None  # torch.manual_seed has seeded the CPU generator already
    m.initial_seed = torch.initial_seed
    m.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    m.is_autocast_enabled = lambda: False
    return m


class _DeviceContext:
    """``with torch.npu.device(1): ...``: the current device inside."""

    def __init__(self, device):
        self.index = _index(device)

    def __enter__(self):
        self.previous = load().npu_exchange_device(self.index)

    def __exit__(self, *exc):
        load().npu_exchange_device(self.previous)


_PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, what torch.Stream(device_type=...) takes


def _index(device) -> int:
    if device is None:
        return load().npu_current_device()
    return torch.device("npu", device).index if isinstance(device, int) else (torch.device(device).index or 0)


def host_syncs() -> int:
    """Host waits for the device so far (copies to the CPU, synchronize calls)."""
    return load().npu_host_syncs()


def is_device_address(address: int) -> bool:
    return bool(load().npu_is_device_address(address))


def sleep_on_stream(ms: float) -> None:
    """Queue ``ms`` milliseconds of nothing on the current stream (tests of asynchrony)."""
    lib = load()
    _check(lib, lib.npu_sleep(ms))


def launch(fn_address: int, handles: list[int], sizes: list[int]) -> None:
    """Queue the C kernel at ``fn_address`` (``void k(void *const *buffers, const int64_t
    *sizes)``) on the current stream; ``handles`` are tensors' ``data_ptr()``s."""
    lib = load()
    bufs = (ctypes.c_uint64 * max(len(handles), 1))(*handles)
    dims = (ctypes.c_int64 * max(len(sizes), 1))(*sizes)
    _check(lib, lib.npu_launch(fn_address, len(handles), bufs, len(sizes), dims))


def _check(lib, status: int) -> None:
    if status != 0:
        raise RuntimeError(f"npu: {lib.npu_last_error().decode()}")


load()
