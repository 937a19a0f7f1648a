"""A convolution's epilogue in one pass: the bias, batch norm (inference) and the activation
after a convolution are one kernel, or the bias goes to the convolution call.

A device whose convolution adds its bias in a pass of its own (cuDNN: ATen's ``add_``)
declares ``capabilities()["convolution_bias"] == "epilogue"``: the program calls the
convolution without bias and the kernel after it adds the bias with the rest (here a CPU
device that declares it, so the rewrite runs on the C++ target); the stock ``cpu`` target
(oneDNN adds the bias inside) passes the bias to the call.  Either way no extern but the
convolution itself (and the matmuls of the linear layers) is left, and the numbers are
eager's.  Models: conv + bias + BN + ReLU, a ConvNeXt block (depthwise conv with bias,
LayerNorm over a channels-last permute, a residual), a squeeze-excitation block (1x1
convolutions with bias over the spatial mean, SiLU, sigmoid gate)."""
from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel
from fxwrap.targets.base import Target
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.targets.host.device import CpuDevice

aten = torch.ops.aten


class BiasEpilogueCpu(CpuDevice):
    """The CPU, declaring that its convolution adds the bias in a pass of its own."""

    def capabilities(self):
        return dataclasses.replace(super().capabilities(), convolution_bias="epilogue")


EPILOGUE = Target("cpu_bias_epilogue", "cpu", BiasEpilogueCpu(), CppEmitter)


def _bn(c):
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


class ConvBnAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), _bn(8)
        self.conv2 = nn.Conv2d(8, 6, 3, stride=2, padding=1)

    def forward(self, x):
        return F.relu6(self.conv2(F.relu(self.bn1(self.conv1(x)))))


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class SqueezeExcitation(nn.Module):
    def __init__(self, c=8, squeezed=4):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = _bn(c)
        self.fc1, self.fc2 = nn.Conv2d(c, squeezed, 1), nn.Conv2d(squeezed, c, 1)

    def forward(self, x):
        y = F.silu(self.bn(self.conv(x)))
        scale = torch.sigmoid(self.fc2(F.silu(self.fc1(F.adaptive_avg_pool2d(y, 1)))))
        return y * scale


MODELS = {"conv_bn_act": (ConvBnAct, 3), "convnext": (ConvNeXtBlock, 8), "squeeze_excitation": (SqueezeExcitation, 3)}
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=4e-2, atol=4e-2)}


def _lower_and_check(name, dtype, dynamic, target):
    cls, channels = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval().to(dtype)
    x = torch.randn(2, channels, 10, 9, dtype=dtype)
    with torch.no_grad():
        program = fxwrap.lower(model, x, dynamic=dynamic, target=target, options={"cache": False})
        for shape in [(2, channels, 10, 9), (3, channels, 13, 11)] if dynamic else [(2, channels, 10, 9)]:
            x = torch.randn(shape, dtype=dtype)
            torch.testing.assert_close(program.run(x), model(x), **TOL[dtype])
    return program


def _externs(program):
    return [line for line in program.lines if isinstance(line, CallExtern)]


# the linear layers' products, and size reads of a view
_PRODUCTS = {aten.mm.default, aten.addmm.default, aten.mm.out, aten.addmm.out, aten.bmm.out,
             aten.sym_storage_offset.default}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_bias_added_by_the_kernel_after_the_convolution(name, dtype, dynamic):
    program = _lower_and_check(name, dtype, dynamic, EPILOGUE)
    convs = [line for line in _externs(program) if line.op is aten.convolution.default]
    assert convs, program.code()
    biases = {line.args[2] for line in convs}
    assert biases == {None}, program.code()  # no bias reaches the call
    others = [line for line in _externs(program) if line.op is not aten.convolution.default
              and line.op not in _PRODUCTS]
    assert not others, program.code()  # no ATen add_ (nor anything else) after a convolution
    for conv in convs:  # the conv's result is read by a kernel that also reads the bias (C values)
        channels = conv.out.size[1]
        readers = [line for line in program.lines if isinstance(line, CallKernel) and conv.out in line.reads()]
        assert any(b is not conv.out and sympy.prod(b.size) == channels
                   for line in readers for b in line.reads()), program.code()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_stock_cpu_passes_the_bias_to_the_convolution(name):
    """oneDNN adds the bias inside the convolution: the ``cpu`` target keeps it in the call."""
    program = _lower_and_check(name, torch.float32, False, "cpu")
    convs = [line for line in _externs(program) if line.op is aten.convolution.default]
    with_bias = [line for line in convs if line.args[2] is not None]
    assert with_bias, program.code()
    others = [line for line in _externs(program) if line.op is not aten.convolution.default
              and line.op not in _PRODUCTS]
    assert not others, program.code()
