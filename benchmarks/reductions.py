"""Reductions over a non-contiguous dimension on the GPU: eager, Inductor and fxwrap against
a copy of the same input, in one process.

    python benchmarks/reductions.py --out reductions.log
    python benchmarks/reductions.py --cases bn_stats --dtypes bfloat16 --out bn.log

Cases (the shapes vision nets reduce; batch 32 at 224x224):

* ``middle_mean``: ``x.mean(1)`` of ``[A, R, B]`` (a squeeze-excitation's spatial mean over
  a channels-last activation seen as ``[N, H*W, C]``);
* ``spatial_mean``: ``x.mean((2, 3))`` of a channels-last ``[N, C, H, W]`` tensor;
* ``bn_stats``: ``torch.var_mean(x, (0, 2, 3))`` of a channels-last ``[N, C, H, W]``: batch
  norm's training statistics (a Welford reduction over N*H*W per channel);
* ``rmsnorm``: HF Llama's RMSNorm forward of ``[rows, width]`` (float32 statistics, the
  weight in the input's dtype); ``rmsnorm_train``: its forward and backward (the weight's
  gradient is a column reduction over the rows).  Their "% of copy" is the bytes of the
  input over a copy's time (a forward reads and writes about that much; the backward more).
* ``argmax_rows``: ``x.argmax(-1)`` over rows (logits of a batch of tokens, GPT-2's and Llama
  3's vocabularies); ``max_dim_rows``: ``x.max(-1)``, values and indices; ``amax_rows``: the
  plain row max of the same rows, the bandwidth an arg-reduction should reach (the same reads)::

      python benchmarks/reductions.py --cases argmax_rows,max_dim_rows,amax_rows --out argmax.log

Per case and backend: microseconds per call (CUDA events over back-to-back calls queued
behind a GPU spin longer than their host time, so kernels only; the median of rounds), and the bandwidth it reaches as a share of a copy's: a reduction reads
the input once, a copy reads and writes it, so ``% of copy = (bytes / t) / (2 * bytes /
t_copy)``.  fxwrap's kernel plans (``split-outer``, ``looped`` ...) are printed with it.
The issue's bar: mean over the middle dim and batch-norm statistics at >= 85% of copy.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import fxwrap

CASES = {
    "middle_mean": [(32, 12544, 32), (32, 3136, 144), (32, 196, 672), (64, 4096, 256)],
    "spatial_mean": [(32, 32, 112, 112), (32, 240, 28, 28), (32, 1152, 7, 7)],
    "bn_stats": [(32, 64, 112, 112), (32, 256, 56, 56), (32, 512, 28, 28)],
    "rmsnorm": [(2048, 1024), (4096, 4096)],
    "rmsnorm_train": [(2048, 1024), (4096, 4096)],
    "argmax_rows": [(4096, 32000), (32, 50257), (8192, 1024), (1, 128256)],
    "max_dim_rows": [(4096, 32000), (32, 50257), (8192, 1024), (1, 128256)],
    "amax_rows": [(4096, 32000), (32, 50257), (8192, 1024), (1, 128256)],
}
#: the cases over rows: what each computes
ROW_FUNCTIONS = {"argmax_rows": lambda x: x.argmax(-1), "max_dim_rows": lambda x: tuple(x.max(-1)),
                 "amax_rows": lambda x: x.amax(-1)}


def _rmsnorm(x, w):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)



def _input(case, shape, dtype):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    if case.startswith("rmsnorm"):
        w = torch.rand(shape[-1], device="cuda", dtype=dtype) + 0.5
        if case == "rmsnorm_train":
            x.requires_grad_()
            w.requires_grad_()
        return (x, w)
    return (x.to(memory_format=torch.channels_last) if len(shape) == 4 else x,)


def _fn(case):
    if case == "rmsnorm":
        return _rmsnorm
    if case == "rmsnorm_train":
        return _rmsnorm  # timed with its backward (_step)
    if case in ROW_FUNCTIONS:
        return ROW_FUNCTIONS[case]
    if case == "middle_mean":
        return lambda x: x.mean(1)
    if case == "spatial_mean":
        return lambda x: x.mean((2, 3))
    return lambda x: torch.var_mean(x, dim=(0, 2, 3), correction=0)


def _step(case, fn):
    """What one timed call runs: ``fn``, and for ``rmsnorm_train`` its backward too."""
    if case != "rmsnorm_train":
        return fn

    def step(x, w):
        out = fn(x, w)
        out.backward(torch.ones_like(out))
        x.grad = w.grad = None
        return out
    return step


def _time(fn, x, rounds, reps):
    fn(*x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        fn(*x)
    host = (time.perf_counter() - start) / 3  # a call's host time (dynamo, autograd, launches)
    torch.cuda.synchronize()
    # the GPU spins while the host queues every call (1.5x their host time at up to 2 GHz):
    # the events then time the kernels back to back, not the host's launches
    spin = int(1.5 * host * reps * 2e9) + 1_000_000
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(spin)
        start.record()
        for _ in range(reps):
            fn(*x)
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
             f"{'inductor':>9} {'%copy':>6} | {'fxwrap':>9} {'%copy':>6} | fx/ind | fxwrap plans"]
    details = ["# fxwrap's reduction kernels: the config autotuning chose, every candidate's time"]
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
                    got, want = f(*x), fn(*x)
                    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                        exact = not w.dtype.is_floating_point  # indices: eager's, the first of the best
                        torch.testing.assert_close(g.float(), w.float(), rtol=0 if exact else 2e-2,
                                                   atol=0 if exact else 2e-2,
                                                   msg=lambda m: f"{case} {shape} {name}: {m}")
                    if case == "rmsnorm_train":  # the backward compiles on the first call
                        _step(case, f)(*x)
                copy = _time(lambda t, *rest: t.detach().clone(memory_format=torch.preserve_format),
                             x, args.rounds, args.reps)
                times = {name: _time(_step(case, f), x, args.rounds, args.reps) for name, f in backends.items()}
                share = {name: 100 * (copy / 2) / t for name, t in times.items()}
                kernels = [n.target for p in programs for n in p.graph_module.graph.nodes
                           if isinstance(n.target, fxwrap.Kernel)]
                plans = sorted({getattr(k.launch, "plan", "?") for k in kernels})
                line = (f"{case:<13} {dtype_name:<9} {str(shape):<22} {copy:8.1f} | "
                        + " | ".join(f"{times[n]:9.1f} {share[n]:5.0f}%" for n in ("eager", "inductor", "fxwrap"))
                        + f" | {times['fxwrap'] / times['inductor']:5.2f}x | {','.join(plans)}")
                for k in kernels:  # the config each reduction kernel autotuned to, and its candidates' times
                    if k.launch.plan not in ("pointwise1d", "pointwise2d"):
                        cfg = ",".join(f"{a}={b}" for a, b in k.launch.config)
                        tm = " ".join(f"[{c}]={t * 1e3:.1f}us" for c, t in k.launch.timings_ms)
                        details.append(f"#   {case} {dtype_name} {shape} {k.name} {k.launch.plan}: "
                                       f"{cfg} combine={k.launch.combine_config} | {tm}")
                lines.append(line)
                print(line, flush=True)
    print("\n".join(details), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines + details) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
