"""The ``cpu`` target's attention kernel (``fxwrap.targets.cpu_cpp.attention``): a causal (or
head-size <= 32) float32 ``scaled_dot_product_attention`` without dropout (an additive mask
or not) is one C++
kernel, not ATen's ``_scaled_dot_product_flash_attention_for_cpu`` (1.5x faster causal at a
Llama's sizes on one thread: it skips the keys above the diagonal); its output and
log-sum-exp match eager's (the backward reads the log-sum-exp); other calls keep the extern."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel
from fxwrap.targets.cpu_cpp.attention import FLASH_CPU

aten = torch.ops.aten


def _compile(fn, dynamic=False):
    torch._dynamo.reset()
    programs = []
    return torch.compile(fn, backend=fxwrap.Backend("cpu", {"on_program": programs.append, "cache": False}),
                         fullgraph=True, dynamic=dynamic), programs


def _attention_kernels(programs):
    return [ln.kernel for p in programs for ln in p.lines
            if isinstance(ln, CallKernel) and ln.kernel.name.startswith("fxwrap_attention")]


def _externs(programs):
    return [ln for p in programs for ln in p.lines if isinstance(ln, CallExtern) and ln.op is FLASH_CPU]


def _qkv(b, h, t, s, d, seed, kv_heads=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, h, d, generator=g).transpose(1, 2)
    kh = kv_heads or h
    return q, torch.randn(b, kh, s, d, generator=g), torch.randn(b, kh, s, d, generator=g)


@pytest.mark.parametrize("b,h,t,s,d,causal,scale", [
    (8, 6, 128, 128, 32, True, None),     # the hand-written Llama's layer
    (2, 3, 37, 37, 32, True, None),       # rows not a multiple of the 8-row block, keys of 16
    (2, 2, 24, 61, 64, True, 0.3),        # fewer queries than keys (top-left diagonal), a scale
    (1, 2, 70, 20, 16, True, None),       # more queries than keys: late rows see every key
    (3, 4, 50, 90, 32, False, None),      # not causal, head size 32
])
def test_attention_kernel_matches_eager(b, h, t, s, d, causal, scale):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale) * 1.5
    q, k, v = _qkv(b, h, t, s, d, seed=t + s)
    compiled, programs = _compile(fn)
    with torch.no_grad():
        got = compiled(q, k, v)
    torch.testing.assert_close(got, fn(q, k, v), atol=2e-5, rtol=1e-5)
    assert len(_attention_kernels(programs)) == 1
    assert not _externs(programs)


def test_grouped_key_value_heads():
    """HF's grouped-query attention hands the op 8 query heads and 2 key/value heads."""
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) - 0.5
    q, k, v = _qkv(2, 8, 40, 40, 32, seed=2, kv_heads=2)
    compiled, programs = _compile(fn)
    with torch.no_grad():
        got = compiled(q, k, v)
    torch.testing.assert_close(got, fn(q, k, v), atol=2e-5, rtol=1e-5)
    assert len(_attention_kernels(programs)) == 1
    assert not _externs(programs)


@pytest.mark.parametrize("mask_kind", ["bias", "padding", "two_d", "bool"])
def test_masks_added_to_the_scores(mask_kind):
    """T5's position bias (one per head, broadcast over the batch), a padding mask with -inf
    (broadcast over heads and queries; a whole masked row gives zeros, as ATen's kernel), a 2-D
    mask, a bool mask."""
    b, h, t, s, d = 3, 4, 40, 33, 32
    q, k, v = _qkv(b, h, t, s, d, seed=21)
    g = torch.Generator().manual_seed(22)
    if mask_kind == "bias":
        mask = torch.randn(1, h, t, s, generator=g)
    elif mask_kind == "padding":
        mask = torch.zeros(b, 1, t, s)
        mask[1, :, :, 20:] = float("-inf")
        mask[2, :, 5, :] = float("-inf")      # a query that sees no key
    elif mask_kind == "two_d":
        mask = torch.randn(t, s, generator=g)
    else:
        mask = torch.rand(b, 1, t, s, generator=g) > 0.3
        mask[..., 0] = True

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask) + 0.25
    compiled, programs = _compile(fn)
    with torch.no_grad():
        got = compiled(q, k, v, mask)
    torch.testing.assert_close(got, fn(q, k, v, mask), atol=2e-5, rtol=1e-5)
    assert len(_attention_kernels(programs)) == 1


@pytest.mark.parametrize("with_mask", [False, True])
def test_output_and_logsumexp_match_the_aten_op(with_mask):
    """Both results of the op: the log-sum-exp (scaled scores, natural log) as ATen's kernel's;
    causal and a mask together, as the op takes them."""
    def fn(q, k, v, mask):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, attn_mask=mask)
        return out + 1, lse * 2
    q, k, v = _qkv(2, 3, 40, 40, 32, seed=5)
    mask = torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(6)) if with_mask else None
    compiled, programs = _compile(fn)
    got_out, got_lse = compiled(q, k, v, mask)
    want_out, want_lse = fn(q, k, v, mask)
    torch.testing.assert_close(got_out, want_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got_lse, want_lse, atol=2e-5, rtol=1e-5)
    assert got_lse.stride() == want_lse.stride()
    assert len(_attention_kernels(programs)) == 1


def test_training_gradients_through_the_kernel():
    """The backward (ATen's flash backward) reads the kernel's output and log-sum-exp."""
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).pow(2).sum()
    q, k, v = _qkv(2, 4, 48, 48, 32, seed=7)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    compiled, programs = _compile(fn)
    loss = compiled(*leaves)
    loss.backward()
    want = fn(*ref)
    want.backward()
    torch.testing.assert_close(loss, want, atol=1e-3, rtol=1e-5)
    for got_leaf, ref_leaf in zip(leaves, ref):
        torch.testing.assert_close(got_leaf.grad, ref_leaf.grad, atol=1e-4, rtol=1e-4)
    assert len(_attention_kernels(programs)) == 1


@pytest.mark.parametrize("case", ["head64_not_causal", "head128", "float64", "dynamic"])
def test_other_calls_keep_the_extern(case):
    b, h, t, d = 2, 2, 32, {"head64_not_causal": 64, "head128": 128}.get(case, 32)
    q, k, v = _qkv(b, h, t, t, d, seed=11)
    dtype = torch.float64 if case == "float64" else torch.float32
    q, k, v = (x.to(dtype) for x in (q, k, v))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=case != "head64_not_causal")
    compiled, programs = _compile(fn, dynamic=case == "dynamic")
    with torch.no_grad():
        got = compiled(q, k, v)
    torch.testing.assert_close(got, fn(q, k, v), atol=2e-5, rtol=1e-5)
    assert not _attention_kernels(programs)


def test_debug_dump_holds_the_kernel_source(tmp_path):
    """``FXWRAP_DEBUG_DIR`` / ``debug_dir`` writes the kernel a Wrapper-IR pass defined, as the
    builder's kernels."""
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 3
    q, k, v = _qkv(1, 2, 24, 24, 16, seed=31)
    torch._dynamo.reset()
    program = fxwrap.lower(fn, q, k, v, target="cpu", options={"debug_dir": str(tmp_path), "cache": False})
    (kernel,) = [ln.kernel for ln in program.lines if isinstance(ln, CallKernel) and "attention" in ln.kernel.name]
    (path,) = tmp_path.glob(f"*/kernels/{kernel.name}.cpp")
    assert path.read_text().rstrip("\n") == kernel.source.rstrip("\n")
