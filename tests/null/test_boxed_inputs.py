"""Compiled programs take their inputs in a list and release each at its last use
(``fxwrap.runtime.boxed``): AOTAutograd hands the backward its saved activations that
way, and a program called with ``*args`` would keep all of them alive to its end."""
from __future__ import annotations

import gc
import weakref

import torch

import fxwrap
from fxwrap.core import capture
from fxwrap.runtime.boxed import ListCall

_watched: list = []


@torch.fx.wrap
def _alive(after: torch.Tensor) -> torch.Tensor:
    """Which watched tensors are still alive (called once ``after`` is computed)."""
    gc.collect()
    return torch.tensor([ref() is not None for ref in _watched])


def _program(a, b):
    c = torch.sin(a) + 1  # the last read of ``a``
    seen = _alive(c)
    return c * b, seen


def _inputs():
    a, b = torch.randn(64), torch.randn(64)
    _watched[:] = [weakref.ref(a), weakref.ref(b)]
    return a, b


def test_list_call_releases_an_input_at_its_last_use():
    gm = torch.fx.symbolic_trace(_program)
    call = ListCall(gm)
    a, b = _inputs()
    expected = torch.sin(a) + 1
    expected = expected * b
    args = [a, b]
    del a, b
    out, seen = call.boxed(args)
    assert args == []  # the program took the list's references
    torch.testing.assert_close(out, expected)
    assert seen.tolist() == [False, True]  # ``a`` was gone before the program ended, ``b`` still read

    a, b = _inputs()
    out, seen = gm(*[a, b])  # the positional call: the caller keeps ``a`` alive
    assert seen.tolist() == [True, True]
    torch.testing.assert_close(out, (torch.sin(a) + 1) * b)


def test_list_call_positional_form_matches():
    gm = torch.fx.symbolic_trace(_program)
    a, b = torch.randn(8), torch.randn(8)
    out, _ = ListCall(gm)(a, b)
    torch.testing.assert_close(out, (torch.sin(a) + 1) * b)


def test_training_programs_are_called_boxed(monkeypatch):
    """Every program AOTAutograd gets from fxwrap under torch.compile takes the boxed
    list (make_boxed_func, which keeps the list alive, is never used)."""
    def refuse(fn):
        raise AssertionError(f"{fn} wrapped by make_boxed_func: its inputs live to the end of the call")
    monkeypatch.setattr(capture, "make_boxed_func", refuse)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    reference = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    reference.load_state_dict(model.state_dict())
    programs = []
    compiled = torch.compile(model, backend="fxwrap", options={"cache": False, "on_program": programs.append})
    x = torch.randn(16, 32)
    compiled(x).square().mean().backward()
    reference(x).square().mean().backward()
    assert {p.kind for p in programs} == {"forward", "backward"}
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), reference(x), rtol=1e-4, atol=1e-5)
    assert fxwrap  # the backend is registered by importing the package
