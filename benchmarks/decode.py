"""LLM decoding with a static KV cache: eager vs Inductor vs fxwrap, one process.

    python benchmarks/decode.py --out decode.log                   # GPU: both models, bf16 + int8
    python benchmarks/decode.py --models hand --weights bf16      # one table
    python benchmarks/decode.py --quick                           # tiny sizes, runs on a CPU too

Models (batch 1, one token per step, greedy):

* ``hand``: a Llama-style decoder written here: ``--layers`` (12) blocks ``--dim`` (1024) wide,
  RMSNorm, RoPE, SwiGLU MLP, grouped KV heads (``--kv-heads``, default the query heads' count),
  the KV cache as module buffers ``[1, kv_heads, max_seq, head_dim]`` written with
  ``index_copy_`` at the step's position, and masked SDPA over the whole static cache;
* ``hf``: HF transformers' ``LlamaForCausalLM`` (8 layers, 1024 wide, 4 KV heads) with its
  ``StaticCache``, the decode step compiled where dynamo traces it (the prompt prefilled
  eagerly: the cache initializes itself on its first write).  Skipped, with a message, where
  transformers is not installed.

Weights: ``bf16``, and ``int8`` weight-only (every linear layer, the LM head included:
``F.linear(x, w_int8.to(x.dtype)) * scale``, a per-channel absmax scale, as gpt-fast writes it).

Variants: ``eager``; ``inductor`` (``torch.compile`` default) and ``inductor-ro``
(``mode="reduce-overhead"``: CUDA graphs); ``fxwrap`` (``backend="fxwrap"``, default) and
``fxwrap-ro`` (``mode="reduce-overhead"``).  Each: a warm-up generation (compiles, records),
then the cache zeroed and ``--tokens`` tokens generated after a ``--prompt``-token prompt,
timed end to end, the fastest of ``--repeats`` (ms per step, tokens/s; the prompt's steps
are decode steps too).  Correctness, against eager: the generated
tokens (how many of them equal eager's), and the logits of the first ``CHECK_STEPS`` steps
with eager's tokens fed (teacher forcing, so one flipped near-tie does not derail the rest):
max |difference| over max |eager logit|, ``ok`` under ``--tol``.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import math
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

import fxwrap

CHECK_STEPS = 8


class Tee:
    """Print to stdout and to the --out file."""

    def __init__(self, path: str | None):
        self.file = open(path, "w") if path else None

    def __call__(self, *parts) -> None:
        text = " ".join(str(p) for p in parts)
        print(text, flush=True)
        if self.file:
            self.file.write(text + "\n")
            self.file.flush()


# ---------------------------------------------------------------------------- the hand-written model
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x, cos, sin):
    """Rotate the pairs ``(x[..., :d/2], x[..., d/2:])`` of ``x`` ``[1, heads, 1, d]`` by the position's angles."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, max_seq: int, dtype):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        shape = (1, kv_heads, max_seq, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype), persistent=False)

    def forward(self, x, pos, cos, sin, mask):
        q = self.wq(x).view(1, 1, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(1, 1, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(1, 1, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        keys, values = self.k_cache, self.v_cache
        if self.kv_heads != self.heads:
            keys = keys.repeat_interleave(self.heads // self.kv_heads, dim=1)
            values = values.repeat_interleave(self.heads // self.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(1, 1, -1))


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden, max_seq, dtype):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, max_seq, dtype)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, pos, cos, sin, mask):
        h = x + self.attn(self.attn_norm(x), pos, cos, sin, mask)
        m = self.mlp_norm(h)
        return h + self.w2(F.silu(self.w1(m)) * self.w3(m))


class HandLlama(nn.Module):
    """``forward(token [1, 1] int64, pos [1] int64) -> logits [1, 1, vocab]``: one decode step,
    the KV caches of every layer written at ``pos`` (module buffers, ``index_copy_``)."""

    def __init__(self, layers=12, dim=1024, heads=16, kv_heads=16, hidden=2816, vocab=32000, max_seq=512,
                 dtype=torch.bfloat16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, hidden, max_seq, dtype) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        hd = dim // heads
        freqs = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        angles = torch.outer(torch.arange(max_seq).float(), freqs)          # [max_seq, hd/2]
        self.register_buffer("cos", angles.cos().to(dtype), persistent=False)
        self.register_buffer("sin", angles.sin().to(dtype), persistent=False)
        self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)), persistent=False)
        self.max_seq = max_seq

    def forward(self, token, pos):
        x = self.embed(token)
        cos = self.cos[pos].view(1, 1, 1, -1)
        sin = self.sin[pos].view(1, 1, 1, -1)
        mask = self.causal[pos].view(1, 1, 1, -1)
        for layer in self.layers:
            x = layer(x, pos, cos, sin, mask)
        return self.head(self.norm(x))

    def reset(self) -> None:
        for layer in self.layers:
            layer.attn.k_cache.zero_()
            layer.attn.v_cache.zero_()


# ---------------------------------------------------------------------------- int8 weight-only
class Int8Linear(nn.Module):
    """``F.linear(x, w_int8.to(x.dtype)) * scale``: an int8 ``[N, K]`` weight and a per-output scale."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = linear.bias

    def forward(self, x):
        y = F.linear(x, self.weight.to(x.dtype)) * self.scale
        return y if self.bias is None else y + self.bias


def quantize_int8(module: nn.Module) -> nn.Module:
    """Every ``nn.Linear`` of ``module`` replaced by an ``Int8Linear``, in place."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child))
        else:
            quantize_int8(child)
    return module


# ---------------------------------------------------------------------------- HF transformers
def hf_model(layers, dim, heads, kv_heads, hidden, vocab, max_seq, dtype, device):
    """``(step(token, pos) -> logits, reset(), prefill(tokens), name)`` of a random-weight
    ``LlamaForCausalLM`` with a ``StaticCache``, or a string saying why there is none."""
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
    except ImportError as error:
        return f"transformers is not installed ({error}): pip install transformers"
    config = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_seq)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    wanted = inspect.signature(StaticCache.__init__).parameters
    kwargs = {"config": config, "max_cache_len": max_seq}
    for name, value in (("max_batch_size", 1), ("batch_size", 1), ("device", device), ("dtype", dtype)):
        if name in wanted:
            kwargs[name] = value
    cache = StaticCache(**kwargs)
    params = inspect.signature(model.forward).parameters
    cache_arg = "cache" if "cache" in params else "past_key_values"
    with_position = "cache_position" in params

    def call(model, token, pos):
        """One step: ``token`` ``[1, 1]`` at position ``pos`` (``[1]``)."""
        kw = {cache_arg: cache, "position_ids": pos.view(1, 1)}
        if with_position:
            kw["cache_position"] = pos
        return model(input_ids=token, use_cache=True, **kw).logits

    return model, cache, call, f"transformers {transformers.__version__}"


# ---------------------------------------------------------------------------- running
def compile_variant(fn, variant: str):
    if variant == "eager":
        return fn
    if variant == "inductor":
        return torch.compile(fn, fullgraph=True)
    if variant == "inductor-ro":
        return torch.compile(fn, mode="reduce-overhead", fullgraph=True)
    if variant == "fxwrap":
        return torch.compile(fn, backend=fxwrap.Backend(), fullgraph=True)
    if variant == "fxwrap-ro":
        return torch.compile(fn, backend=fxwrap.Backend(options={"mode": "reduce-overhead"}), fullgraph=True)
    raise ValueError(variant)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def token_tensors(tokens: torch.Tensor) -> list:
    """``[1, n]`` token ids -> ``n`` fresh ``[1, 1]`` tensors, laid out as an argmax's result
    (a slice of the row would have other strides: dynamo would compile the step again)."""
    return [torch.full((1, 1), int(t), dtype=torch.long, device=tokens.device) for t in tokens.view(-1).tolist()]


def generate(step, reset, prompt: list, tokens: int, positions, forced: list | None = None, keep_logits: int = 0):
    """The ``prompt`` tokens then ``tokens`` greedy tokens through ``step(token [1, 1], pos [1])
    -> logits``; ``forced``: the tokens to feed instead of the argmax (teacher forcing).
    Returns ``(generated tokens [1, tokens], logits of the first keep_logits steps after
    the prompt)``."""
    reset()
    out, kept = [], []
    tok = prompt[0]
    mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
    for i in range(len(prompt) + tokens - 1):
        if mark is not None:
            mark()
        logits = step(tok, positions[i])
        if i + 1 < len(prompt):
            tok = prompt[i + 1]
            continue
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        if len(kept) < keep_logits:
            kept.append(logits[0, -1].float().clone())
        tok = forced[len(out)] if forced is not None else nxt
        out.append(nxt)
    return torch.cat(out, dim=1), kept


def run_model(name, build, variants, args, device, say) -> list:
    rows = []
    prompt = token_tensors(torch.randint(0, args.vocab, (1, args.prompt), device=device))
    positions = [torch.tensor([i], device=device) for i in range(args.max_seq)]
    reference = None
    for variant in variants:
        torch._dynamo.reset()
        step, reset = build()
        compiled = compile_variant(step, variant)
        row = {"model": name, "variant": variant}
        try:
            t0 = time.perf_counter()
            with contextlib.redirect_stderr(io.StringIO()) if not args.verbose else contextlib.nullcontext():
                generate(compiled, reset, prompt, min(args.tokens, 4), positions)  # compile + record
                generate(compiled, reset, prompt, min(args.tokens, 4), positions)
            sync(device)
            row["warmup_s"] = time.perf_counter() - t0
            elapsed = math.inf
            for _ in range(args.repeats):  # the fastest timed generation: others' load only adds time
                sync(device)
                t0 = time.perf_counter()
                toks, _ = generate(compiled, reset, prompt, args.tokens, positions)
                sync(device)
                elapsed = min(elapsed, time.perf_counter() - t0)
            steps = args.prompt + args.tokens - 1
            row["ms"] = 1e3 * elapsed / steps
            row["tok_s"] = steps / elapsed
            check = min(CHECK_STEPS, args.tokens)
            if reference is None:
                reference = (toks, generate(compiled, reset, prompt, check, positions, forced=token_tensors(toks),
                                            keep_logits=check)[1])
            forced_logits = generate(compiled, reset, prompt, check, positions,
                                     forced=token_tensors(reference[0]), keep_logits=check)[1]
            err = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))
                      for a, b in zip(forced_logits, reference[1]))
            agree = sum(int(a.argmax() == b.argmax()) for a, b in zip(forced_logits, reference[1]))
            same = int((toks == reference[0]).cumprod(1).sum())
            row.update(err=err, argmax=f"{agree}/{len(reference[1])}", tokens_equal=f"{same}/{args.tokens}",
                       ok=err <= args.tol)
        except Exception as error:  # noqa: BLE001 - a variant that fails is a row of the table
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
            if args.verbose:
                traceback.print_exc()
        rows.append(row)
        say("  " + format_row(row))
    return rows


def format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:<16} {r['variant']:<12} FAILED {r['error']}"
    return (f"{r['model']:<16} {r['variant']:<12} {r['ms']:8.3f} ms/token {r['tok_s']:9.1f} tok/s  "
            f"logits err {r['err']:.1e} ({'ok' if r['ok'] else 'FAIL'}), argmax {r['argmax']}, "
            f"tokens = eager's {r['tokens_equal']}, warm-up {r['warmup_s']:.1f}s")


def table(rows, say) -> None:
    say("\n| model | variant | ms/token | tokens/s | vs eager | vs inductor-ro | logits err | tokens = eager |")
    say("|---|---|---|---|---|---|---|---|")
    for model in dict.fromkeys(r["model"] for r in rows):
        part = {r["variant"]: r for r in rows if r["model"] == model}
        for r in part.values():
            if "error" in r:
                say(f"| {model} | {r['variant']} | failed: {r['error']} | | | | | |")
                continue
            vs = lambda other: (f"{part[other]['ms'] / r['ms']:.2f}x" if other in part and "ms" in part[other]  # noqa: E731
                                else "-")
            say(f"| {model} | {r['variant']} | {r['ms']:.3f} | {r['tok_s']:.0f} | {vs('eager')} | "
                f"{vs('inductor-ro')} | {r['err']:.1e}{'' if r['ok'] else ' FAIL'} | {r['tokens_equal']} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="hand,hf")
    ap.add_argument("--weights", default="bf16,int8")
    ap.add_argument("--variants", default="eager,inductor,inductor-ro,fxwrap,fxwrap-ro")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (runs on a CPU in seconds)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hf-layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=0, help="grouped KV heads of the hand model (default: --heads)")
    ap.add_argument("--hf-kv-heads", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2816)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--max-seq", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed generations per variant (the fastest kept)")
    ap.add_argument("--tol", type=float, default=0.05, help="max logits error (relative to max |eager logit|)")
    ap.add_argument("--out", default="")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.hf_layers, args.dim, args.heads, args.hidden = 2, 2, 64, 4, 128
        args.vocab, args.max_seq, args.prompt, args.tokens = 256, 32, 4, 8
        args.hf_kv_heads = 2
    args.kv_heads = args.kv_heads or args.heads
    say = Tee(args.out or None)
    device = torch.device(args.device)
    dtype = torch.bfloat16
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    say(f"# decode: {name}, torch {torch.__version__}, batch 1, bf16 activations; command: "
        f"python benchmarks/decode.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    for key in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, key):
            setattr(torch._dynamo.config, key, 64)
    variants = [v for v in args.variants.split(",") if v]
    rows = []
    torch.manual_seed(0)
    for weights in [w for w in args.weights.split(",") if w]:
        for model_name in [m for m in args.models.split(",") if m]:
            label = f"{model_name}-{weights}"
            if model_name == "hand":
                torch.manual_seed(0)
                model = HandLlama(args.layers, args.dim, args.heads, args.kv_heads, args.hidden, args.vocab,
                                  args.max_seq, dtype).to(device=device, dtype=dtype).eval()
                for p in model.parameters():  # peaked logits: greedy tokens far from ties
                    if p.dim() == 2:
                        nn.init.normal_(p, std=1.5 / math.sqrt(p.shape[1]))
                if weights == "int8":
                    quantize_int8(model)
                say(f"\n## {label}: {args.layers} layers, {args.dim} wide, {args.heads} heads "
                    f"({args.kv_heads} KV), max_seq {args.max_seq}, vocab {args.vocab}")

                def build(model=model):
                    return (lambda tok, pos: model(tok, pos)), model.reset
            elif model_name == "hf":
                made = hf_model(args.hf_layers, args.dim, args.heads, args.hf_kv_heads, args.hidden, args.vocab,
                                args.max_seq, dtype, device)
                if isinstance(made, str):
                    say(f"\n## {label}: skipped: {made}")
                    continue
                model, cache, call, version = made
                if weights == "int8":
                    quantize_int8(model.model)
                    model.lm_head = Int8Linear(model.lm_head)
                say(f"\n## {label}: LlamaForCausalLM ({version}), {args.hf_layers} layers, {args.dim} wide, "
                    f"{args.hf_kv_heads} KV heads, StaticCache of {args.max_seq}")

                def build(model=model, cache=cache, call=call):
                    def step(tok, pos):
                        return call(model, tok, pos)

                    def reset():
                        cache.reset()
                        with torch.no_grad():  # the cache initializes itself on its first write: eagerly
                            call(model, torch.zeros(1, 1, dtype=torch.long, device=device),
                                 torch.zeros(1, dtype=torch.long, device=device))
                        cache.reset()
                    return step, reset
            else:
                say(f"unknown model {model_name!r} (hand, hf)")
                return 2
            with torch.no_grad():
                rows += run_model(label, build, variants, args, device, say)
    table(rows, say)
    failed = [r for r in rows if "error" in r or not r.get("ok", True)]
    if failed:
        say(f"\n{len(failed)} row(s) failed or disagree with eager: "
            + ", ".join(f"{r['model']}/{r['variant']}" for r in failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
