"""Registers a lowering for a misspelled target name (``cpuu``)."""
import torch
from fxwrap import hookimpl


@hookimpl
def fxwrap_lowerings(registry, target):
    registry.register(torch.ops.aten.relu.default, lambda ctx, x: None, target="cpuu")
