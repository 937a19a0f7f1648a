"""What the input guard costs per call: for each program of the model suite (inference,
and the training forward and backward, which take every parameter and saved tensor), the
time of ``guard(*inputs)`` alone next to the time of a whole call of the GraphModule.

    python benchmarks/guard_cost.py [--device cpu|cuda] [--models gpt,llama,...] [--size small]

Prints, per program: the number of inputs (tensors), the guard's microseconds per call
(median of 7 repeats of 2000 calls), the program's microseconds per call, and the share.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_models  # noqa: E402

import fxwrap  # noqa: E402
from fxwrap.ir.symbolic import evaluate  # noqa: E402


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def per_call_us(fn, device, calls: int, repeats: int = 7) -> float:
    for _ in range(min(calls, 50)):
        fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="gpt,llama,convnet,mlp")
    parser.add_argument("--size", default="small")
    args = parser.parse_args(argv)
    by_name = {m.name: m for m in suite_models.MODELS}
    print(f"{'program':28s} {'inputs':>6s} {'tensors':>7s} {'guard us':>9s} {'call us':>9s} {'share':>6s}")
    for name in args.models.split(","):
        model, make_inputs, _ = by_name[name].build(args.device, args.size)
        model = model.to(args.device)
        inputs = make_inputs(0)
        programs = []
        torch._dynamo.reset()
        fxwrap.compile(model, options={"on_program": programs.append})(*inputs)
        torch._dynamo.reset()
        training = fxwrap.lower(model, *inputs, training=True)
        programs += [training.forward, training.backward]
        recorded = {}
        for kind, program in [("inference", programs[0]), ("forward", programs[-2]), ("backward", programs[-1])]:
            values = _example_values(program, recorded)
            guard = program.input_guard
            guard_us = per_call_us(lambda: guard(*values), args.device, 2000)
            runner = program.runner
            call_us = per_call_us(lambda: runner(*values), args.device, 200 if args.device == "cpu" else 1000)
            tensors = sum(isinstance(v, torch.Tensor) for v in values)
            print(f"{name + ' ' + kind:28s} {len(values):6d} {tensors:7d} {guard_us:9.2f} {call_us:9.1f} "
                  f"{guard_us / call_us:6.1%}")
    return 0


def _example_values(program, recorded) -> list:
    """Inputs of the program's own layouts: random tensors, the size hints as ints."""
    values = []
    for inp in program.inputs:
        if isinstance(inp, fxwrap.lines.SizeInput):
            values.append(int(inp.hint))
            continue
        size = [int(evaluate(n, program.hints)) for n in inp.size]
        stride = [int(evaluate(s, program.hints)) for s in inp.stride]
        if inp.dtype.is_floating_point:
            base = torch.randn(max(1, sum((n - 1) * s for n, s in zip(size, stride)) + 1), dtype=inp.dtype)
        else:
            base = torch.zeros(max(1, sum((n - 1) * s for n, s in zip(size, stride)) + 1), dtype=inp.dtype)
        values.append(base.to(inp.device).as_strided(size, stride))
    return values


if __name__ == "__main__":
    raise SystemExit(main())
