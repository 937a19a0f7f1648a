"""CPU device interface."""
from __future__ import annotations

import os
import time

import torch

from fxwrap.runtime.launch_list import LaunchListCapture
from fxwrap.ir.capabilities import Capabilities
from fxwrap.targets.base import DeviceInterface
from fxwrap.targets.host.compiler import host_fingerprint


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

    def timing_clock(self) -> str:
        """``"thread cpu"`` at one thread (``torch.get_num_threads() == 1``), else ``"wall"``."""
        return "thread cpu" if torch.get_num_threads() == 1 else "wall"

    def timing_identity(self) -> str:
        """The CPU's model and feature flags (``host_fingerprint``: what ``-march=native`` builds
        for) and the core count: a template measured faster than the ATen call on one CPU may
        be slower on another (another ISA, another BLAS path)."""
        return f"{host_fingerprint()}\ncores {os.cpu_count() or 1}"

    def time_calls(self, run, n: int, device=None) -> float:
        """Seconds per call of ``run()``.  At one thread every kernel and ATen call runs on
        the calling thread, so its CPU time (``time.thread_time``) is the work done: the time
        it waits for a core on a loaded machine is not counted (a 2-core machine under a
        load of 10 stretched wall-clock samples 5x, unevenly between the candidates, and
        the template choice then took a GEMM template 12-40% slower than the ATen call).
        At more threads, wall time (the other threads' work is not on this clock)."""
        if torch.get_num_threads() != 1:
            return super().time_calls(run, n, device)
        start = time.thread_time()
        for _ in range(n):
            run()
        return (time.thread_time() - start) / n

    def graph_capture(self) -> LaunchListCapture:
        """Recordings are launch lists: the program's kernel and extern calls bound to their
        tensors (``fxwrap.runtime.launch_list``)."""
        return LaunchListCapture(self.device_type)
