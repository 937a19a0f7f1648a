"""HF Llama's rotary embedding of q and k on the GPU: eager, Inductor, fxwrap (issue 27).

    PYTHONPATH=. python benchmarks/rope.py                    # B=4 S=512 H=16 KV=4 D=64, bf16
    PYTHONPATH=. python benchmarks/rope.py --contiguous       # outputs made contiguous (SDPA's clone)

The function is ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` written out (no
transformers needed): q ``[B, S, H*D]`` and k ``[B, S, KV*D]`` viewed ``[B, S, H, D]`` and
transposed, angles from float32 positions, ``rotate_half`` as a cat of the negated halves,
cos/sin cast to bf16.  Backends, each compiled in this process:

* ``eager``, ``inductor`` (``torch.compile`` default);
* ``fxwrap``: the Triton plan the planner picks now (1-D for these kernels);
* ``fxwrap-2d``: ``Planner.pointwise2d_min_gain = 0``, the 2-D tiling the planner chose
  before (the positions' broadcast read coalesced), for an A/B on the same machine.

Per backend: GPU microseconds per call of the whole function (CUDA events, median of
rounds) and, from ``torch.profiler``, every kernel's microseconds per call; fxwrap's
kernels also with their plan.  Outputs are checked against eager.
"""
from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("FXWRAP_PROGRAM_CACHE", "0")  # fxwrap-2d must compile, not load fxwrap's program

import torch
from torch.profiler import ProfilerActivity, profile

import fxwrap
from fxwrap.targets.cuda_triton.tiling import Planner


def make_rope(heads: int, kv_heads: int, head_dim: int, contiguous: bool):
    def rope(qf, kf, pos, inv_freq):
        b, s = pos.shape
        q = qf.view(b, s, heads, head_dim).transpose(1, 2)
        k = kf.view(b, s, kv_heads, head_dim).transpose(1, 2)
        freqs = pos[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(qf.dtype)[:, None], emb.sin().to(qf.dtype)[:, None]

        def rotate_half(x):
            return torch.cat((-x[..., head_dim // 2:], x[..., :head_dim // 2]), dim=-1)
        qo, ko = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        return (qo.contiguous(), ko.contiguous()) if contiguous else (qo, ko)
    return rope


def gpu_us(fn, args, rounds: int, iters: int) -> float:
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / iters)
    return statistics.median(times)


def kernel_table(fn, args, iters: int) -> list[tuple[str, float, int]]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn(*args)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", 0)
        # a record_function range (fxwrap names each launch so) can come back as a device-side
        # user annotation of the kernel's time: counted, it doubles fxwrap's kernels only
        if t > 0 and e.count and not getattr(e, "is_user_annotation", False):
            rows.append((e.key, t / e.count, e.count // iters))
    return sorted(rows, key=lambda r: -r[1] * r[2])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--contiguous", action="store_true", help="outputs made contiguous [B, H, S, D]")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--iters", type=int, default=50)
    a = p.parse_args()
    dev, dt = "cuda", torch.bfloat16
    b, s, h, kv, d = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim
    qf = torch.randn(b, s, h * d, device=dev, dtype=dt)
    kf = torch.randn(b, s, kv * d, device=dev, dtype=dt)
    pos = torch.arange(s, device=dev)[None].expand(b, s)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=dev).float() / d))
    args = (qf, kf, pos, inv_freq)
    rope = make_rope(h, kv, d, a.contiguous)
    want = rope(*args)
    print(f"rope q [{b},{s},{h},{d}] k [{b},{s},{kv},{d}] {dt} contiguous={a.contiguous} "
          f"on {torch.cuda.get_device_name()}")

    default_gain = Planner.pointwise2d_min_gain
    results = {}
    for name in ("eager", "inductor", "fxwrap", "fxwrap-2d"):
        torch._dynamo.reset()
        programs = []
        if name == "eager":
            fn = rope
        elif name == "inductor":
            fn = torch.compile(make_rope(h, kv, d, a.contiguous))
        else:
            Planner.pointwise2d_min_gain = 0.0 if name == "fxwrap-2d" else default_gain
            fn = torch.compile(make_rope(h, kv, d, a.contiguous),
                               backend=fxwrap.Backend("cuda", {"on_program": programs.append}))
        got = fn(*args)  # compiles (the planner runs here)
        Planner.pointwise2d_min_gain = default_gain
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
        for _ in range(5):
            fn(*args)
        torch.cuda.synchronize()
        us = gpu_us(fn, args, a.rounds, a.iters)
        results[name] = us
        plans = {}
        for prog in programs:
            for node in prog.graph_module.graph.nodes:
                if isinstance(node.target, fxwrap.Kernel):
                    plans[node.target.name] = getattr(node.target.launch, "plan", "?")
        print(f"\n== {name}: {us:.1f} us per call (CUDA events, whole function)")
        for key, per_call, calls in kernel_table(fn, args, a.iters):
            plan = f"  [{plans[key]}]" if key in plans else ""
            print(f"   {per_call:8.2f} us x{calls}  {key[:100]}{plan}")
    print("\nratio to inductor: " + ", ".join(f"{n} {t / results['inductor']:.2f}x" for n, t in results.items()))


if __name__ == "__main__":
    main()
