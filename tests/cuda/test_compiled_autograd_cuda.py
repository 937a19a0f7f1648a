"""CUDA graphs whose inputs do not name their device: a compiled-autograd backward (its
inputs one list of tensors) and a graph that makes its CUDA tensors itself.  Both compiled
for the CPU target before, and a C++ kernel read CUDA memory: the segfault of
``test_ddp_python_reducer_overlaps_gradient_all_reduces_with_backward[nccl]``."""
from __future__ import annotations

import pytest
import torch

import fxwrap
from shared_helpers import compiled_autograd_backward

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU case is "
                                "tests/null/test_input_devices.py)")


def test_compiled_autograd_backward_runs_on_the_cuda_target():
    programs = compiled_autograd_backward("cuda", 64)
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
