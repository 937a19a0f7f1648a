"""Target ``externs_cpu`` (CPU, every op an extern call, chosen only by name) that
decomposes tanh through sigmoid, so the decomposition shows in the program."""
import torch
from fxwrap import KernelEmitter, Target, WrapperCodegen, hookimpl
from fxwrap.targets.host.device import CpuDevice

aten = torch.ops.aten


def tanh_by_sigmoid(x):
    return 2 * torch.sigmoid(2 * x) - 1


@hookimpl
def fxwrap_targets():
    return [Target("externs_cpu", "cpu", CpuDevice(), KernelEmitter, WrapperCodegen, priority=-100)]


@hookimpl
def fxwrap_decompositions(target):
    return {aten.tanh.default: tanh_by_sigmoid} if target.name == "externs_cpu" else {}
