"""One-position attention over grouped KV heads without repeating the cache
(``fxwrap/core/grouped_attention.py``, pass ``"grouped attention"``).

A decode step repeats each cached KV head for the ``G`` query heads it serves
(``repeat_interleave``; HF's ``repeat_kv``: ``expand`` + ``reshape``) and calls SDPA; the
program instead calls CPU attention on the unrepeated cache with the group's query heads as
query rows.  Numbers against eager (float32, bfloat16; a boolean mask, a float mask, no mask,
an explicit scale), structure (the attention's keys are the cache itself, no copy of it), and
the cases left as they were: two query positions, a causal flag, a per-head mask, training.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.core.grouped_attention import CPU_ATTENTION
from fxwrap.ir.lines import CallExtern, CallKernel

B, H, KV, S, D = 1, 8, 2, 24, 16
G = H // KV


def repeat_interleave(cache):
    return cache.repeat_interleave(G, dim=1)


def repeat_kv(cache):  # transformers' Llama
    b, kv, s, d = cache.shape
    return cache[:, :, None, :, :].expand(b, kv, G, s, d).reshape(b, kv * G, s, d)


def attention(repeat, **sdpa_kwargs):
    def fn(q, k_cache, v_cache, mask):
        y = F.scaled_dot_product_attention(q, repeat(k_cache), repeat(v_cache), attn_mask=mask, **sdpa_kwargs)
        return y.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1) * 2
    return fn


def inputs(dtype, mask_kind="bool", positions=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, positions, H, D, generator=g).to(dtype).transpose(1, 2)  # a projection's heads
    k, v = (torch.randn(B, KV, S, D, generator=g).to(dtype) for _ in range(2))
    valid = torch.arange(S) <= 13
    mask = {"bool": valid.view(1, 1, 1, S), "none": None,
            "float": torch.zeros(1, 1, 1, S).masked_fill(~valid, float("-inf")).to(dtype),
            "per_head": valid.view(1, 1, 1, S).expand(1, H, positions, S).clone()}[mask_kind]
    if mask is not None and mask_kind != "per_head" and positions > 1:
        mask = mask.expand(1, 1, positions, S)
    return q, k, v, mask


def lowered(fn, *args):
    return fxwrap.lower(fn, *args, target="cpu", options={"cache": False})


def attention_calls(program):
    return [ln for ln in program.lines if isinstance(ln, CallExtern) and ln.op == CPU_ATTENTION]


def tolerance(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
@pytest.mark.parametrize("repeat", [repeat_interleave, repeat_kv], ids=["repeat_interleave", "repeat_kv"])
def test_grouped_query_rows_match_eager(repeat, mask_kind, dtype):
    fn = attention(repeat, **({"scale": 0.3} if mask_kind == "none" else {}))
    args = inputs(dtype, mask_kind)
    program = lowered(fn, *args)
    (call,) = attention_calls(program)
    q, k = call.args[:2]
    assert tuple(k.size) == (B, KV, S, D) and tuple(q.size) == (B, KV, G, D), call
    assert k.name in {b.name for b in program.inputs}  # the cache itself: nothing repeated it
    written = [b for ln in program.lines if isinstance(ln, CallKernel) for b in ln.writes()]
    assert written and all(tuple(b.size) not in ((B, KV, G, S, D), (B, H, S, D)) for b in written), written
    for seed in (1, 2):
        args = inputs(dtype, mask_kind, seed=seed)
        torch.testing.assert_close(program.run(*args).float(), fn(*args).float(), **tolerance(dtype))


@pytest.mark.parametrize("case", ["two_positions", "causal", "per_head_mask"])
def test_other_attention_keeps_the_repeated_heads(case):
    positions = 2 if case == "two_positions" else 1
    fn = attention(repeat_kv, **({"is_causal": True} if case == "causal" else {}))
    args = inputs(torch.float32, "none" if case == "causal" else ("per_head" if case == "per_head_mask" else "bool"),
                  positions)
    program = lowered(fn, *args)
    (call,) = attention_calls(program)
    assert tuple(call.args[1].size) == (B, H, S, D), call
    torch.testing.assert_close(program.run(*args), fn(*args), atol=1e-5, rtol=1e-5)


def test_training_keeps_the_repeated_heads():
    """A training graph's backward reads the log-sum-exp: the forward keeps its attention."""
    fn = attention(repeat_kv)
    q, k, v, mask = inputs(torch.float32)
    programs: list = []
    torch._dynamo.reset()
    c = torch.compile(fn, backend=fxwrap.Backend("cpu", {"cache": False, "on_program": programs.append}))
    qs = [t.clone().requires_grad_() for t in (q, k, v)]
    c(*qs, mask).sum().backward()
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    fn(*ref, mask).sum().backward()
    for got, want in zip(qs, ref):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-5, rtol=1e-5)
    forward = programs[0]
    assert all(tuple(call.args[1].size) == (B, H, S, D) for call in attention_calls(forward))


def test_decode_step_of_a_grouped_llama():
    """benchmarks/decode.py's hand-written Llama (``index_copy_`` into the caches, masked SDPA
    over the whole cache): every layer's attention reads its caches unrepeated; the logits and
    the caches written are eager's."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).parents[2] / "benchmarks" / "decode.py"
    spec = importlib.util.spec_from_file_location("fxwrap_bench_decode", path)
    decode = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decode)
    torch.manual_seed(0)
    model = decode.HandLlama(2, 64, 8, 2, 96, 100, 32, dtype=torch.float32).eval()
    twin = decode.HandLlama(2, 64, 8, 2, 96, 100, 32, dtype=torch.float32).eval()
    twin.load_state_dict(model.state_dict())
    programs: list = []
    torch._dynamo.reset()
    c = torch.compile(model, backend=fxwrap.Backend("cpu", {"cache": False, "on_program": programs.append}))
    with torch.no_grad():
        for pos in range(5):
            token = torch.tensor([[pos * 7 % 100]])
            torch.testing.assert_close(c(token, torch.tensor([pos])), twin(token, torch.tensor([pos])),
                                       atol=1e-5, rtol=1e-5)
    for a, b in zip(model.buffers(), twin.buffers()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    calls = [call for p in programs for call in attention_calls(p)]
    assert len(calls) == 2 and all(tuple(call.args[1].size) == (1, 2, 32, 8) for call in calls)
