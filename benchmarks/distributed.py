"""Distributed training step time: eager vs Inductor vs fxwrap, DDP and FSDP2, in one run.

    torchrun --nproc-per-node 2 benchmarks/distributed.py                  # 2 GPUs, nccl
    python benchmarks/distributed.py --nprocs 2 --device cpu --quick        # smoke check: gloo, CPU
    torchrun --nproc-per-node 2 benchmarks/distributed.py --markdown out.md --json out.json
    torchrun --nproc-per-node 2 benchmarks/distributed.py --wrappings ddp --compiled-autograd

The model is issue 17's: a transformer of 3 pre-norm blocks, 512 wide
(``nn.MultiheadAttention``, 8 heads; a GELU MLP 4x wide), a linear head, MSE loss, SGD.
For each wrapping (``ddp``: ``DistributedDataParallel``, compiled through dynamo's DDP graph
splitting, ``torch._dynamo.config.optimize_ddp``; ``fsdp``: FSDP2, ``fully_shard`` per block
and on the root) and each backend (eager, ``torch.compile`` with Inductor, with
``backend="fxwrap"``), every rank:

1. runs ``--check-steps`` (6) steps from the same initial weights on the same batches and
   compares each backend's losses with eager's (max abs difference, printed);
2. times ``--rounds`` rounds; a round runs ``--steps`` steps of each backend one after the
   other (eager, Inductor, fxwrap), so machine noise hits all three alike; a step is
   forward, backward and ``optimizer.step()``, ended by a device synchronize.

Rank 0 prints the median ms per step of each backend (over the rounds, the slowest
rank's time per round) and the ratio to eager.  Launch with ``torchrun`` (one process
per GPU; the environment gives rank and world size) or with ``--nprocs N``
(``torch.multiprocessing.spawn``; a file store, no port needed).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

BACKENDS = ("eager", "inductor", "fxwrap")


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, width: int, heads: int, blocks: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(blocks))
        self.head = nn.Linear(width, width)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _wrap(base: nn.Module, wrapping: str, backend: str, device: torch.device) -> nn.Module:
    model = copy.deepcopy(base)
    if wrapping == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    if backend == "inductor":
        model = torch.compile(model)
    elif backend == "fxwrap":
        import fxwrap
        model = torch.compile(model, backend=fxwrap.Backend())
    return model


def _backward_compiler(backend: str):
    """``--compiled-autograd``: the callable compiled autograd compiles each backward with
    (the same backend as the forward), or None for eager."""
    if backend == "inductor":
        return torch.compile(backend="inductor")
    if backend == "fxwrap":
        import fxwrap
        return torch.compile(backend=fxwrap.Backend())
    return None


def _step(model, opt, x, y, backward_compiler=None) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(x), y)
    if backward_compiler is None:
        loss.backward()
    else:  # compiled autograd (a private API of torch 2.11-2.13)
        with torch._dynamo.compiled_autograd._enable(backward_compiler):
            loss.backward()
    opt.step()
    return loss.detach()


def run(rank: int, world: int, args) -> dict | None:
    device = torch.device("cuda", rank % torch.cuda.device_count()) if args.device == "cuda" \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.compiled_autograd and args.optimize_ddp is None:
        args.optimize_ddp = "python_reducer"  # DDP's all-reduces inside the compiled backward
    if args.optimize_ddp is not None:
        value = {"true": True, "false": False}.get(args.optimize_ddp, args.optimize_ddp)
        torch._dynamo.config.optimize_ddp = value
    torch.manual_seed(0)
    base = Transformer(args.width, args.heads, args.blocks).to(device)
    torch.manual_seed(1000 + rank)
    batches = [(torch.randn(args.batch, args.seq, args.width, device=device),
                torch.randn(args.batch, args.seq, args.width, device=device))
               for _ in range(max(args.check_steps, 1))]
    results: dict = {}
    for wrapping in args.wrappings:
        models = {b: _wrap(base, wrapping, b, device) for b in args.backends}
        opts = {b: torch.optim.SGD(m.parameters(), lr=args.lr) for b, m in models.items()}
        compilers = {b: _backward_compiler(b) if args.compiled_autograd else None for b in args.backends}
        step = {b: (lambda m, o, x, y, b=b: _step(m, o, x, y, compilers[b])) for b in args.backends}
        losses, first_call = {}, {}
        for b in args.backends:  # the check, and the compile (first call)
            start = time.perf_counter()
            losses[b] = [step[b](models[b], opts[b], x, y) for x, y in batches[:args.check_steps]]
            _sync(device)
            first_call[b] = time.perf_counter() - start
        times = {b: [] for b in args.backends}
        x, y = batches[0]
        for _ in range(args.warmup):
            for b in args.backends:
                step[b](models[b], opts[b], x, y)
        _sync(device)
        for _ in range(args.rounds):
            for b in args.backends:
                dist.barrier()
                _sync(device)
                start = time.perf_counter()
                for _ in range(args.steps):
                    step[b](models[b], opts[b], x, y)
                _sync(device)
                # on the rank's device: nccl reduces only device tensors (a CPU tensor crashed it)
                elapsed = torch.tensor([(time.perf_counter() - start) / args.steps * 1e3], device=device)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step time
                times[b].append(float(elapsed))
        row = {}
        eager_losses = torch.stack(losses["eager"]).cpu() if "eager" in losses else None
        for b in args.backends:
            mine = torch.stack(losses[b]).cpu()
            row[b] = {"ms_per_step": statistics.median(times[b]), "rounds_ms": times[b],
                      "first_call_s": first_call[b], "losses": mine.tolist(),
                      "max_loss_diff_vs_eager": None if eager_losses is None
                      else float((mine - eager_losses).abs().max())}
        results[wrapping] = row
        del models, opts
    return results if rank == 0 else None


def report(results: dict, args, world: int, device_name: str) -> str:
    lines = [f"distributed training step: {args.blocks} blocks, width {args.width}, {args.heads} heads, "
             f"batch {args.batch}x{args.seq}, SGD; {world} processes on {device_name} "
             f"({'nccl' if args.device == 'cuda' else 'gloo'}); median of {args.rounds} rounds of "
             f"{args.steps} steps; torch {torch.__version__}"
             + ("; compiled autograd" if args.compiled_autograd else "")
             + (f"; optimize_ddp={args.optimize_ddp}" if args.optimize_ddp is not None else ""), "",
             "| wrapping | backend | ms/step | vs eager | first call s | max loss diff vs eager |",
             "|---|---|---|---|---|---|"]
    for wrapping, row in results.items():
        eager = row.get("eager", {}).get("ms_per_step")
        for b, r in row.items():
            ratio = f"{r['ms_per_step'] / eager:.3f}x" if eager else "-"
            diff = "-" if r["max_loss_diff_vs_eager"] is None else f"{r['max_loss_diff_vs_eager']:.2e}"
            lines.append(f"| {wrapping} | {b} | {r['ms_per_step']:.2f} | {ratio} | "
                         f"{r['first_call_s']:.1f} | {diff} |")
    return "\n".join(lines)


def _main_in_group(rank: int, world: int, args) -> None:
    torch.set_num_threads(max(1, args.threads))
    results = run(rank, world, args)
    if rank == 0:
        name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
        text = report(results, args, world, name)
        print(text, flush=True)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(text + "\n")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "world": world, "device": name, "results": results}, f, indent=1)


def _spawned(rank: int, world: int, store: str, args) -> None:
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        _main_in_group(rank, world, args)
    finally:
        dist.destroy_process_group()


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--nprocs", type=int, default=None, help="spawn this many processes (else: torchrun's)")
    p.add_argument("--wrappings", default="ddp,fsdp", type=lambda s: s.split(","))
    p.add_argument("--backends", default=",".join(BACKENDS), type=lambda s: s.split(","))
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--check-steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    p.add_argument("--optimize-ddp", default=None,
                   help="torch._dynamo.config.optimize_ddp (true, false, python_reducer, ...)")
    p.add_argument("--compiled-autograd", action="store_true",
                   help="compile the backward too (compiled autograd; DDP: optimize_ddp=python_reducer, "
                        "the gradient all-reduces inside the compiled backward)")
    p.add_argument("--quick", action="store_true", help="a small model and few steps (a smoke check)")
    p.add_argument("--markdown", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.compiled_autograd and len([b for b in args.backends if b != "eager"]) > 1:
        # compiled autograd caches compiled backward graphs by their structure, not by the
        # compiler: two compiled backends in one process would share them
        p.error("--compiled-autograd times one compiled backend per run: --backends eager,fxwrap "
                "and --backends eager,inductor")
    if args.quick:
        args.width, args.heads, args.batch, args.seq = 64, 4, 2, 16
        args.check_steps, args.warmup, args.rounds, args.steps = 3, 1, 2, 2
    return args


def main(argv=None) -> None:
    args = parse(argv if argv is not None else sys.argv[1:])
    if args.nprocs is not None:
        import torch.multiprocessing as mp
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_spawned, args=(args.nprocs, os.path.join(tmp, "store"), args), nprocs=args.nprocs)
        return
    # torchrun: rank, world size and the store come from the environment
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    try:
        _main_in_group(dist.get_rank(), dist.get_world_size(), args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
