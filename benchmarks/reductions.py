"""Reductions over a non-contiguous dimension on the GPU: eager, Inductor and fxwrap against
a copy of the same input, in one process.

    python benchmarks/reductions.py --out reductions.log
    python benchmarks/reductions.py --cases bn_stats --dtypes bfloat16 --out bn.log

Cases (the shapes vision nets reduce; batch 32 at 224x224):

* ``middle_mean``: ``x.mean(1)`` of ``[A, R, B]`` (a squeeze-excitation's spatial mean over
  a channels-last activation seen as ``[N, H*W, C]``);
* ``spatial_mean``: ``x.mean((2, 3))`` of a channels-last ``[N, C, H, W]`` tensor;
* ``bn_stats``: ``torch.var_mean(x, (0, 2, 3))`` of a channels-last ``[N, C, H, W]``: batch
  norm's training statistics (a Welford reduction over N*H*W per channel).

Per case and backend: microseconds per call (CUDA events over back-to-back calls, the
median of rounds), and the bandwidth it reaches as a share of a copy's: a reduction reads
the input once, a copy reads and writes it, so ``% of copy = (bytes / t) / (2 * bytes /
t_copy)``.  fxwrap's kernel plans (``split-outer``, ``looped`` ...) are printed with it.
The issue's bar: mean over the middle dim and batch-norm statistics at >= 85% of copy.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

import fxwrap

CASES = {
    "middle_mean": [(32, 12544, 32), (32, 3136, 144), (32, 196, 672), (64, 4096, 256)],
    "spatial_mean": [(32, 32, 112, 112), (32, 240, 28, 28), (32, 1152, 7, 7)],
    "bn_stats": [(32, 64, 112, 112), (32, 256, 56, 56), (32, 512, 28, 28)],
}


def _input(case, shape, dtype):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    return x.to(memory_format=torch.channels_last) if len(shape) == 4 else x


def _fn(case):
    if case == "middle_mean":
        return lambda x: x.mean(1)
    if case == "spatial_mean":
        return lambda x: x.mean((2, 3))
    return lambda x: torch.var_mean(x, dim=(0, 2, 3), correction=0)


def _time(fn, x, rounds, reps):
    fn(x)
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)  # the launches queue up behind it: device time only
        start.record()
        for _ in range(reps):
            fn(x)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/reductions.py needs a CUDA GPU; skipped", file=sys.stderr)
        return 0
    lines = [f"# {torch.cuda.get_device_name()}: torch {torch.__version__}",
             f"{'case':<13} {'dtype':<9} {'shape':<22} {'copy us':>8} | {'eager us':>9} {'%copy':>6} | "
             f"{'inductor':>9} {'%copy':>6} | {'fxwrap':>9} {'%copy':>6} | fxwrap plans"]
    print("\n".join(lines), flush=True)
    for case in args.cases.split(","):
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            for shape in CASES[case]:
                torch._dynamo.reset()
                x = _input(case, shape, dtype)
                fn = _fn(case)
                programs = []
                backends = {"eager": fn, "inductor": torch.compile(fn),
                            "fxwrap": torch.compile(fn, backend=fxwrap.Backend(
                                "cuda", {"on_program": programs.append, "cache": False}))}
                for name, f in backends.items():  # compile, and check against eager
                    got, want = f(x), fn(x)
                    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                        torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2,
                                                   msg=lambda m: f"{case} {shape} {name}: {m}")
                copy = _time(lambda t: t.clone(memory_format=torch.preserve_format), x, args.rounds, args.reps)
                times = {name: _time(f, x, args.rounds, args.reps) for name, f in backends.items()}
                share = {name: 100 * (copy / 2) / t for name, t in times.items()}
                plans = sorted({n.target.launch.get("plan", "?") for p in programs
                                for n in p.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)})
                line = (f"{case:<13} {dtype_name:<9} {str(shape):<22} {copy:8.1f} | "
                        + " | ".join(f"{times[n]:9.1f} {share[n]:5.0f}%" for n in ("eager", "inductor", "fxwrap"))
                        + f" | {','.join(plans)}")
                lines.append(line)
                print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
