"""Apple MPS device interface."""
from __future__ import annotations

import torch

from fxwrap.targets.base import DeviceInterface


class MpsDevice(DeviceInterface):
    """``MpsDevice().is_available()`` is True on Apple silicon with PyTorch's MPS backend."""

    device_type = "mps"

    def is_available(self) -> bool:
        return torch.backends.mps.is_available()

    def synchronize(self, device=None) -> None:
        if self.is_available():
            torch.mps.synchronize()

    def device_count(self) -> int:
        return 1 if self.is_available() else 0

    def capabilities(self) -> dict:
        return {"simd_width": 32, "float64": False}
