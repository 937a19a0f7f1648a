"""No target; decomposes sin differently again, and exp exactly as decomp_beta."""
import torch
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import decomp_beta

aten = torch.ops.aten


def gamma_sin(x):
    return torch.sin(x)


@hookimpl
def fxwrap_decompositions(target):
    return {aten.sin.default: gamma_sin, aten.exp.default: decomp_beta.beta_exp}
