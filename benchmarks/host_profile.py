"""Where the host (Python) time of a compiled model's call goes: cProfile over repeated
steps of a suite model, fxwrap and, for comparison, Inductor.

    python benchmarks/host_profile.py --model llama --variant training-bf16 [--steps 10] [--top 30]

Prints, per backend, the host time per step (the GPU is synchronized only after the
profiled steps) and the functions with the most time of their own (tottime), then by
cumulative time.  CUDA is where this matters: a step whose host time exceeds its GPU
time leaves the GPU idle.
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_models  # noqa: E402

import fxwrap  # noqa: E402,F401  (registers the backend from a source tree)


def _step(model, inputs, training):
    if training:
        out = model(*inputs)
        out.float().sum().backward() if out.dim() else out.backward()
        return None
    with torch.no_grad():
        return model(*inputs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama")
    parser.add_argument("--variant", default="training-bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default=None)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--backends", default="fxwrap,inductor")
    args = parser.parse_args(argv)
    training = args.variant.startswith("training")
    dtype = torch.bfloat16 if args.variant.endswith("bf16") else torch.float32
    size = args.size or ("small" if args.device == "cpu" else "large")
    entry = {m.name: m for m in suite_models.MODELS}[args.model]
    torch.manual_seed(0)
    base, make_inputs, _ = entry.build(args.device, size)
    base = base.to(device=args.device, dtype=dtype).train(training)
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in make_inputs(1))
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for backend in args.backends.split(","):
        torch._dynamo.reset()
        model = torch.compile(copy.deepcopy(base), backend=backend)
        for _ in range(3):
            _step(model, inputs, training)
        sync()
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        for _ in range(args.steps):
            _step(model, inputs, training)
        profiler.disable()
        host = (time.perf_counter() - start) / args.steps * 1e3
        sync()
        print(f"== {backend} {args.model} {args.variant}: host {host:.2f} ms per step under cProfile")
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(args.top)
            lines = text.getvalue().splitlines()
            start_at = next(i for i, line in enumerate(lines) if "ncalls" in line)
            print(f"-- by {order}")
            print("\n".join(lines[start_at:start_at + args.top + 1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
