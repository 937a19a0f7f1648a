"""The C++ target's split scan against its per-row scan and eager, on the CPU: ``torch.cumsum``
(or another scan) of ``rows x n`` compiled twice by fxwrap (``target="cpu"``): once as it is,
once with the split rule off (``CppEmitter.scan_split_max_rows = 0``: one task per row, the
rendering before the split scan), timed interleaved in one process with eager and a copy of
the same bytes, for each thread count (``torch.set_num_threads``: the kernels' OpenMP runtime
is torch's ``libgomp``).

    python benchmarks/cpu_split_scan.py [--op cumsum] [--dtype float32] [--threads 1 2] [--kernel]
                                        [--shapes 1x1048576 1x4194304 8x262144]

Prints, per shape and thread count, the median ms of each (rounds of one call of each, in
turn; ``--kernel``: the kernels alone on preallocated buffers, eager with ``out=``), the
split's speed-up over eager and over per-row, and the fraction of the copy's bandwidth the
split reaches (copy time / split time: both read and write the tensor's bytes once).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import fxwrap
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.ir.lines import CallKernel

OPS = {
    "cumsum": lambda x, **out: torch.cumsum(x, -1, **out),
    "cumprod": lambda x, **out: torch.cumprod(x, -1, **out),
    "logcumsumexp": lambda x, **out: torch.logcumsumexp(x, -1, **out),
    "cummax": lambda x: torch.cummax(x, -1).values,
}


def programs(fn, x):
    split = fxwrap.lower(fn, x, options={"target": "cpu", "cache": False})
    saved = CppEmitter.scan_split_max_rows
    CppEmitter.scan_split_max_rows = 0
    try:
        per_row = fxwrap.lower(fn, x, options={"target": "cpu", "cache": False})
    finally:
        CppEmitter.scan_split_max_rows = saved
    return split, per_row


def kernel_call(program, x):
    """The program's one kernel called directly on preallocated outputs and workspaces
    (no allocation, no wrapper): ``--kernel``."""
    (call,) = [line for line in program.lines if isinstance(line, CallKernel)]
    args = []
    for arg, value in zip(call.kernel.signature, call.args):
        if arg.role == "input":
            args.append(x)
        elif arg.role in ("output", "workspace"):
            args.append(torch.empty([int(n) for n in value.size], dtype=value.dtype))
        else:
            args.append(int(value))
    launcher = call.kernel.launcher()
    return lambda: launcher(*args)


def timed(fns: dict, rounds: int) -> dict:
    for f in fns.values():
        for _ in range(3):
            f()
    samples = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():  # interleaved: a burst of noise hits all of them
            t0 = time.perf_counter()
            f()
            samples[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="cumsum", choices=sorted(OPS))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shapes", nargs="+", default=["1x1048576", "1x4194304", "8x262144"])
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--kernel", action="store_true",
                    help="time the kernels alone on preallocated buffers (eager: out=), not whole calls")
    a = ap.parse_args()
    fn, dtype = OPS[a.op], getattr(torch, a.dtype)
    print(f"# cpu ({torch.get_num_threads()} threads available), torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {a.op} {a.dtype}")
    for shape in a.shapes:
        rows, n = map(int, shape.split("x"))
        x = torch.randn(rows, n, dtype=dtype)
        split, per_row = programs(fn, x)
        want = fn(x)
        for p in (split, per_row):
            torch.testing.assert_close(p.run(x), want, rtol=1e-3, atol=1e-2 * max(1.0, n ** 0.5 / 100))
        dst = torch.empty_like(x)
        for threads in a.threads:
            torch.set_num_threads(threads)
            if a.kernel and a.op != "cummax":
                fns = {"eager": lambda: fn(x, out=dst), "per_row": kernel_call(per_row, x),
                       "split": kernel_call(split, x)}
            else:
                fns = {"eager": lambda: fn(x), "per_row": lambda: per_row.run(x), "split": lambda: split.run(x)}
            t = timed({**fns, "copy": lambda: dst.copy_(x)}, a.rounds)
            print(f"{rows}x{n:<9} {threads} thr: eager {t['eager']:7.3f} ms  per-row {t['per_row']:7.3f} ms  "
                  f"split {t['split']:7.3f} ms  copy {t['copy']:7.3f} ms | eager/split {t['eager'] / t['split']:5.2f}  "
                  f"per-row/split {t['per_row'] / t['split']:5.2f}  copy/split {t['copy'] / t['split']:5.2f}")


if __name__ == "__main__":
    main()
