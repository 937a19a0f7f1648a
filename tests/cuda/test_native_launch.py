"""The C launch binding of the cuda target (``targets/cuda_triton/native_launch.py``): what it
hands ``cuLaunchKernel`` and what it declines to the Python path.  Everywhere: a recording
``cuLaunchKernel`` (a ctypes callback) stands for the driver's, so the binding is built and
called with CPU tensors; on a GPU: a kernel launched through it matches eager."""
from __future__ import annotations

import ctypes
import types

import pytest
import torch

from fxwrap.targets.cuda_triton.native_launch import native_launch, size_kinds
from fxwrap.targets.host import trampoline

pytestmark = pytest.mark.skipif(not trampoline.has_data_ptr_read(),
                                reason="this torch exports no tensor data-pointer read for C bindings")

_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                           ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class _Recorder:
    """A driver whose ``cuLaunchKernel`` records each launch (or returns the queued errors)."""

    def __init__(self, nslots, fmt):
        self.launches, self.results, self.nslots, self.format = [], [], nslots, fmt

        def launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            if self.results:
                return self.results.pop(0)
            raw = [ctypes.c_uint64.from_address(params[i]).value for i in range(self.nslots)]
            self.launches.append({"function": function, "grid": (gx, gy, gz), "block": (bx, by, bz),
                                  "shared": shared, "stream": stream, "slots": raw})
            return 0
        self.cu_launch = _LAUNCH(launch)
        self.function, self.threads, self.shared, self.device_index = ctypes.c_void_p(0xABC), 128, 512, 0


def _native(recorder, nsizes=1, grid=0, chains=()):
    fallen = []
    native = native_launch(recorder, recorder.format, 2, nsizes, grid, lambda *sizes: (sizes[0] + 127) // 128,
                           chains, lambda *args: fallen.append(args), lambda index: 0x5000 + index)
    assert native is not None, "the binding did not build"
    return native, fallen


def test_size_kinds_come_from_the_slot_format():
    assert size_kinds("<QQi4xQ", 2, 1) == b"i"
    assert size_kinds("<QQqi4xQ", 2, 2) == b"qi"
    assert size_kinds("<Qi4x", 2, 0) is None          # a size where a pointer goes


def test_a_plain_launch_packs_pointers_sizes_and_null_scratch():
    rec = _Recorder(4, "<QQi4xQ")
    native, fallen = _native(rec)
    a, o = torch.randn(1000), torch.empty(1000)
    assert native(a, o, 1000) is None
    (recorded,) = rec.launches
    assert recorded["grid"] == (8, 1, 1) and recorded["block"] == (128, 1, 1) and recorded["shared"] == 512
    assert recorded["function"] == 0xABC and recorded["stream"] == 0x5000
    assert recorded["slots"][:2] == [a.data_ptr(), o.data_ptr()] and recorded["slots"][3] == 0
    assert recorded["slots"][2] & 0xFFFFFFFF == 1000                  # int32 in its 8-byte slot
    native(a, o, 0)                                                  # an empty grid launches nothing
    native(torch.nn.Parameter(a), o, 5)                              # a parameter is a tensor
    assert len(rec.launches) == 2 and rec.launches[1]["grid"] == (1, 1, 1) and not fallen


def test_int64_sizes_and_a_fixed_grid():
    rec = _Recorder(3, "<QQq")
    native, fallen = _native(rec, grid=7)
    a, o = torch.randn(64), torch.empty(64)
    native(a, o, 1 << 40)
    assert rec.launches[0]["grid"] == (7, 1, 1) and rec.launches[0]["slots"][2] == 1 << 40 and not fallen


def test_what_is_not_plain_goes_to_the_python_path():
    rec = _Recorder(4, "<QQi4xQ")
    native, fallen = _native(rec)
    a, o = torch.randn(1001), torch.empty(1001)
    native(a[1:], o[1:], 1000)                # 4-byte offset: the unaligned variants are Python's
    native(a, o, 1 << 31)                     # past the int32 size parameter
    native(a, 3, 1000)                        # not a tensor
    native(a, o, 1000.0)                      # not an int
    native(a, o)                              # a missing argument
    rec.results.append(201)                   # the driver refuses (no context): Python recovers
    native(a, o, 1000)
    assert len(fallen) == 6 and not rec.launches
    hooked = types.SimpleNamespace(calls=[print])   # a Triton launch hook with a call: a profiler
    native, fallen = _native(rec, chains=(hooked, types.SimpleNamespace(calls=[])))
    native(a, o, 1000)
    assert len(fallen) == 1 and not rec.launches
    hooked.calls.clear()
    native(a, o, 1000)
    assert len(fallen) == 1 and len(rec.launches) == 1
