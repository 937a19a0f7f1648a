"""In-place mutation of inputs: the caller's tensors must change exactly as in eager."""
import pytest
import torch

from models_helpers import DYNAMIC, ENTRIES, compile_fxwrap


def add_then_double(x):
    x.add_(1)
    return x * 2


def mutate_slice_and_other(x, y):
    x[:, 0].mul_(3)
    y.sub_(x.sum())
    return (x + y).relu()


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("entry", ENTRIES)
def test_add_inplace_then_double(entry, dynamic):
    compiled = compile_fxwrap(add_then_double, entry, dynamic)
    for shape in ((5, 4), (3, 7)):
        x = torch.randn(shape)
        x_before, x_eager = x.clone(), x.clone()
        out = compiled(x)
        expected = add_then_double(x_eager)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        torch.testing.assert_close(x, x_eager, rtol=0, atol=0)  # the caller's x was mutated...
        torch.testing.assert_close(x, x_before + 1, rtol=0, atol=0)  # ...exactly once
    assert compiled.programs, "fxwrap compiled nothing"


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_mutate_view_of_input_and_second_input(dynamic):
    compiled = compile_fxwrap(mutate_slice_and_other, "torch.compile", dynamic)
    for shape in ((4, 5), (6, 3)):
        x, y = torch.randn(shape), torch.randn(shape)
        xe, ye = x.clone(), y.clone()
        out = compiled(x, y)
        expected = mutate_slice_and_other(xe, ye)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x, xe, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y, ye, rtol=1e-5, atol=1e-5)
    assert compiled.programs, "fxwrap compiled nothing"


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_inplace_on_noncontiguous_input(dynamic):
    def f(x):
        x.mul_(2).add_(0.5)
        return x.sum(0)

    compiled = compile_fxwrap(f, "torch.compile", dynamic)
    for shape in ((6, 4), (5, 9)):
        base = torch.randn(shape)
        x, xe = base.t(), base.clone().t()  # transposed views of their own storages
        torch.testing.assert_close(compiled(x), f(xe), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(base, xe.t(), rtol=0, atol=0)
