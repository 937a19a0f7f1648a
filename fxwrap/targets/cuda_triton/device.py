"""CUDA device interface."""
from __future__ import annotations

import torch

from fxwrap.runtime.cuda_capture import CudaGraphCapture
from fxwrap.ir.capabilities import Capabilities
from fxwrap.targets.base import DeviceInterface


class CudaDevice(DeviceInterface):
    """``CudaDevice().capabilities() -> Capabilities(name="NVIDIA H200", warp_size=32, ...)``.

    Every method is safe to call without a GPU: ``is_available()`` is False,
    ``device_count()`` 0, ``capabilities()`` ``Capabilities()``, ``current_stream()`` None and
    ``synchronize()`` a no-op.
    """

    device_type = "cuda"

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def synchronize(self, device=None) -> None:
        if self.is_available():
            torch.cuda.synchronize(device)

    def timing_event(self, device=None):
        return torch.cuda.Event(enable_timing=True) if self.is_available() else None

    def current_stream(self, device=None):
        if not self.is_available():
            return None
        return torch.cuda.current_stream(device)

    def device_count(self) -> int:
        return torch.cuda.device_count() if self.is_available() else 0

    def graph_capture(self) -> CudaGraphCapture:
        """Recordings are ``torch.cuda.CUDAGraph``s (``fxwrap.runtime.cuda_capture``)."""
        return CudaGraphCapture()

    #: GPU cycles the device spins per timed call before the timing starts: the host
    #: queues the calls meanwhile, so the events time the kernels back to back, not the
    #: host's launch cost (how Triton's ``do_bench`` times too)
    SPIN_CYCLES_PER_CALL = 200_000

    def fill_queue(self, n: int, device=None) -> None:
        torch.cuda._sleep(min(n, 100) * self.SPIN_CYCLES_PER_CALL)

    def capabilities(self, device=None) -> Capabilities:
        if not self.is_available():
            return Capabilities()
        index = torch.cuda.current_device() if device is None else torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        major, minor = props.major, props.minor
        dtypes = ["float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"]
        if major >= 8:
            dtypes.insert(2, "bfloat16")
        return Capabilities(
            dtypes=tuple(dtypes),
            convolution_layout="channels_last",  # cuDNN: NHWC, no transposes around a conv
            # training channels-last only for float16/bfloat16 convolutions (AMP): cuDNN's
            # float32 NHWC algorithms use TF32 by default, and eager's NHWC gradients are then
            # 2e-2 off its NCHW ones (H100, 2026-11-27, benchmarks/conv_layout_error.py: fxwrap's
            # NHWC gradients equal eager's NHWC ones; with TF32 off every layout is within 1e-7)
            training_convolution_layout="channels_last_half",
            # gathers check their index values inside the kernel (tl.device_assert), not
            # by ATen calls before it (fxwrap.core.rules.indexing._checked)
            index_checks="in_kernel",
            # cuDNN's convolution adds its bias in an ATen add_ of its own: the kernel after
            # the convolution adds it instead (fxwrap.core.convolution_bias)
            convolution_bias="epilogue",
            # cuBLAS's fast GEMM kernels want 16-byte leading dimensions: a product with
            # an odd column count computes padded rows (fxwrap.core.matmul_padding)
            matmul_alignment_bytes=16,
            name=props.name,
            capability=(major, minor),
            kernel_language="triton",
            multiprocessors=props.multi_processor_count,
            warp_size=getattr(props, "warp_size", 32),
            memory_bytes=props.total_memory,
            max_threads_per_block=getattr(props, "max_threads_per_block", 1024),
            shared_memory_per_block=getattr(props, "shared_memory_per_block_optin",
                                            getattr(props, "shared_memory_per_block", None)),
            l2_cache_bytes=getattr(props, "L2_cache_size", None),
        )
