"""Graph capture side by side: eager, Inductor (default and reduce-overhead), fxwrap (default
and reduce-overhead), in one process, interleaved rounds.

    python benchmarks/capture.py --device cuda                       # every workload, the H100 sizes
    python benchmarks/capture.py --device cuda --workloads decode --layers 12 --dim 1024
    python benchmarks/capture.py --device cpu --workloads decode --layers 2 --dim 64 --threads 1 \
        --backends eager,fxwrap,fxwrap-reduce-overhead                        # the CPU launch list

Workloads:

* ``decode``: a Llama-style decoder steps one token (batch 1) with a static KV cache held in
  module buffers written with ``index_copy_``, RMSNorm, rotary-free masked SDPA, SwiGLU
  (bf16 on CUDA, fp32 on the CPU).  Issue 27's case: 12 layers, 1024 wide.
* ``llama-infer``: HF transformers' ``LlamaForCausalLM`` (8 layers, 1024 wide, grouped KV
  heads, 4 x 512 tokens), inference (needs ``transformers``; skipped with a note otherwise).
* ``llama-train``: the same model, one training step under ``torch.autocast`` (bf16 on CUDA).

Per workload and backend: milliseconds per step (the median over rounds that run every
backend once, one after the other), the ratio to Inductor reduce-overhead, and a check of
the output against eager's.  With ``--copies`` (CUDA): device-to-device copies per step of
fxwrap reduce-overhead seen by ``torch.profiler`` (the parameters must not be among them).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

import fxwrap  # noqa: F401 - registers the backend
from fxwrap.runtime.graph_replay import replay_runners


class RMSNorm(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class DecoderLayer(torch.nn.Module):
    def __init__(self, dim, heads, slots):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)
        self.gate = torch.nn.Linear(dim, 4 * dim, bias=False)
        self.up = torch.nn.Linear(dim, 4 * dim, bias=False)
        self.down = torch.nn.Linear(4 * dim, dim, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, heads, slots, dim // heads))
        self.register_buffer("v_cache", torch.zeros(1, heads, slots, dim // heads))

    def forward(self, x, pos, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, -1)
        q, k, v = (y.view(b, t, self.heads, self.head_dim).transpose(1, 2) for y in (q, k, v))
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        att = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        x = x + self.out(att.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(torch.nn.Module):
    """``Decoder(layers, dim)(token_embedding, pos, mask)``: one decoding step."""

    def __init__(self, layers, dim, heads=8, slots=256):
        super().__init__()
        self.layers = torch.nn.ModuleList(DecoderLayer(dim, heads, slots) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.slots = slots

    def forward(self, x, pos, mask):
        for layer in self.layers:
            x = layer(x, pos, mask)
        return self.norm(x)


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def decode_workload(args, device, dtype):
    torch.manual_seed(0)
    model = Decoder(args.layers, args.dim).to(device, dtype).eval()
    dim, slots = args.dim, model.slots

    def inputs(step):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(1, 1, dim, generator=g).to(device, dtype)
        pos = torch.tensor([step % slots], device=device)
        mask = (torch.arange(slots, device=device) <= step % slots).view(1, 1, 1, slots)
        return x, pos, mask

    def run(fn, step):
        with torch.no_grad():
            return fn(*inputs(step))
    return model, run, False


def _llama(args, device, dtype):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    hidden = args.hf_hidden
    config = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                         num_hidden_layers=args.hf_layers, num_attention_heads=16, num_key_value_heads=4,
                         max_position_embeddings=max(1024, args.hf_seq))
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device)


def llama_infer_workload(args, device, dtype):
    model = _llama(args, device, dtype)
    if model is None:
        return None
    model = model.to(dtype).eval()
    ids = torch.randint(0, 32000, (args.hf_batch, args.hf_seq), device=device)

    def run(fn, step):
        with torch.no_grad():
            return fn(input_ids=ids, use_cache=False).logits
    return model, run, False


def llama_train_workload(args, device, dtype):
    model = _llama(args, device, dtype)
    if model is None:
        return None
    model.train()
    ids = torch.randint(0, 32000, (args.hf_batch, args.hf_seq), device=device)

    def run(fn, step):
        for p in fn.parameters():  # a training loop's zero_grad(set_to_none=True)
            p.grad = None
        with torch.autocast(device, dtype=dtype):
            logits = fn(input_ids=ids, use_cache=False).logits
        loss = logits.float().square().mean()
        loss.backward()
        return loss.detach()
    return model, run, True


WORKLOADS = {"decode": decode_workload, "llama-infer": llama_infer_workload, "llama-train": llama_train_workload}


BACKENDS = ("eager", "inductor", "inductor-reduce-overhead", "fxwrap", "fxwrap-reduce-overhead")


def backends(model, programs, names=BACKENDS):
    """name -> a compiled copy of ``model`` (each its own copy: caches are written);
    fxwrap reduce-overhead's programs go to ``programs``."""
    make = {
        "eager": lambda m: m,
        "inductor": lambda m: torch.compile(m),
        "inductor-reduce-overhead": lambda m: torch.compile(m, mode="reduce-overhead"),
        "fxwrap": lambda m: torch.compile(m, backend="fxwrap"),
        "fxwrap-reduce-overhead": lambda m: torch.compile(m, backend="fxwrap", options={
            "mode": "reduce-overhead", "on_program": programs.append}),
    }
    return {name: make[name](copy.deepcopy(model)) for name in names}


def _mark_step():
    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    if mark is not None:
        mark()


def time_workload(name, args, device, dtype):
    made = WORKLOADS[name](args, device, dtype)
    if made is None:
        print(f"{name}: skipped (transformers is not installed)")
        return None
    model, run, training = made
    programs = []
    fns = backends(model, programs, args.backends.split(","))
    outputs = {}
    for backend, fn in fns.items():  # compile and warm up (warm-up, recording, replays)
        for step in range(args.warmup):
            _mark_step()
            out = run(fn, step)
            for p in fn.parameters():
                p.grad = None
        outputs[backend] = out.float().clone()
    times = {b: [] for b in fns}
    step = args.warmup
    for _ in range(args.rounds):
        for backend, fn in fns.items():
            _sync(device)
            start = time.perf_counter()
            for _ in range(args.iters):
                _mark_step()
                run(fn, step)
            _sync(device)
            times[backend].append((time.perf_counter() - start) / args.iters * 1e3)
            if training:
                for p in fn.parameters():
                    p.grad = None
        step += 1
    ref = outputs["eager"]
    rows = []
    base = statistics.median(times.get("inductor-reduce-overhead") or times["eager"])
    for backend in fns:
        ms = statistics.median(times[backend])
        err = (outputs[backend] - ref).abs().max().item()
        rows.append((backend, ms, ms / base, err))
    print(f"\n{name} ({device}, {dtype}, {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'})")
    versus = "x ind-RO" if "inductor-reduce-overhead" in times else "x eager"
    print(f"{'backend':28s} {'ms/step':>9s} {versus:>9s} {'max|err| vs eager':>18s}")
    for backend, ms, ratio, err in rows:
        print(f"{backend:28s} {ms:9.3f} {ratio:9.2f} {err:18.3g}")
    runners = [r for p in programs for r in replay_runners(p.runner)]
    print("fxwrap reduce-overhead recordings:", [(r.name, r.count, r.fallback_reason) for r in runners])
    if args.copies and device == "cuda" and "fxwrap-reduce-overhead" in fns:
        count_copies(fns["fxwrap-reduce-overhead"], run, step, model)
    return rows


def count_copies(fn, run, step, model):
    """Device-to-device copies per step of ``fn`` (torch.profiler): parameters must not be copied."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        run(fn, step)
    _sync("cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(fn, step)
        _sync("cuda")
    copies = [e for e in prof.events() if "Memcpy DtoD" in e.name or "memcpy" in e.name.lower()
              and "dtod" in e.name.lower().replace(" ", "")]
    params = sum(1 for _ in model.parameters())
    print(f"device-to-device copies in one fxwrap reduce-overhead step: {len(copies)} "
          f"(the model has {params} parameters)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--dim", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--copies", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="eager must stay first")
    parser.add_argument("--hf-layers", type=int, default=8)
    parser.add_argument("--hf-hidden", type=int, default=1024)
    parser.add_argument("--hf-batch", type=int, default=4)
    parser.add_argument("--hf-seq", type=int, default=512)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    args.layers = args.layers or (12 if cuda else 2)
    args.dim = args.dim or (1024 if cuda else 64)
    dtype = torch.bfloat16 if cuda else torch.float32
    for name in args.workloads.split(","):
        time_workload(name, args, args.device, dtype)


if __name__ == "__main__":
    main()
