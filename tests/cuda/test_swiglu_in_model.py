"""Issue 27: the SwiGLU kernel (``silu(gate) * up``) of a Llama MLP block renders for ``cuda``
exactly as the same op compiled alone: the same body, the GPU planner's 1-D plan with
``XBLOCK=1024, num_warps=4``, int32 indices over contiguous ``[4, 512, 2816]`` bf16 buffers,
and 16-byte vector loads and stores on sm_90.  Rendered without a GPU
(``fxwrap.testing.offline_cuda``); the run-time side (in-place output, L2 state, the
profiler's rows) is measured by ``benchmarks/swiglu_in_model.py`` on the device."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxwrap.targets.cuda_triton.emitter import body_digest
from fxwrap.testing.offline_cuda import offline_programs
from test_reduction_plans import _ptx_loads

BF16 = torch.bfloat16
TOKENS, WIDTH, HIDDEN = (4, 512), 1024, 2816


class LlamaMlp(nn.Module):
    """HF Llama's MLP: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.up = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, WIDTH, bias=False)

    def forward(self, x):
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


def _swiglu_kernels(program):
    return [line.kernel for line in program.lines if type(line).__name__ == "DefineKernel"
            and "sigmoid" in line.kernel.source.split("@triton.jit")[0]]


@pytest.fixture(scope="module")
def kernels():
    torch.manual_seed(0)
    block = LlamaMlp().to(BF16).eval()
    x = torch.randn(*TOKENS, WIDTH, dtype=BF16)
    a, b = torch.randn(*TOKENS, HIDDEN, dtype=BF16), torch.randn(*TOKENS, HIDDEN, dtype=BF16)
    with torch.no_grad():
        (in_block,) = offline_programs(block, x)
        (alone,) = offline_programs(lambda g, u: F.silu(g) * u, a, b)
    (k_block,) = _swiglu_kernels(in_block)
    (k_alone,) = _swiglu_kernels(alone)
    return k_block, k_alone, in_block


def test_block_swiglu_is_the_standalone_kernel(kernels):
    k_block, k_alone, _ = kernels
    assert body_digest(k_block.source, k_block.launch) == body_digest(k_alone.source, k_alone.launch), \
        (k_block.source, k_alone.source)
    for k in (k_block, k_alone):
        assert k.launch.plan == "pointwise1d", k.launch.plan
        assert dict(k.launch.config) == {"XBLOCK": 1024, "num_warps": 4}, k.launch.config
        assert "plan: pointwise, 1-D, indices tl.int32" in k.source, k.source
        for ptr in ("in_ptr0", "in_ptr1", "out_ptr0"):  # contiguous buffers, no view offsets
            header = k.source.split(f"# {ptr}: ")[1].split("\n")[0]
            assert "bfloat16 size=(4, 512, 2816) stride=(1441792, 2816, 1)" in header, header


def test_block_swiglu_writes_over_the_gate_projection(kernels):
    """The run-time difference from the kernel alone: its output takes the dying gate
    projection's storage (the memory plan's in-place reuse), as Inductor's ``in_out_ptr0``."""
    k_block, _, program = kernels
    code = program.code()
    call = next(line for line in code.splitlines() if line.strip().startswith(k_block.name + "("))
    gate, _, out = [a.strip() for a in call.strip()[len(k_block.name) + 1:-1].split(",")]
    reuse = next(line for line in code.splitlines() if line.strip().startswith(out + " = "))
    assert "# reuse" in reuse, reuse
    view = next(line for line in code.splitlines() if line.strip().startswith(gate + " = "))
    assert reuse.split("as_strided(")[1].split(",")[0] == view.split("as_strided(")[1].split(",")[0], (reuse, view)


def test_block_swiglu_issues_16_byte_vectors(kernels, tmp_path):
    """sm_90 PTX of the in-block kernel (pointers 16-byte aligned, as the launcher assumes):
    every global load and store is a 16-byte vector."""
    k_block, _, _ = kernels
    source = type("Source", (), {"text": k_block.source})()
    types = {"in_ptr0": "*bf16", "in_ptr1": "*bf16", "out_ptr0": "*bf16"}
    loads = _ptx_loads(source, k_block.launch.symbol, dict(k_block.launch.config), types, tmp_path)
    assert len(loads) == 2 and all(ld.startswith("ld.global.v4") for ld in loads), loads
