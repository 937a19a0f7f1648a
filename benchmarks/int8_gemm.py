#!/usr/bin/env python
"""Int8 weight-only GEMM on the CPU: eager vs Inductor vs fxwrap, one process, interleaved.

    python benchmarks/int8_gemm.py [--threads 1,2] [--dtypes bfloat16,float32] [--quick] [--json out.json]

Workloads (issue 18): ``aten._weight_int8pack_mm(x, w, scales)`` ("op") and the
dequantize-and-linear pattern ``F.linear(x, w.to(x.dtype)) * scales`` ("pattern"), batch 1
and 32, weights ``4096x4096`` and ``11008x4096`` int8.  For each thread count
(``torch.set_num_threads``: the kernels' OpenMP runtime is torch's ``libgomp``), and in
the same run:

* copy bandwidth: a 256 MiB fp32 ``dst.copy_(src)``, (bytes read + bytes written) / median
  time; the *weight-read time* of a workload is its int8 weight bytes / that bandwidth
  (the memory bound of batch 1);
* each workload: eager, ``torch.compile`` (Inductor), ``torch.compile(backend=fxwrap)``
  (default options: templates "auto", the choice printed); the variants' repeats
  interleaved round-robin, median of the mean time per call.  Every call reads the
  next of ``ROTATE`` copies of the weights (together larger than the last-level cache),
  so a call streams its weights from memory as a model's layers do;
* bars: fxwrap >= 2x faster than eager; batch 1 within 1.5x of the weight-read time.

Results are checked against eager (bf16: eager's pattern rounds the product to bf16
before the scale, the op rounds once: 2e-2 relative).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fxwrap  # noqa: E402

ROTATE = 4  # weight copies cycled through: 4 x 16 MiB (4096x4096) > a 32 MiB L3


def op(x, w, s):
    return torch._weight_int8pack_mm(x, w, s)


def pattern(x, w, s):
    return F.linear(x, w.to(x.dtype)) * s


def timer(call):
    def run(inner: int) -> float:
        start = time.perf_counter()
        for _ in range(inner):
            call()
        return (time.perf_counter() - start) / inner * 1e3
    return run


def copy_bandwidth(repeats: int) -> tuple[float, float]:
    """(GB/s read + written, ms) of a 256 MiB fp32 copy."""
    src = torch.randn(64 * 2 ** 20)
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = statistics.median(timer(lambda: dst.copy_(src))(1) for _ in range(repeats))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9, ms


def compile_variants(fn, programs):
    torch._dynamo.reset()
    return {"eager": fn,
            "inductor": torch.compile(fn, backend="inductor", fullgraph=True),
            "fxwrap": torch.compile(fn, backend=fxwrap.Backend("cpu", {"on_program": programs.append}),
                                    fullgraph=True)}


def fxwrap_choice(programs) -> str:
    from fxwrap.ir.lines import TemplateChoice
    notes = [ln.text for p in programs for ln in p.lines if isinstance(ln, TemplateChoice)]
    return " | ".join(notes) if notes else "no template group (externs and kernels only)"


def bench(form, fn, m, n, k, dtype, repeats, bw):
    x = torch.randn(m, k, dtype=dtype)
    ws = [torch.randint(-128, 128, (n, k), dtype=torch.int8) for _ in range(ROTATE)]
    s = (torch.rand(n) * 0.02 + 0.001).to(dtype)
    programs: list = []
    variants = compile_variants(fn, programs)
    want = fn(x, ws[0], s)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-3, rtol=1e-3)
    check = {}
    for name, f in variants.items():
        got = f(x, ws[0], s)
        ok = torch.allclose(got.float(), want.float(), **tol)
        check[name] = "OK" if ok else "MISMATCH"
    state = {"i": 0}

    def caller(f):
        def call():
            state["i"] = (state["i"] + 1) % ROTATE
            f(x, ws[state["i"]], s)
        return call

    runs = {name: timer(caller(f)) for name, f in variants.items()}
    inner = {name: max(1, min(50, int(20 / max(r(1), 1e-3)))) for name, r in runs.items()}  # ~20 ms a sample
    samples = {name: [] for name in runs}
    for _ in range(repeats):
        for name, r in runs.items():
            samples[name].append(r(inner[name]))
    ms = {name: statistics.median(v) for name, v in samples.items()}
    weight_ms = n * k / (bw * 1e9) * 1e3
    return {"form": form, "m": m, "n": n, "k": k, "dtype": str(dtype).replace("torch.", ""),
            "ms": ms, "check": check, "weight_read_ms": weight_ms,
            "fxwrap_vs_eager": ms["eager"] / ms["fxwrap"], "inductor_vs_eager": ms["eager"] / ms["inductor"],
            "fxwrap_vs_weight_read": ms["fxwrap"] / weight_ms, "choice": fxwrap_choice(programs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--quick", action="store_true", help="fewer repeats, the 4096x4096 weight only")
    ap.add_argument("--json")
    args = ap.parse_args()
    repeats = 5 if args.quick else 11
    shapes = [4096] if args.quick else [4096, 11008]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"# int8 weight-only GEMM, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{cpu} ({platform.machine()}), torch {torch.__version__}, fxwrap commit {commit}")
    print(f"# command: python benchmarks/int8_gemm.py {' '.join(sys.argv[1:])}")
    results = []
    failed = False
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        bw, copy_ms = copy_bandwidth(repeats)
        print(f"\n## {threads} thread(s): 256 MiB copy {copy_ms:.2f} ms = {bw:.1f} GB/s (read + written)")
        print("| form | dtype | M | N x K | eager ms | Inductor ms | fxwrap ms | fxwrap/eager speedup | "
              "weight read ms | fxwrap / weight read | check | fxwrap chose |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
            for n in shapes:
                for m in (1, 32):
                    for form, fn in (("op", op), ("pattern", pattern)):
                        r = bench(form, fn, m, n, 4096, dtype, repeats, bw)
                        r["threads"], r["copy_GBps"] = threads, bw
                        results.append(r)
                        failed |= "MISMATCH" in r["check"].values()
                        ms = r["ms"]
                        print(f"| {form} | {r['dtype']} | {m} | {n}x4096 | {ms['eager']:.3f} | {ms['inductor']:.3f} | "
                              f"{ms['fxwrap']:.3f} | {r['fxwrap_vs_eager']:.2f}x | {r['weight_read_ms']:.3f} | "
                              f"{r['fxwrap_vs_weight_read']:.2f} | "
                              f"{'/'.join(r['check'].values())} | {r['choice'][:90]} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
