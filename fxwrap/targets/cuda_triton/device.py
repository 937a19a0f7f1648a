"""CUDA device interface."""
from __future__ import annotations

import torch

from fxwrap.targets.base import DeviceInterface


class CudaDevice(DeviceInterface):
    """``CudaDevice().capabilities() -> {"name": "NVIDIA H200", "warp_size": 32, ...}``."""

    device_type = "cuda"

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def synchronize(self, device=None) -> None:
        torch.cuda.synchronize(device)

    def current_stream(self, device=None):
        return torch.cuda.current_stream(device)

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def capabilities(self) -> dict:
        if not self.is_available():
            return {}
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {"name": props.name, "capability": (props.major, props.minor),
                "multiprocessors": props.multi_processor_count,
                "warp_size": getattr(props, "warp_size", 32),
                "memory_bytes": props.total_memory}
