"""Convolution nets trained on the GPU (cuDNN) under fxwrap's cuda target: the net of
tests/cpu/test_training_layout.py trained a few steps against eager, fp32 (TF32 off, both
sides) and bf16 autocast.  The cuda device asks for channels-last training pairs only where
the convolutions are float16/bfloat16 (``training_convolution_layout="channels_last_half"``):
cuDNN's float32 NHWC convolutions use TF32 by default and would move eager's float32
gradients by 2e-2 (benchmarks/conv_layout_error.py).  So the fp32 pair keeps the traced NCHW
layout and the bf16 autocast pair runs channels-last."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cpu"))
from test_training_layout import compiled_steps  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (cuDNN convolutions)")


def _conv_inputs_channels_last(programs) -> list[bool]:
    """For each convolution (and its backward) call: whether its input is channels-last."""
    from fxwrap.ir.lines import CallExtern
    found = []
    for p in programs:
        for ln in p.lines:
            if isinstance(ln, CallExtern) and "convolution" in str(ln.op):
                buf = ln.args[0] if "backward" not in str(ln.op) else ln.args[1]
                stride = [int(s) for s in buf.stride]
                found.append(len(stride) == 4 and stride[1] == 1 and stride[3] != 1)
    return found


def test_conv_training_fp32():
    torch._dynamo.reset()
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            programs = compiled_steps("cuda", steps=3, shape=(8, 3, 16, 16), device="cuda",
                                      fwd_tol=dict(rtol=1e-3, atol=1e-4), grad_tol=dict(rtol=1e-3, atol=1e-3))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
    kinds = {p.kind for p in programs}
    assert {"forward", "backward"} <= kinds
    convs = _conv_inputs_channels_last([p for p in programs if p.kind in ("forward", "backward")])
    assert convs and not any(convs)  # the traced (NCHW) layout, as the device asks


def test_conv_training_bf16_autocast():
    torch._dynamo.reset()
    programs = compiled_steps("cuda", steps=2, shape=(8, 3, 16, 16), device="cuda", autocast_dtype=torch.bfloat16,
                              fwd_tol=None, grad_tol=None)
    assert {"forward", "backward"} <= {p.kind for p in programs}
    convs = _conv_inputs_channels_last([p for p in programs if p.kind in ("forward", "backward")])
    assert convs and all(convs)  # bfloat16 convolutions: channels-last, as the device asks
