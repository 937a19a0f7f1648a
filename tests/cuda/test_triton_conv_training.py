"""Channels-last convolutions in training graphs on the GPU (cuDNN): the net of
tests/cpu/test_training_layout.py trained a few steps under fxwrap's cuda target against
eager, fp32 (TF32 off, both sides) and bf16 autocast, with both programs channels-last.
CUDA only: the CPU test runs the triton-interpret target."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cpu"))
from test_training_layout import assert_channels_last_programs, compiled_steps  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (cuDNN convolutions)")


@pytest.fixture
def no_tf32():
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_conv_training_channels_last_fp32(no_tf32):
    torch._dynamo.reset()
    programs = compiled_steps("cuda", steps=3, shape=(8, 3, 16, 16), device="cuda",
                              fwd_tol=dict(rtol=1e-3, atol=1e-4), grad_tol=dict(rtol=1e-3, atol=1e-3))
    assert_channels_last_programs(programs)


def test_conv_training_channels_last_bf16_autocast():
    torch._dynamo.reset()
    programs = compiled_steps("cuda", steps=2, shape=(8, 3, 16, 16), device="cuda", autocast_dtype=torch.bfloat16,
                              fwd_tol=None, grad_tol=None)
    assert_channels_last_programs(programs)
