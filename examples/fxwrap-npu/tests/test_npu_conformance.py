"""fxwrap's conformance kit on the npu target, with inputs and parameters on the device:
``python -m pytest -ra examples/fxwrap-npu/tests/test_npu_conformance.py``.

Kernels are the C99 dialect's (no 16-bit float: bf16 and fp16 ops run as the device's
ATen kernels, numbers still compared with eager).
"""
import pytest
import torch

from fxwrap.testing import ConformanceSuite, Unsupported

device = pytest.importorskip("fxwrap_npu.device", reason="the npu device builds with g++ and torch's headers")


class TestNpuConformance(ConformanceSuite):
    target = "npu"
    unsupported = [Unsupported("C99 kernels have no 16-bit float: bf16 runs as ATen externs", dtype=torch.bfloat16),
                   Unsupported("C99 kernels have no 16-bit float: fp16 runs as ATen externs", dtype=torch.float16)]

    def delay_stream(self, ms):
        device.sleep_on_stream(ms)
