"""Target ``beta`` (another device type) and decompositions for sin and exp."""
import torch
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import OtherDevice, target

aten = torch.ops.aten


def beta_sin(x):
    return torch.sin(x)


def beta_exp(x):
    return torch.exp(x)


@hookimpl
def fxwrap_targets():
    return [target("beta", device=OtherDevice())]


@hookimpl
def fxwrap_decompositions():  # fewer arguments than the spec: allowed
    return {aten.sin.default: beta_sin, aten.exp.default: beta_exp}
