"""Apple MPS device interface."""
from __future__ import annotations

import torch

from fxwrap.ir.capabilities import Capabilities
from fxwrap.targets.base import DeviceInterface


class MpsDevice(DeviceInterface):
    """``MpsDevice().capabilities() -> Capabilities(simd_width=32, float64=False, ...)``.

    ``is_available()`` is True on Apple silicon with PyTorch's MPS backend.  MPS has
    one device and no user-visible streams (``current_stream()`` is None).
    """

    device_type = "mps"

    def is_available(self) -> bool:
        return bool(torch.backends.mps.is_available())

    def synchronize(self, device=None) -> None:
        if self.is_available():
            torch.mps.synchronize()

    def current_stream(self, device=None):
        return None

    def device_count(self) -> int:
        return 1 if self.is_available() else 0

    def capabilities(self) -> Capabilities:
        return Capabilities(
            dtypes=("float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"),
            max_threads_per_threadgroup=1024,
            simd_width=32,
            float64=False,
            threadgroup_memory_bytes=32768,
            shader_compiler="torch.mps.compile_shader",
        )
