"""The Triton GEMM template (``fxwrap.targets.cuda_triton.gemm``): hand-built template
kernels (a product and its epilogue) against eager, on the GPU or under Triton's CPU
interpreter (small sizes: the interpreter runs every program in Python)."""
from __future__ import annotations

import pytest
import sympy
import torch

from triton_helpers import DEVICE, GPU, TOL, buf, const, emitter, kernel, ld, op, s0, x0, x1, x2
from fxwrap.core.ir import OpCode, Store, load_buffer
from fxwrap.targets.cuda_triton.gemm import GemmProblem, gemm_configs, render_gemm

f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
GEMM = "__gemm__"


def product(index, dtype):
    """The epilogue IR's read of the product at ``index``."""
    return ld(GEMM, index, dtype)


def is_product(node) -> bool:
    return node.op == OpCode.LOAD and load_buffer(node) == GEMM


def as_f32(v):
    return op("cast", f32, v) if v.dtype != f32 else v


def build_gemm(k, problem, hints=None):
    em = emitter()
    em.size_hints = dict(hints or {})
    src = render_gemm(em, k, problem, is_product, "triton_gemm")
    return em.load(src), src


def operand(shape, dtype, layout):
    """A fresh random operand; ``layout``: contiguous, transposed (last two dims swapped in
    memory) or sliced (every other column of a wider tensor)."""
    if layout == "transposed":
        return torch.randn(*shape[:-2], shape[-1], shape[-2], device=DEVICE).transpose(-1, -2).to(dtype)
    if layout == "sliced":
        return torch.randn(*shape[:-1], 2 * shape[-1], device=DEVICE)[..., ::2].to(dtype)
    return torch.randn(*shape, device=DEVICE).to(dtype)


def buffer_of(name, t):
    return buf(name, tuple(t.shape), t.dtype, stride=tuple(t.stride()))


def tol(dtype, k):
    if dtype == f32:
        return dict(rtol=1e-4, atol=1e-4 * max(1, k ** 0.5))
    return TOL[dtype]


@pytest.mark.parametrize("dtype", [f32, bf16, f16])
@pytest.mark.parametrize("layout_a,layout_b", [("contiguous", "transposed"), ("transposed", "contiguous"),
                                                ("sliced", "sliced")])
def test_addmm_relu_matches_eager(dtype, layout_a, layout_b):
    M, N, K = 37, 45, 29  # odd sizes: every block has a tail
    a, b = operand((M, K), dtype, layout_a), operand((K, N), dtype, layout_b)
    bias = torch.randn(N, device=DEVICE).to(dtype)
    out = torch.empty(M, N, device=DEVICE, dtype=dtype)
    value = op("cast", dtype, op("maximum", f32, as_f32(product(N * x0 + x1, dtype)), const(0.0)))
    k = kernel("fxwrap_template_0", [buffer_of("bias", bias), buffer_of("a", a), buffer_of("b", b)],
               [buffer_of("out", out)], [Store("out", N * x0 + x1, value)], ranges=(M, N))
    launch, src = build_gemm(k, GemmProblem("addmm", buffer_of("a", a), buffer_of("b", b), M, N, K,
                                            bias=buffer_of("bias", bias)))
    assert "tl.dot(" in src.text and src.launch["plan"] == "template"
    launch(bias, a, b, out)
    torch.testing.assert_close(out, torch.relu(torch.addmm(bias, a, b)), **tol(dtype, K))


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_mm_with_residual_and_cast_epilogue(dtype):
    """A residual read at the output's index, a scale, and a cast to float32 (two stores:
    the product itself and the epilogue's result)."""
    M, N, K = 40, 24, 64
    a, b = operand((M, K), dtype, "contiguous"), operand((K, N), dtype, "transposed")
    res = torch.randn(M, N, device=DEVICE).to(dtype)
    mm_out = torch.empty(M, N, device=DEVICE, dtype=dtype)
    out = torch.empty(M, N, device=DEVICE, dtype=f32)
    p = product(N * x0 + x1, dtype)
    value = op("mul", f32, op("add", f32, as_f32(p), as_f32(ld("res", N * x0 + x1, dtype))), const(0.5))
    k = kernel("fxwrap_template_1", [buffer_of("a", a), buffer_of("b", b), buffer_of("res", res)],
               [buffer_of("mm", mm_out), buffer_of("out", out)],
               [Store("mm", N * x0 + x1, p), Store("out", N * x0 + x1, value)], ranges=(M, N))
    launch, _ = build_gemm(k, GemmProblem("mm", buffer_of("a", a), buffer_of("b", b), M, N, K))
    launch(a, b, res, mm_out, out)
    want = a @ b
    torch.testing.assert_close(mm_out, want, **tol(dtype, K))
    torch.testing.assert_close(out, (want.float() + res.float()) * 0.5, **tol(dtype, K))


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_bmm_matches_eager(dtype):
    B, M, N, K = 3, 19, 33, 40
    a, b = operand((B, M, K), dtype, "contiguous"), operand((B, K, N), dtype, "transposed")
    out = torch.empty(B, M, N, device=DEVICE, dtype=dtype)
    index = M * N * x0 + N * x1 + x2
    value = op("cast", dtype, op("mul", f32, as_f32(product(index, dtype)), const(2.0)))
    k = kernel("fxwrap_template_2", [buffer_of("a", a), buffer_of("b", b)], [buffer_of("out", out)],
               [Store("out", index, value)], ranges=(B, M, N))
    launch, src = build_gemm(k, GemmProblem("bmm", buffer_of("a", a), buffer_of("b", b), M, N, K, batch=B))
    assert "zindex" in src.text
    launch(a, b, out)
    torch.testing.assert_close(out, torch.bmm(a, b) * 2, **tol(dtype, K))


def test_symbolic_rows():
    """``M`` a size symbol: one source for every batch size, int64 indices."""
    N, K = 48, 32
    a_buf = buf("a", (s0, K), f32)
    b_buf = buf("b", (K, N), f32, stride=(1, K))
    bias_buf = buf("bias", (N,), f32)
    out_buf = buf("out", (s0, N), f32)
    value = op("add", f32, product(N * x0 + x1, f32), const(1.0))
    k = kernel("fxwrap_template_3", [bias_buf, a_buf, b_buf], [out_buf], [Store("out", N * x0 + x1, value)],
               ranges=(s0, N), sizes=(s0,))
    launch, src = build_gemm(k, GemmProblem("addmm", a_buf, b_buf, s0, N, K, bias=bias_buf), hints={s0: 20})
    assert "tl.int64" in src.text and "do_not_specialize" in src.text
    for M in (5, 33):
        a = torch.randn(M, K, device=DEVICE)
        b = torch.randn(N, K, device=DEVICE).t()
        bias = torch.randn(N, device=DEVICE)
        out = torch.empty(M, N, device=DEVICE)
        launch(bias, a, b, out, M)
        torch.testing.assert_close(out, torch.addmm(bias, a, b) + 1, **tol(f32, K))


def test_addmm_alpha_beta_and_row_bias():
    M, N, K = 20, 17, 16
    a, b = operand((M, K), f32, "contiguous"), operand((K, N), f32, "contiguous")
    bias = torch.randn(M, 1, device=DEVICE)  # broadcast along the columns
    out = torch.empty(M, N, device=DEVICE)
    k = kernel("fxwrap_template_4", [buffer_of("bias", bias), buffer_of("a", a), buffer_of("b", b)],
               [buffer_of("out", out)], [Store("out", N * x0 + x1, product(N * x0 + x1, f32))], ranges=(M, N))
    launch, _ = build_gemm(k, GemmProblem("addmm", buffer_of("a", a), buffer_of("b", b), M, N, K,
                                          bias=buffer_of("bias", bias), alpha=0.5, beta=2.0))
    launch(bias, a, b, out)
    torch.testing.assert_close(out, torch.addmm(bias, a, b, alpha=0.5, beta=2.0), **tol(f32, K))


def test_tf32_follows_torch_flag(monkeypatch):
    M, N, K = 32, 32, 32
    a_buf, b_buf, out_buf = buf("a", (M, K)), buf("b", (K, N)), buf("out", (M, N))
    k = kernel("fxwrap_template_5", [a_buf, b_buf], [out_buf], [Store("out", N * x0 + x1, product(N * x0 + x1, f32))],
               ranges=(M, N))
    problem = GemmProblem("mm", a_buf, b_buf, M, N, K)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    assert 'input_precision="ieee"' in build_gemm(k, problem)[1].text
    if not GPU:
        return  # the interpreter computes in float32 whatever the source says
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    assert 'input_precision="tf32"' in build_gemm(k, problem)[1].text


def test_configs_fit_the_problem():
    a, b = buf("a", (8, 4096), bf16), buf("b", (4096, 4096), bf16)
    configs = gemm_configs(GemmProblem("mm", a, b, 8, 4096, 4096), {}, interpret=False)
    assert configs and all(c.block_m == 16 for c in configs)  # 8 rows: the smallest tl.dot tile
    assert len({(c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages) for c in configs}) == len(configs)
    big = gemm_configs(GemmProblem("mm", buf("a", (4096, 4096), bf16), b, 4096, 4096, 4096), {}, interpret=False)
    assert max(c.block_m * c.block_n for c in big) >= 128 * 128
    sym = gemm_configs(GemmProblem("mm", buf("a", (s0, 64), f32), buf("b", (64, 64), f32), s0, 64, 64),
                       {s0: 20}, interpret=False)
    assert all(c.block_m <= 32 and c.block_n <= 64 for c in sym)


def test_source_is_deterministic():
    M, N, K = 24, 40, 16
    a_buf, b_buf, out_buf = buf("a", (M, K)), buf("b", (K, N)), buf("out", (M, N))
    value = op("sigmoid", f32, product(N * x0 + x1, f32))
    k = kernel("fxwrap_template_6", [a_buf, b_buf], [out_buf], [Store("out", N * x0 + x1, value)], ranges=(M, N))
    problem = GemmProblem("mm", a_buf, b_buf, M, N, K)
    assert build_gemm(k, problem)[1].text == build_gemm(k, problem)[1].text
    assert sympy.Symbol("s0") not in k.size_symbols
