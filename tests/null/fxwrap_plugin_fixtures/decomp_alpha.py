"""Target ``alpha`` and decompositions that differ from decomp_beta's for sin."""
import torch
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import target

aten = torch.ops.aten


def alpha_sin(x):
    return torch.sin(x)


def alpha_cos(x):
    return torch.cos(x)


@hookimpl
def fxwrap_targets():
    return [target("alpha")]


@hookimpl
def fxwrap_decompositions(target):
    return {aten.sin.default: alpha_sin, aten.cos.default: alpha_cos}
