"""Lowers ``aten.sin`` (the packet: every overload) to ``cos`` on target ``cpu`` only.

A rule no built-in has, so a compile that gives ``cos`` numbers ran this plugin's rule.
"""
import torch
from fxwrap import hookimpl

aten = torch.ops.aten
calls = []  # target names fxwrap_lowerings was called for


def sin_as_cos(ctx, x):
    return ctx.pointwise("cos", x)


@hookimpl
def fxwrap_lowerings(registry, target):
    calls.append(target.name)
    if target.name == "cpu":
        registry.register(aten.sin, sin_as_cos, target="cpu")
