"""Max pooling's values are the ``maximum`` of the window (NaN-propagating, ATen's "greater or
NaN replaces"), not a select chain on comparisons: after an inlined batch norm + ReLU, g++ 12
vectorized no select chain ("control flow in loop": the ReLU's select becomes a branch and the
first comparison, which may trap, runs in one arm only).  The conv net of the suite at one
thread: two pooling kernels took 24 ms each (against 1 ms vectorized), the whole inference
1.54x Inductor's time."""
from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import DefineKernel
from emitter_helpers import unvectorized_simd_loops


def _bn_relu_pool(x, mean, var, weight, bias):
    return F.max_pool2d(F.relu(F.batch_norm(x, mean, var, weight, bias, False, 0.1, 1e-5)), 2)


def _bn_relu_pool_padded(x, mean, var, weight, bias):
    return F.max_pool2d(F.relu(F.batch_norm(x, mean, var, weight, bias, False, 0.1, 1e-5)), 3, 2, 1)


def _inputs(seed, nan=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 32, 14, 12, generator=g)
    if nan:  # a NaN wins its window; -inf and a negative bias are never the padding's 0
        x[0, 3, 4, 5] = float("nan")
        x[1, 7] = float("-inf")
    params = (torch.randn(32, generator=g), torch.rand(32, generator=g) + 0.5,
              torch.randn(32, generator=g), torch.randn(32, generator=g) - 1.0)
    return (x.to(memory_format=torch.channels_last), *params)


def _sources(program) -> list[str]:
    return [line.kernel.source for line in program.lines if isinstance(line, DefineKernel)]


@pytest.mark.parametrize("fn", [_bn_relu_pool, _bn_relu_pool_padded], ids=["2x2", "3x3_padded"])
def test_pool_after_relu_matches_eager(fn):
    program = fxwrap.lower(fn, *_inputs(0), options={"cache": False})
    for seed, nan in ((1, False), (2, True)):
        args = _inputs(seed, nan)
        out = program.run(*args)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: the vectorizer report needs it")
@pytest.mark.parametrize("fn", [_bn_relu_pool, _bn_relu_pool_padded], ids=["2x2", "3x3_padded"])
def test_pool_after_relu_vectorizes(fn, tmp_path):
    program = fxwrap.lower(fn, *_inputs(0), options={"cache": False})
    (source,) = _sources(program)
    body = source[source.index('extern "C"'):]
    assert "fx_max(" in body
    # every loop vectorizes but a padded window's border loop (masked loads: a lambda of its
    # own that opts out of if-conversion, FX_NO_IFCVT); the kernel itself does not opt out
    assert not body.startswith('extern "C" FX_NO_IFCVT'), body[:200]
    lines = source.splitlines()
    missed = [p for p, _ in unvectorized_simd_loops(source, tmp_path) if "FX_NO_IFCVT" not in lines[p - 2]]
    assert not missed, [lines[p - 2] for p in missed]


def _pool_relu_bn_grads(grad, x, indices, relu_out, centered):
    """A training step's max-pool, ReLU and batch-norm gradients over channels-last images: the
    pool's gradient, gated by the ReLU, summed per channel (a column reduction whose loads of
    ``grad`` and ``indices`` are masked by the window's position, a condition of the r vars)."""
    g = torch.ops.aten.max_pool2d_with_indices_backward(grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False, indices)
    g = torch.where(relu_out <= 0, 0.0, g)
    return g.sum((0, 2, 3)), (g * centered).sum((0, 2, 3)), g


def _grad_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 32, 16, 16, generator=g).to(memory_format=torch.channels_last)
    pooled, indices = F.max_pool2d(x, 2, return_indices=True)
    grad = torch.randn(pooled.shape, generator=g).to(memory_format=torch.channels_last)
    centered = torch.randn(x.shape, generator=g).to(memory_format=torch.channels_last)
    return grad, x, indices, x.relu(), centered


def test_pool_backward_column_sums_match_eager():
    program = fxwrap.lower(_pool_relu_bn_grads, *_grad_inputs(0), options={"cache": False})
    for seed in (1, 2):
        args = _grad_inputs(seed)
        for got, want in zip(program.run(*args), _pool_relu_bn_grads(*args)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: the vectorizer report needs it")
def test_pool_backward_column_sums_vectorize_inside_the_windows(tmp_path):
    program = fxwrap.lower(_pool_relu_bn_grads, *_grad_inputs(0), options={"cache": False})
    (source,) = [s for s in _sources(program) if "max_pool2d_with_indices_backward" in s.split('extern "C"')[0]]
    body = source[source.index('extern "C"'):]
    assert not body.startswith('extern "C" FX_NO_IFCVT'), body[:200]
    assert "else [&]() FX_NO_IFCVT {" in body
    lines = source.splitlines()
    missed = [p for p, _ in unvectorized_simd_loops(source, tmp_path) if "FX_NO_IFCVT" not in lines[p - 2]]
    assert not missed, [lines[p - 2] for p in missed]


def _pool_with_indices(x):  # a training forward's pooling: values and indices, stored by one kernel
    return F.max_pool2d(x, 2, return_indices=True)


def test_pool_with_indices_matches_eager():
    program = fxwrap.lower(_pool_with_indices, _inputs(0)[0], options={"cache": False})
    for seed, nan in ((1, False), (2, True)):
        x = _inputs(seed, nan)[0]
        for got, want in zip(program.run(x), _pool_with_indices(x)):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: the vectorizer report needs it")
def test_pool_with_indices_is_one_chain_and_vectorizes(tmp_path):
    """Values and indices come from one select chain (a ``maximum`` chain beside it for the
    values: g++ vectorized neither, the suite conv net's training forward pooling 12 -> 53 ms)."""
    program = fxwrap.lower(_pool_with_indices, _inputs(0)[0], options={"cache": False})
    (source,) = _sources(program)
    assert "fx_max(" not in source[source.index('extern "C"'):]
    assert not unvectorized_simd_loops(source, tmp_path)
