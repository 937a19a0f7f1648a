"""The Triton GEMM template (``fxwrap.targets.cuda_triton.gemm``): hand-built template
kernels (a product and its epilogue) against eager, on the GPU or under Triton's CPU
interpreter (small sizes: the interpreter runs every program in Python)."""
from __future__ import annotations

import pytest
import sympy
import torch

from triton_helpers import DEVICE, GPU, TOL, buf, const, emitter, kernel, ld, op, s0, x0, x1, x2
import dataclasses

from fxwrap.ir.loops import Store
from fxwrap.core.templates import TemplateCall
from fxwrap.targets.cuda_triton.gemm import TritonGemm, gemm_configs

aten = torch.ops.aten
f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16


def gemm_call(op_, a, b, out, hints=None, node="mm"):
    """The ``TemplateCall`` the kernel builder states for ``op_`` over buffers ``a @ b -> out``."""
    batch = a.size[0] if len(a.size) == 3 else sympy.Integer(1)
    sizes = (("batch", sympy.sympify(batch)), ("m", a.size[-2]), ("n", b.size[-1]), ("k", a.size[-1]))
    hints = hints or {}
    ints = tuple((name, int(sympy.sympify(v).subs(hints))) for name, v in sizes)
    index = (x0, x1, x2)[:len(out.size)]
    return TemplateCall(op_, node, (a, b), out, sizes, ints, f32, index)


def product(call):
    """The epilogue IR's ``template_out`` (the float32 product at the output element)."""
    return call.accumulator()


def as_f32(v):
    return op("cast", f32, v) if v.dtype != f32 else v


def build_gemm(k, call, hints=None):
    """Render and load template kernel ``k`` (operands first among its inputs) computing ``call``."""
    em = emitter()
    em.size_hints = dict(hints or {})
    k = dataclasses.replace(k, template=call)
    assert TritonGemm().refusal(call) is None
    src = TritonGemm().render(k, em)
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


def bias_value(name, dtype, index):
    """``addmm``'s bias term in the epilogue (as the kernel builder writes it): the bias, in float32."""
    return as_f32(ld(name, index, dtype))


@pytest.mark.parametrize("dtype", [f32, bf16, f16])
@pytest.mark.parametrize("layout_a,layout_b", [("contiguous", "transposed"), ("transposed", "contiguous"),
                                                ("sliced", "sliced")])
def test_addmm_relu_matches_eager(dtype, layout_a, layout_b):
    M, N, K = 37, 45, 29  # odd sizes: every block has a tail
    a, b = operand((M, K), dtype, layout_a), operand((K, N), dtype, layout_b)
    bias = torch.randn(N, device=DEVICE).to(dtype)
    out = torch.empty(M, N, device=DEVICE, dtype=dtype)
    call = gemm_call(aten.addmm.default, buffer_of("a", a), buffer_of("b", b), buffer_of("mm", out))
    # addmm rounds once (bias + product, then the cast), relu after it
    addmm = op("cast", dtype, op("add", f32, bias_value("bias", dtype, x1), product(call)))
    value = op("cast", dtype, op("maximum", f32, as_f32(addmm), const(0.0)))
    k = kernel("fxwrap_template_0", [buffer_of("a", a), buffer_of("b", b), buffer_of("bias", bias)],
               [buffer_of("out", out)], [Store("out", N * x0 + x1, value)], ranges=(M, N))
    launch, src = build_gemm(k, call)
    assert "tl.dot(" in src.text and src.launch.plan == "template"
    launch(a, b, bias, out)
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
    call = gemm_call(aten.mm.default, buffer_of("a", a), buffer_of("b", b), buffer_of("mm", mm_out))
    p = op("cast", dtype, product(call)) if dtype != f32 else product(call)
    value = op("mul", f32, op("add", f32, as_f32(p), as_f32(ld("res", N * x0 + x1, dtype))), const(0.5))
    k = kernel("fxwrap_template_1", [buffer_of("a", a), buffer_of("b", b), buffer_of("res", res)],
               [buffer_of("mm", mm_out), buffer_of("out", out)],
               [Store("mm", N * x0 + x1, p), Store("out", N * x0 + x1, value)], ranges=(M, N))
    launch, _ = build_gemm(k, call)
    launch(a, b, res, mm_out, out)
    want = a @ b
    torch.testing.assert_close(mm_out, want, **tol(dtype, K))
    torch.testing.assert_close(out, (want.float() + res.float()) * 0.5, **tol(dtype, K))


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_bmm_matches_eager(dtype):
    B, M, N, K = 3, 19, 33, 40
    a, b = operand((B, M, K), dtype, "contiguous"), operand((B, K, N), dtype, "transposed")
    out = torch.empty(B, M, N, device=DEVICE, dtype=dtype)
    call = gemm_call(aten.bmm.default, buffer_of("a", a), buffer_of("b", b), buffer_of("out", out))
    index = M * N * x0 + N * x1 + x2
    value = op("cast", dtype, op("mul", f32, as_f32(op("cast", dtype, product(call))), const(2.0)))
    k = kernel("fxwrap_template_2", [buffer_of("a", a), buffer_of("b", b)], [buffer_of("out", out)],
               [Store("out", index, value)], ranges=(B, M, N))
    launch, src = build_gemm(k, call)
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
    call = gemm_call(aten.addmm.default, a_buf, b_buf, out_buf, hints={s0: 20})
    value = op("add", f32, op("add", f32, ld("bias", x1, f32), product(call)), const(1.0))
    k = kernel("fxwrap_template_3", [a_buf, b_buf, bias_buf], [out_buf], [Store("out", N * x0 + x1, value)],
               ranges=(s0, N), sizes=(s0,))
    launch, src = build_gemm(k, call, hints={s0: 20})
    assert "tl.int64" in src.text and "do_not_specialize" in src.text
    for M in (5, 33):
        a = torch.randn(M, K, device=DEVICE)
        b = torch.randn(N, K, device=DEVICE).t()
        bias = torch.randn(N, device=DEVICE)
        out = torch.empty(M, N, device=DEVICE)
        launch(a, b, bias, out, M)
        torch.testing.assert_close(out, torch.addmm(bias, a, b) + 1, **tol(f32, K))


def test_tf32_follows_torch_flag():
    M, N, K = 32, 32, 32
    a_buf, b_buf, out_buf = buf("a", (M, K)), buf("b", (K, N)), buf("out", (M, N))
    call = gemm_call(aten.mm.default, a_buf, b_buf, out_buf)
    k = kernel("fxwrap_template_5", [a_buf, b_buf], [out_buf], [Store("out", N * x0 + x1, product(call))],
               ranges=(M, N))
    # set and restored by hand: the flag is a property of torch's cuBLAS module object,
    # which pytest's monkeypatch cannot always restore (AttributeError at teardown)
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        matmul.allow_tf32 = False
        assert 'input_precision="ieee"' in build_gemm(k, call)[1].text
        if GPU:  # the interpreter computes in float32 whatever the source says
            matmul.allow_tf32 = True
            assert 'input_precision="tf32"' in build_gemm(k, call)[1].text
    finally:
        matmul.allow_tf32 = before


def test_configs_fit_the_problem():
    b = buf("b", (4096, 4096), bf16)
    small = gemm_call(aten.mm.default, buf("a", (8, 4096), bf16), b, buf("o", (8, 4096), bf16))
    configs = gemm_configs(small, interpret=False)
    assert configs and all(c.block_m == 16 for c in configs)  # 8 rows: the smallest tl.dot tile
    assert len({(c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages) for c in configs}) == len(configs)
    big = gemm_call(aten.mm.default, buf("a", (4096, 4096), bf16), b, buf("o", (4096, 4096), bf16))
    assert max(c.block_m * c.block_n for c in gemm_configs(big, interpret=False)) >= 128 * 128
    sym = gemm_call(aten.mm.default, buf("a", (s0, 64), f32), buf("b", (64, 64), f32), buf("o", (s0, 64), f32),
                    hints={s0: 20})
    assert all(c.block_m <= 32 and c.block_n <= 64 for c in gemm_configs(sym, interpret=False))


def test_refusals():
    t = TritonGemm()
    ints = gemm_call(aten.mm.default, buf("a", (8, 8), torch.int32), buf("b", (8, 8), torch.int32),
                     buf("o", (8, 8), torch.int32))
    assert "int32" in t.refusal(ints)
    empty = gemm_call(aten.mm.default, buf("a", (0, 8)), buf("b", (8, 8)), buf("o", (0, 8)))
    assert "empty" in t.refusal(empty)


def test_source_is_deterministic():
    M, N, K = 24, 40, 16
    a_buf, b_buf, out_buf = buf("a", (M, K)), buf("b", (K, N)), buf("out", (M, N))
    call = gemm_call(aten.mm.default, a_buf, b_buf, out_buf)
    k = kernel("fxwrap_template_6", [a_buf, b_buf], [out_buf],
               [Store("out", N * x0 + x1, op("sigmoid", f32, product(call)))], ranges=(M, N))
    assert build_gemm(k, call)[1].text == build_gemm(k, call)[1].text
