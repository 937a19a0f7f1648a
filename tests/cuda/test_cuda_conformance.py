"""The conformance kit (``fxwrap.testing``) on the ``cuda`` target: Triton kernels on
a GPU, compared with eager on the CPU.  Without a GPU this module is skipped (the
``triton-interpret`` run of the kit is in tests/conformance)."""
import pytest
import torch

from fxwrap.testing import ConformanceSuite

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class TestCudaConformance(ConformanceSuite):
    target = "cuda"

    def delay_stream(self, ms):
        torch.cuda._sleep(int(ms * 2_000_000))  # cycles: about ms milliseconds at 2 GHz
