"""Aliasing: views of inputs at storage offsets the trace did not see, outputs that
alias inputs, ops returning lists of views, and backward graphs whose incoming
gradients are fresh tensors (not the traced views)."""
import pytest
import torch

from models_helpers import DYNAMIC, compile_fxwrap


def transpose_row(x):
    return x.t()[1] * 2 + x.t()[-1]


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_input_views_at_other_storage_offsets(dynamic):
    compiled = compile_fxwrap(transpose_row, "torch.compile", dynamic)
    big = torch.randn(64)
    # same size and strides, different storage offsets: one compiled program serves all
    for start in (0, 20, 7, 33):
        x = big[start:start + 12].view(3, 4)
        torch.testing.assert_close(compiled(x), transpose_row(x), rtol=1e-6, atol=1e-6)
    assert compiled.programs, "fxwrap compiled nothing"


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_unbind_backward(dynamic):
    def f(x):
        a, b, c = x.unbind(1)
        return a * b, c.sin()

    compiled = compile_fxwrap(f, "torch.compile", dynamic)
    for rows in (4, 6):
        x = torch.randn(rows, 3)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = compiled(xa), f(xb)
        torch.testing.assert_close(got, want)
        weights = [torch.randn_like(w) for w in want]
        sum((g * w).sum() for g, w in zip(got, weights)).backward()
        sum((v * w).sum() for v, w in zip(want, weights)).backward()
        torch.testing.assert_close(xa.grad, xb.grad)
    assert "backward" in compiled.kinds()


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_output_aliases_input(dynamic):
    def f(x):
        return x.view(-1), x[1:].t(), x.sum()

    compiled = compile_fxwrap(f, "torch.compile", dynamic)
    for shape in ((3, 4), (5, 2)):
        x = torch.randn(shape)
        xe = x.clone()
        flat, tail, total = compiled(x)
        flat_e, tail_e, total_e = f(xe)
        torch.testing.assert_close(total, total_e)
        assert flat.data_ptr() == x.data_ptr()  # a view, as in eager
        flat.mul_(3)  # writes through to the caller's tensor
        flat_e.mul_(3)
        torch.testing.assert_close(x, xe, rtol=0, atol=0)
        torch.testing.assert_close(tail, tail_e, rtol=0, atol=0)


@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_list_of_views(dynamic):
    def f(x):
        parts = torch.chunk(x * 2, 3, dim=1)
        left, right = torch.split(x, [1, x.shape[0] - 1], dim=0)
        return [p.sum(1) for p in parts] + [left + 1, right.relu()]

    compiled = compile_fxwrap(f, "torch.compile", dynamic)
    for shape in ((4, 6), (5, 9)):
        x = torch.randn(shape)
        got, want = compiled(x), f(x)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
