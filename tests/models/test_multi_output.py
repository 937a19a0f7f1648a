"""Ops with several outputs: topk (values and indices), max(x, dim), var_mean, ..."""
import pytest
import torch

from models_helpers import DYNAMIC, compile_fxwrap

TOL = dict(rtol=1e-5, atol=1e-5)


def _check(fn, *shapes, dynamic, grad=True):
    compiled = compile_fxwrap(fn, "torch.compile", dynamic)
    for shape in shapes:
        x = torch.randn(shape)
        xa, xb = x.clone().requires_grad_(grad), x.clone().requires_grad_(grad)
        got, want = compiled(xa), fn(xb)
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **TOL)
        if grad:
            weights = [torch.randn_like(w) for w in want if w.is_floating_point()]
            sum((g * c).sum() for g, c in zip([g for g in got if g.is_floating_point()], weights)).backward()
            sum((w * c).sum() for w, c in zip([w for w in want if w.is_floating_point()], weights)).backward()
            torch.testing.assert_close(xa.grad, xb.grad, **TOL)
    assert compiled.programs, "fxwrap compiled nothing"


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_topk(dynamic):
    def f(x):
        values, indices = torch.topk(x, 3, dim=-1)
        return values * 2, indices
    _check(f, (6, 10), (4, 9), dynamic=dynamic)


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_max_dim(dynamic):
    def f(x):
        m = torch.max(x, dim=1)
        return m.values, m.indices, torch.min(x, dim=0, keepdim=True).values
    _check(f, (5, 7), (8, 3), dynamic=dynamic)


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_var_mean(dynamic):
    def f(x):
        var, mean = torch.var_mean(x, dim=-1, correction=1)
        return var, mean, (x - mean.unsqueeze(-1)) / (var.unsqueeze(-1) + 1e-5).sqrt()
    _check(f, (4, 16), (6, 11), dynamic=dynamic)


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_sort_and_split(dynamic):
    def f(x):
        values, indices = torch.sort(x, dim=-1, descending=True)
        a, b = values.split([2, values.shape[-1] - 2], dim=-1)
        return a.sum(-1), b * 3, indices, *torch.unbind(x[:2], 0)
    _check(f, (4, 6), (3, 9), dynamic=dynamic)
