"""The convolution's bias in the Triton kernel after it (``capabilities()["convolution_bias"]
== "epilogue"``, what the ``cuda`` device declares: cuDNN would add it in an ATen ``add_``
of its own).  On a GPU the ``cuda`` target itself; under the interpreter a CPU device that
declares the same.  Each convolution is called without bias, the kernel reading its result
reads the bias, no other extern runs, and the numbers are eager's (fp32, bf16, static and
dynamic)."""
from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel
from fxwrap.targets.base import DirectCallWrapper, Target
from fxwrap.targets.cuda_triton.emitter import TritonEmitter
from fxwrap.targets.host.device import CpuDevice
from triton_helpers import DEVICE, GPU, TARGET, TOL

aten = torch.ops.aten


class BiasEpilogueCpu(CpuDevice):
    """The CPU, declaring that its convolution adds the bias in a pass of its own (as cuDNN's)."""

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), convolution_bias="epilogue")


EPILOGUE = TARGET if GPU else Target("triton_interpret_bias_epilogue", "cpu", BiasEpilogueCpu(), TritonEmitter,
                                     DirectCallWrapper, options={"interpret": True}, priority=-3)
_NOT_AFTER_CONV = {aten.mm.default, aten.addmm.default, aten.mm.out, aten.addmm.out, aten.sym_storage_offset.default}


class ConvNeXtish(nn.Module):
    """conv + bias + BN + hardtanh (relu6); depthwise conv + bias, LayerNorm over a permute."""

    def __init__(self, c=6):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c)
        self.dw, self.norm = nn.Conv2d(c, c, 5, padding=2, groups=c), nn.LayerNorm(c)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = F.relu6(self.bn(self.conv(x)))
        return y + self.norm(self.dw(y).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bias_added_by_the_triton_kernel_after_the_convolution(dtype, dynamic):
    torch.manual_seed(0)
    model = ConvNeXtish().eval().to(DEVICE, dtype)
    x = torch.randn(2, 3, 8, 7, device=DEVICE, dtype=dtype)
    with torch.no_grad():
        program = fxwrap.lower(model, x, dynamic=dynamic, target=EPILOGUE, options={"cache": False})
        for shape in [(2, 3, 8, 7), (3, 3, 9, 10)] if dynamic else [(2, 3, 8, 7)]:
            x = torch.randn(shape, device=DEVICE, dtype=dtype)
            want = model(x)  # bf16: LayerNorm's output near 0 after two bf16 roundings
            tol = TOL[dtype] if dtype is torch.float32 else dict(rtol=4e-2, atol=4e-2)
            torch.testing.assert_close(program.run(x), want, **tol)
    externs = [line for line in program.lines if isinstance(line, CallExtern)]
    convs = [line for line in externs if line.op is aten.convolution.default]
    assert len(convs) == 2 and {line.args[2] for line in convs} == {None}, program.code()
    assert not [line for line in externs if line.op not in _NOT_AFTER_CONV and line not in convs], program.code()
    for conv in convs:
        readers = [line for line in program.lines if isinstance(line, CallKernel) and conv.out in line.reads()]
        assert any(b is not conv.out and sympy.prod(b.size) == conv.out.size[1]
                   for line in readers for b in line.reads()), program.code()
