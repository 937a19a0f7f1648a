"""Helpers shared by the end-to-end differential tests against eager PyTorch.

Every test compiles a model or function with fxwrap (``torch.compile(...,
backend="fxwrap")`` or ``fxwrap.compile(..., target="cpu")``), runs it on fresh
random inputs, and compares outputs, gradients and mutated inputs with an eager
run of an identical copy.  ``Compiled.programs`` records every fxwrap Program so a
test can check that fxwrap really ran (no silent fallback to eager).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest
import torch

import fxwrap

# float32 CPU tolerances: the decompositions and out= calls reassociate sums, so
# results differ from eager by rounding, never by more.
FWD_TOL = dict(rtol=1e-4, atol=1e-5)
GRAD_TOL = dict(rtol=1e-4, atol=1e-4)

ENTRIES = ["torch.compile", "fxwrap.compile"]
DYNAMIC = [pytest.param(False, id="static"), pytest.param(True, id="dynamic")]


@dataclass
class Compiled:
    """A compiled callable plus the fxwrap programs it produced so far."""

    fn: object
    programs: list = field(default_factory=list)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def kinds(self) -> list[str]:
        return [p.kind for p in self.programs]


def compile_fxwrap(fn, entry: str = "torch.compile", dynamic: bool = False, **options) -> Compiled:
    """``fn`` compiled by fxwrap through one of the two public entry points."""
    compiled = Compiled(None)
    options = dict(options, on_program=compiled.programs.append)
    if entry == "torch.compile":
        compiled.fn = torch.compile(fn, backend="fxwrap", dynamic=dynamic, options=options)
    elif entry == "fxwrap.compile":
        compiled.fn = fxwrap.compile(fn, target="cpu", dynamic=dynamic, options=options)
    else:
        raise ValueError(entry)
    return compiled


def twin(model: torch.nn.Module) -> torch.nn.Module:
    """An independent copy of ``model`` (parameters, buffers, train/eval mode)."""
    return copy.deepcopy(model)


def leaf(t: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    return t.detach().clone().requires_grad_(requires_grad)


def assert_same_training_step(model: torch.nn.Module, ref: torch.nn.Module, compiled,
                              x: torch.Tensor, fwd_tol=FWD_TOL, grad_tol=GRAD_TOL) -> None:
    """One forward + backward of ``compiled`` (wrapping ``model``) vs eager ``ref``.

    Compares the output, the input's grad, every parameter's grad and every buffer
    (batch-norm running stats) with eager.  The upstream gradient is random too.
    """
    xa, xb = leaf(x), leaf(x)
    out, expected = compiled(xa), ref(xb)
    torch.testing.assert_close(out, expected, **fwd_tol)
    grad_out = torch.randn_like(expected)
    out.backward(grad_out)
    expected.backward(grad_out)
    torch.testing.assert_close(xa.grad, xb.grad, **grad_tol, msg=lambda m: f"input grad: {m}")
    params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        q = params[name]
        assert (p.grad is None) == (q.grad is None), f"{name}: grad presence differs from eager"
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, **grad_tol, msg=lambda m, n=name: f"grad of {n}: {m}")
    buffers = dict(ref.named_buffers())
    for name, b in model.named_buffers():
        torch.testing.assert_close(b, buffers[name], **fwd_tol, msg=lambda m, n=name: f"buffer {n}: {m}")


def zero_grads(*models: torch.nn.Module) -> None:
    for m in models:
        m.zero_grad(set_to_none=True)
