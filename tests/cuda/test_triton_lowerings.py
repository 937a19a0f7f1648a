"""Differential tests of whole programs through the Triton emitter, against eager.

On a GPU they run on CUDA tensors (target ``cuda``); elsewhere on CPU tensors under
Triton's interpreter (target ``triton-interpret``).  Every run draws fresh inputs.
"""
from __future__ import annotations

import pytest
import torch

aten = torch.ops.aten
import torch.nn.functional as F

import shared_helpers
from triton_helpers import DEVICE, TOL, check, compiled, kernels, make

LAYOUTS = ["contiguous", "transposed", "sliced", "broadcast"]


unary_float = shared_helpers.unary_float


@pytest.mark.parametrize("dtype,layout,dynamic", [
    (torch.float32, "contiguous", False), (torch.float32, "transposed", False),
    (torch.float32, "sliced", True), (torch.float32, "broadcast", False),
    (torch.bfloat16, "contiguous", False), (torch.float64, "transposed", False),
    (torch.float16, "contiguous", True),
])
def test_unary_float(dtype, layout, dynamic):
    x = make(layout, dtype)
    check(unary_float, (x,), dynamic, TOL[dtype])


def binary_float(x, y, ny):
    return (x + y, x - y, x * y, x / ny, torch.add(x, y, alpha=3), torch.div(x, ny, rounding_mode="floor"),
            torch.div(x, ny, rounding_mode="trunc"), torch.pow(x.abs() + 0.1, y), x ** 2, 2 ** x,
            torch.maximum(x, y), torch.minimum(x, y), torch.fmod(x, ny), torch.remainder(x, ny),
            torch.atan2(x, y), torch.copysign(x, y), x < y, x <= y, x > y, x >= y, x == y, x != y,
            torch.where(x > y, x, y), torch.where(x > 0, x, 0.5), torch.lerp(x, y, 0.3),
            torch.hypot(x, y), x * 0.5 + 1)


@pytest.mark.parametrize("dtype,layout,dynamic", [
    (torch.float32, "contiguous", False), (torch.float32, "transposed", True),
    (torch.float32, "broadcast", False), (torch.float64, "sliced", False),
])
def test_binary_float(dtype, layout, dynamic):
    x = make(layout, dtype)
    y = make("contiguous", dtype)[0]
    ny = make("contiguous", dtype)[1].abs() + 0.5
    check(binary_float, (x, y, ny), dynamic, TOL[dtype])


def test_nan_propagation():
    x, y = make("contiguous"), make("contiguous")
    x[3, 5] = float("nan")
    y[7, 1] = float("nan")
    x[10] = float("nan")
    check(lambda x, y: (torch.maximum(x, y), torch.minimum(x, y), x.amax(1), x.amin(0), x.argmax(1),
                        x.argmin(1), torch.clamp(x, -1, 1)), (x, y))


def integer_ops(a, b):
    nb = b.abs() + 1
    return (a + b, a - b, a * b, a // nb, torch.div(a, nb, rounding_mode="trunc"), a % nb,
            torch.fmod(a, nb), a.abs(), -a, a.sign(), torch.maximum(a, b), torch.minimum(a, b),
            a & b, a | b, a ^ b, ~a, a << (nb % 5), a >> (nb % 5), a < b, a == b, a.clamp(-3, 3),
            a.to(torch.float32) / nb, torch.where(a > b, a, b), a.float().mul(0.5).to(a.dtype),
            a.sum(1), a.amax(0), a.argmin(1))


@pytest.mark.parametrize("dtype,dynamic", [(torch.int64, False), (torch.int32, True)])
def test_integer(dtype, dynamic):
    a = torch.randint(-50, 50, (31, 17), dtype=dtype, device=DEVICE)
    b = torch.randint(-50, 50, (31, 17), dtype=dtype, device=DEVICE)
    check(integer_ops, (a, b), dynamic, dict(rtol=0, atol=0))


def test_bool():
    p, q = (torch.rand(23, 9, device=DEVICE) > 0.5), (torch.rand(23, 9, device=DEVICE) > 0.5)
    check(lambda p, q: (p & q, p | q, p ^ q, ~p, torch.logical_xor(p, q), p == q,
                        torch.where(p, 1.5, -2.0), p.to(torch.int64) + q.to(torch.int64),
                        p.any(1), q.all(0), p.sum(0)), (p, q), tol=dict(rtol=0, atol=0))


def reductions(x):
    return (x.sum(0), x.sum(1), x.sum(), x.sum(1, keepdim=True), x.mean(0), x.mean(1),
            x.amax(0), x.amax(1), x.amin(1), x.max(), x.argmax(1), x.argmin(0),
            x.argmax(0, keepdim=True), x.var(1), x.var(0, correction=0), x.std(1), x.var(),
            *torch.var_mean(x, 1), (x > 0.5).any(1), (x > -3).all(0), x.logsumexp(1),
            torch.softmax(x, -1), torch.log_softmax(x, -1), torch.softmax(x, 0),
            x.prod(1) if x.dtype != torch.bfloat16 else x.sum(1))


@pytest.mark.parametrize("dtype,layout,dynamic,shape", [
    (torch.float32, "contiguous", False, (29, 67)),   # looped under the interpreter (67 > 64)
    (torch.float32, "transposed", False, (29, 40)),   # persistent
    (torch.float32, "sliced", True, (29, 67)),
    (torch.bfloat16, "contiguous", False, (29, 33)),
    (torch.float64, "contiguous", True, (13, 70)),
])
def test_reductions(dtype, layout, dynamic, shape):
    x = make(layout, dtype, shape=shape)
    tol = dict(TOL[dtype])
    if dtype == torch.float32:
        tol = dict(rtol=2e-4, atol=2e-4)
    check(reductions, (x,), dynamic, tol)


def test_argmax_ties_pick_first_index():
    x = torch.randint(0, 3, (19, 70), device=DEVICE).to(torch.float32)  # many ties
    check(lambda x: (x.argmax(1), x.argmin(1), x.argmax(0), x.argmin(0), x.t().argmax(1)), (x,),
          tol=dict(rtol=0, atol=0))


def test_variance_is_stable_with_a_large_offset():
    x = make("contiguous", shape=(17, 300)) + 1.0e4
    ks = check(lambda x: (x.var(1), x.var(0), torch.var_mean(x, 1)[0]), (x,),
               tol=dict(rtol=2e-3, atol=2e-3))
    assert any("welford" in k.source or "_fx_welford" in k.source for k in ks)


def norms(x, w, b, r):
    h = x + r
    rms = h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype) * w
    return (F.layer_norm(x, (x.shape[-1],), w, b), h, rms, torch.softmax(x.float(), -1))


@pytest.mark.parametrize("dtype,dynamic,cols", [(torch.float32, False, 96), (torch.bfloat16, False, 96),
                                                (torch.float32, True, 130)])
def test_norms(dtype, dynamic, cols):
    x, r = make("contiguous", dtype, (33, cols)), make("contiguous", dtype, (33, cols))
    w, b = torch.randn(cols, device=DEVICE).to(dtype), torch.randn(cols, device=DEVICE).to(dtype)
    check(norms, (x, w, b, r), dynamic, dict(rtol=2e-4, atol=2e-4) if dtype == torch.float32 else TOL[dtype])


def views(x):
    y = x.sin() + 1
    return (y.t() * 2, y[2:7, 1::3].exp(), y[3] + 1, y.unsqueeze(1).expand(-1, 4, -1) * 3,
            y.reshape(-1) * 2, y.permute(1, 0)[::2] - 1, torch.cat([y, x], 0) * 2,
            F.pad(y, (1, 2, 3, 0)) + 1, y.flip(0) * 1, y.view(-1, 4, 2).sum(1))


@pytest.mark.parametrize("dynamic", [False, True])
def test_views(dynamic):
    check(views, (make("contiguous", shape=(12, 16)),), dynamic, dict(rtol=1e-5, atol=1e-5))


def test_index_ops():
    x, idx = torch.randn(10, 6, device=DEVICE), torch.randint(0, 10, (7,), device=DEVICE)
    emb = torch.randn(10, 8, device=DEVICE)
    fn = lambda x, idx, emb: (torch.gather(x, 0, idx[:6].view(1, 6).expand(3, 6)),  # noqa: E731
                              F.embedding(idx, emb) * 2, torch.arange(7, device=idx.device) * 2 + idx,
                              torch.full((3, 4), 2.5, device=x.device) + x[:3, :4], x[idx] + 1)
    check(fn, (x, idx, emb), tol=dict(rtol=1e-6, atol=1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_max_pool2d_backward_gathers(dtype):
    """The max-pool gradient as a kernel (fxwrap/core/rules/pooling.py): each input element
    gathers from the windows that chose it, overlapping windows and channels-last too."""
    for shape, kernel, stride, padding, channels_last in (((4, 8, 16, 16), [2, 2], [2, 2], [0, 0], True),
                                                          ((2, 3, 9, 7), [3, 3], [2, 2], [1, 1], False)):
        x = torch.randn(shape, device=DEVICE, dtype=dtype)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        out, indices = aten.max_pool2d_with_indices(x, kernel, stride, padding, [1, 1], False)

        def pool_grad(grad, x, indices):
            return aten.max_pool2d_with_indices_backward(grad, x, kernel, stride, padding, [1, 1], False, indices)

        ks = check(pool_grad, (torch.randn_like(out), x, indices),
                   tol=dict(rtol=1e-2, atol=4e-2) if dtype == torch.bfloat16 else None)
        assert len(ks) == 1
        x = x.round().masked_fill(torch.rand_like(x) < 0.15, float("nan"))  # ties and NaN as eager
        ks = check(lambda x: aten.max_pool2d_with_indices(x, kernel, stride, padding, [1, 1], False),
                   (x,), tol=dict(rtol=0, atol=0))
        assert len(ks) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_max_pool2d_values_alone_are_a_nan_propagating_maximum(dtype):
    """Pooled values without their indices are the ``maximum`` of the window (pooling.py):
    a NaN wins its window, -inf stays, a padded position never counts."""
    x = (torch.randn(2, 6, 9, 7, device=DEVICE) * 3).round().to(dtype)
    x = x.masked_fill(torch.rand_like(x, dtype=torch.float32) < 0.1, float("nan"))
    x[0, 1] = float("-inf")
    for fn in (lambda x: F.max_pool2d(x, 2) * 2, lambda x: F.max_pool2d(x - 20, 3, 2, 1) * 2):
        ks = check(fn, (x,), tol=dict(rtol=0, atol=0))
        assert len(ks) == 1


def test_permuted_3d_copy_is_tiled():
    x = torch.randn(5, 33, 40, device=DEVICE)
    ks = check(lambda x: x.permute(0, 2, 1) * 2 + 1, (x,))
    assert any(k.launch.plan == "pointwise2d" for k in ks)


def hf_rotary(qf, kf, pos, inv_freq, heads=4, kv_heads=2, head_dim=16):
    """HF Llama's rotary embedding of q and k (``LlamaRotaryEmbedding`` then
    ``apply_rotary_pos_emb``): projections viewed ``[B, S, H, D]`` and transposed,
    angles from float32 positions, ``rotate_half`` as a cat of the negated halves."""
    b, s = pos.shape
    q = qf.view(b, s, heads, head_dim).transpose(1, 2)
    k = kf.view(b, s, kv_heads, head_dim).transpose(1, 2)
    freqs = pos[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(qf.dtype)[:, None], emb.sin().to(qf.dtype)[:, None]

    def rotate_half(x):
        return torch.cat((-x[..., head_dim // 2:], x[..., :head_dim // 2]), dim=-1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def test_rotary_embedding_is_1d_tiled():
    """Every full-size access of the rotary kernels is contiguous along the head dim; the
    positions' broadcast read must not turn them into 2-D tiles (issue 27: 2.5x slower)."""
    b, s = 2, 24
    qf = torch.randn(b, s, 4 * 16, device=DEVICE, dtype=torch.bfloat16)
    kf = torch.randn(b, s, 2 * 16, device=DEVICE, dtype=torch.bfloat16)
    pos = torch.arange(s, device=DEVICE)[None].expand(b, s) + torch.randint(0, 50, (b, 1), device=DEVICE)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2, device=DEVICE).float() / 16))
    ks = check(hf_rotary, (qf, kf, pos, inv_freq))
    plans = [k.launch.plan for k in ks]
    # q's and k's rotary kernels may run as one combo kernel, whose members are 1-D pointwise
    # kernels by construction (render_triton_combo declines any other plan)
    assert plans and all(p in ("pointwise1d", "combo") for p in plans), plans


def test_mlp_forward_backward():
    torch._dynamo.reset()
    torch.manual_seed(torch.seed() % 2 ** 31)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.LayerNorm(40),
                                torch.nn.Linear(40, 8)).to(DEVICE)
    ref = torch.nn.Sequential(*[m for m in model])  # same parameters
    x = torch.randn(19, 24, device=DEVICE)
    f, programs = compiled(model)
    out = f(x)
    (out.square().mean() + out.softmax(-1)[:, 0].sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    want = ref(x)
    (want.square().mean() + want.softmax(-1)[:, 0].sum()).backward()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4)
    assert {p.kind for p in programs} == {"forward", "backward"}
    assert len(kernels(programs)) >= 3


def test_sources_are_deterministic_and_config_is_recorded():
    fn = lambda x: torch.softmax(x * 2, -1) + x.mean(0)  # noqa: E731
    sources = []
    for _ in range(2):
        torch._dynamo.reset()
        f, programs = compiled(fn)
        f(make("contiguous", shape=(16, 32)))
        ks = kernels(programs)
        sources.append([k.source for k in ks])
        for k in ks:
            cfg = dict(k.launch.config)
            assert "num_warps" in cfg and cfg["XBLOCK"] >= 1
            assert k.launch.config in k.launch.configs or k.launch.autotuned
    assert sources[0] and sources[0] == sources[1]
