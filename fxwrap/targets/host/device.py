"""CPU device interface."""
from __future__ import annotations

import os

import torch

from fxwrap.runtime.launch_list import LaunchListCapture
from fxwrap.ir.capabilities import Capabilities
from fxwrap.targets.base import DeviceInterface


class CpuDevice(DeviceInterface):
    """``CpuDevice().capabilities() -> Capabilities(dtypes=("float64", ...), cores=8, ...)``."""

    device_type = "cpu"

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def capabilities(self) -> Capabilities:
        return Capabilities(
            dtypes=("float64", "float32", "bfloat16", "float16", "int64", "int32", "int16", "int8",
                    "uint8", "bool"),
            # oneDNN convolves NHWC fastest: graphs with 2-D convolutions (inference and training)
            # run channels-last (fxwrap.core.layout)
            convolution_layout="channels_last",
            training_convolution_layout="channels_last",
            cores=os.cpu_count() or 1,
            threads=torch.get_num_threads(),
        )

    def graph_capture(self) -> LaunchListCapture:
        """Recordings are launch lists: the program's kernel and extern calls bound to their
        tensors (``fxwrap.runtime.launch_list``)."""
        return LaunchListCapture()
