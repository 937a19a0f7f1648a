"""Rolls and shifted-window partitions in Triton kernels with no index check: their
``(arange + k) % n`` indices are provably in range (``core/rules/indexing._proven``), so
no ``check_index_bounds`` extern (interpreter, CPU tensors) and no ``_fx_index_check``
device assert (GPU: ``capabilities()["index_checks"] == "in_kernel"``), no index tensor
stored, one kernel.  Numbers against eager, negative shifts, several dims, static and
dynamic."""
from __future__ import annotations

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel
from fxwrap.runtime.checks import check_index_bounds
from triton_helpers import DEVICE, TARGET


def window_partition(x):
    B, H, W, C = x.shape
    x = torch.roll(x, shifts=(-2, 3), dims=(1, 2))
    x = x.view(B, H // 4, 4, W // 4, 4, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, 16, C) * 0.5


FUNCTIONS = {"roll": lambda x: torch.roll(x, shifts=(-3, 7), dims=(2, 1)) + 1, "window_partition": window_partition}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_roll_without_index_checks(name, dynamic):
    fn, programs = FUNCTIONS[name], []
    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=dynamic,
                             backend=fxwrap.Backend(TARGET, {"on_program": programs.append, "cache": False}))
    for shape in [(2, 8, 12, 3), (1, 12, 16, 5)] if dynamic else [(2, 8, 12, 3)]:
        x = torch.randn(shape, device=DEVICE)
        torch.testing.assert_close(compiled(x), fn(x))
    assert programs
    for program in programs:
        externs = [ln for ln in program.lines if isinstance(ln, CallExtern)]
        assert not [ln for ln in externs if ln.op is check_index_bounds], program.code()
        kernels = [ln for ln in program.lines if isinstance(ln, CallKernel)]
        assert len(kernels) == 1, program.code()
        assert "_fx_index_check" not in kernels[0].kernel.source and "device_assert" not in kernels[0].kernel.source
