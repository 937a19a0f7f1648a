"""CUDA graphs whose inputs do not name their device: a compiled-autograd backward (its
inputs one list of tensors) and a graph that makes its CUDA tensors itself.  Both compiled
for the CPU target before, and a C++ kernel read CUDA memory: the segfault of
``test_ddp_python_reducer_overlaps_gradient_all_reduces_with_backward[nccl]``."""
from __future__ import annotations

import pytest
import torch

import fxwrap

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU case is "
                                "tests/null/test_input_devices.py)")


def test_compiled_autograd_backward_runs_on_the_cuda_target():
    from torch._dynamo import compiled_autograd
    torch.manual_seed(0)
    w = torch.randn(64, 64, device="cuda", requires_grad=True)
    x = torch.randn(32, 64, device="cuda")

    def loss(a):
        return ((a @ w).sin() * 2).relu().sum()

    programs = []
    backend = fxwrap.Backend(options={"on_program": programs.append})
    try:
        with compiled_autograd._enable(torch.compile(backend=backend)):
            torch.compile(loss, backend=backend)(x).backward()
        got = w.grad.clone()
    finally:
        torch._dynamo.reset()
    w.grad = None
    loss(x).backward()
    torch.testing.assert_close(got, w.grad)
    assert programs and {p.target.device_type for p in programs} == {"cuda"}, [p.target.name for p in programs]


def test_a_graph_that_makes_its_cuda_tensors_from_a_cpu_scalar_runs_on_cuda():
    def f(scale):
        return torch.arange(16, device="cuda", dtype=torch.float32).sin() * scale

    programs = []
    scale = torch.tensor(3.0)
    try:
        got = torch.compile(f, backend=fxwrap.Backend(options={"on_program": programs.append}))(scale)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, f(scale))
    assert programs and programs[0].target.device_type == "cuda"
