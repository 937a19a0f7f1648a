"""fxwrap's ``npu`` target, written as a vendor would: the C99 dialect's kernels, launched
through the device's runtime on the current stream.

A launch hands the runtime the tensors' ``data_ptr()``s, which are device handles; the
host never reads them.  The runtime turns them into addresses when the kernel runs, on
the stream's worker thread, after the work queued before it::

    fxwrap_pointwise_0(in0, out0, s0)   ->   npu_launch(fn, [in0.data_ptr(), out0.data_ptr()], [s0])

Buffers come from the device's allocator (``torch.empty(..., device="npu")``), externs
are its ATen kernels (most run through its CPU fallback), ``reduce-overhead`` records a
launch list of npu tensors, and ``fxwrap.profile`` times with the device's events.
"""
from __future__ import annotations

import ctypes

import torch

import fxwrap
from fxwrap.targets.host.loader import load_library
from fxwrap_c99.emitter import C99Emitter, _compiler


def _device():
    import fxwrap_npu.device as device  # built and registered on first use, not at plugin load
    device.load()
    return device


class NpuDevice(fxwrap.DeviceInterface):
    """``NpuDevice().device_type == "npu"``: the reference device's streams, events and
    synchronize, asked by fxwrap wherever it waits for or times the device."""

    device_type = "npu"

    def is_available(self) -> bool:
        return _device() is not None

    def device_count(self) -> int:
        return torch.npu.device_count() if self.is_available() else 0

    def synchronize(self, device=None) -> None:
        torch.npu.synchronize(device)

    def current_stream(self, device=None):
        return torch.npu.current_stream(device)

    def timing_event(self, device=None):
        return torch.Event(device="npu", enable_timing=True)

    def graph_capture(self):
        return fxwrap.LaunchListCapture("npu")


class NpuEmitter(C99Emitter):
    """``NpuEmitter(target).render(kernel)`` is the C99 dialect's source; ``load(source)``
    returns ``launcher(in0, ..., out0, ..., s0, ...)``, which queues the kernel on the
    current npu stream and returns at once."""

    def load(self, source: fxwrap.KernelSource):
        fn = getattr(load_library(_compiler().compile(source.text)), source.launch.symbol)
        address = ctypes.cast(fn, ctypes.c_void_p).value
        pointers = source.launch.pointers
        device = _device()

        def launch(*args):
            device.launch(address, [t.data_ptr() for t in args[:pointers]], [int(s) for s in args[pointers:]])
        return launch
