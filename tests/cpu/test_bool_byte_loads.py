"""C++ kernels read bool elements as bytes into ``uint8_t`` locals: g++ 12 vectorizes no loop that
loads a ``bool`` and computes floats with it, nor one that selects on a hoisted ``bool`` local
beside ``fx_exp`` ("no vectype for stmt").  Attention's backward with dropout (BERT, GPT-2
training) is such a loop: its mask times the recomputed softmax, ``where(row all -inf, 0, p)``,
took 1.2 ms per layer at one thread for 262k elements, against well under half with the loop
vectorized."""
from __future__ import annotations

import re
import shutil

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import DefineKernel
from emitter_helpers import unvectorized_simd_loops


def _dropout_softmax_grad(grad, keep, empty_row, scores, row_max, row_sum):
    p = torch.where(empty_row, 0.0, torch.exp(scores - row_max) / row_sum)
    return grad * (keep.float() * 1.1111112) * p


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(16, 64, 128, generator=g)
    return (torch.randn(16, 64, 128, generator=g), torch.rand(16, 64, 128, generator=g) > 0.1,
            torch.rand(16, 64, 1, generator=g) > 0.8, scores, scores.amax(-1, keepdim=True),
            torch.rand(16, 64, 1, generator=g) + 1.0)


def _source(program) -> str:
    (source,) = [line.kernel.source for line in program.lines if isinstance(line, DefineKernel)]
    return source


def test_bool_inputs_read_as_bytes_and_numbers_match():
    program = fxwrap.lower(_dropout_softmax_grad, *_inputs(0), options={"cache": False})
    body = _source(program)
    body = body[body.index('extern "C"'):]
    assert "const bool tmp" not in body, body
    assert len(re.findall(r"const uint8_t tmp\d+ = \*\(const uint8_t\*\)&in_ptr\d+\[", body)) == 2, body
    for seed in (1, 2):
        args = _inputs(seed)
        out = program.run(*args)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, _dropout_softmax_grad(*args), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: the vectorizer report needs it")
def test_simd_loop_with_bool_inputs_vectorizes(tmp_path):
    program = fxwrap.lower(_dropout_softmax_grad, *_inputs(0), options={"cache": False})
    assert not unvectorized_simd_loops(_source(program), tmp_path)


def _softmax_stats(x):  # _safe_softmax's row pass: a float sum and an ``any`` in one loop
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e.sum(-1), (x != float("-inf")).any(-1), (x > 2.5).all(-1)


def _scores(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 128, generator=g)
    x[3] = float("-inf")                  # a fully masked row: any() false
    x[5, ::2] = float("-inf")
    x[7] = 3.0 + torch.rand(128, generator=g)  # all() true
    return x


def test_any_all_lanes_are_bytes_and_numbers_match(tmp_path):
    program = fxwrap.lower(_softmax_stats, _scores(0), options={"cache": False})
    sources = [line.kernel.source for line in program.lines if isinstance(line, DefineKernel)]
    lanes = [re.findall(r"\n\s*(\w+) (rd\d+_l\d+)\[16\];", s[s.index('extern "C"'):]) for s in sources]
    bool_lanes = [name for kernel in lanes for t, name in kernel if t == "bool"]
    byte_lanes = [name for kernel in lanes for t, name in kernel if t == "uint8_t"]
    assert not bool_lanes and len(byte_lanes) == 2, lanes
    for seed in (1, 2):
        x = _scores(seed)
        for got, want in zip(program.run(x), _softmax_stats(x)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
