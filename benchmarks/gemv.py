"""Decode GEMVs at the bandwidth limit: one-row products ``x[1, K] @ w.T`` (``w`` an
``nn.Linear`` weight ``[N, K]``) of Llama-like layers, bf16 and int8 weight-only, on CUDA.

    python benchmarks/gemv.py --out gemv.log                  # both tables (bf16, int8)
    python benchmarks/gemv.py --dtypes int8 --no-max-autotune  # quicker
    python benchmarks/gemv.py --shapes 4096x4096,4096x11008   # some shapes (KxN)

Per shape and weight dtype, GPU time per call (a CUDA graph of many calls, replayed and timed
with events: no host overhead; each call reads another copy of the weight, so that the
weights read per replay exceed the L2 cache and every call streams from HBM):

* ``copy``: ``dst.copy_(src)`` of a tensor of the weight's bytes, the achievable bound; its
  bandwidth counts the bytes read and written;
* ``eager``: bf16 ``F.linear(x, w)`` (cuBLAS); int8 ``F.linear(x, w.to(bf16)) * s`` (a
  dequantizing kernel, then cuBLAS), and ``aten``: ``torch._weight_int8pack_mm`` (ATen's own
  CUDA kernel, where this torch has one);
* ``fxwrap``: ``torch.compile(backend="fxwrap")`` in the default mode (the GEMV template timed
  against the ATen call, the faster kept: ``chose``), and ``gemv``: the GEMV forced
  (``templates="always"``) with its tiling;
* ``inductor``: ``torch.compile`` default, and ``max-autotune-no-cudagraphs``.

Columns: weight bytes (MB), microseconds, GB/s of weight read (bytes / time), % of the
copy's bandwidth (2 x bytes / copy time) and of the card's peak (``--peak-gbs``), and
speed-ups of fxwrap over eager/cuBLAS and over both Inductors (>1: fxwrap faster).  Every variant's output is checked against eager's (max
error relative to the largest |value|).  The issue's bar: the GEMV at >= 85% of the copy
bandwidth on an H100 at these shapes.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import TemplateChoice

SHAPES = [(1024, 1024), (1024, 3072), (1024, 4096), (4096, 1024), (4096, 4096), (4096, 11008), (11008, 4096),
          (4096, 32000)]
L2_BYTES = 50 * 2 ** 20    # an H100's L2 (H200: 60 MB): the weights of one replay are 4x this, at least
ROUNDS = 7


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


def graph_time_us(fn, argsets: list, calls: int) -> tuple[float, str]:
    """``(microseconds per call, how)``: ``calls`` calls cycling over ``argsets`` captured in one
    CUDA graph, the fastest of ``ROUNDS`` replays; where capture fails, CUDA events around
    the same calls launched eagerly (host overhead included: ``how`` says "events")."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in argsets[:3]:
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(*argsets[i % len(argsets)])
        run, how = graph.replay, "graph"
    except Exception as error:  # noqa: BLE001 - reported in the table
        torch.cuda.synchronize()
        how = f"events ({type(error).__name__})"

        def run():
            for i in range(calls):
                fn(*argsets[i % len(argsets)])
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(ROUNDS):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return min(times), how


def choice_of(programs) -> tuple[str, str]:
    """``(chosen candidate, the GEMV's tiling)`` of the compiled programs."""
    chosen, tiling = "-", "-"
    for p in programs:
        for line in p.lines:
            if isinstance(line, TemplateChoice):
                chosen = line.chosen
        for node in p.graph_module.graph.nodes:
            if isinstance(node.target, fxwrap.Kernel) and "# plan: template triton_gemv" in node.target.source:
                c = dict(node.target.launch.config)
                tiling = f"{c['NBLOCK']}x{c['KBLOCK']}/w{c['num_warps']}/s{c['num_stages']}"
    return chosen, tiling


def bf16_linear(x, w):
    return F.linear(x, w)


def int8_linear(x, w, s):
    return F.linear(x, w.to(x.dtype)) * s


def run_shape(k: int, n: int, kind: str, max_autotune: bool, say) -> dict:
    dev, dt = "cuda", torch.bfloat16
    bytes_w = n * k * (1 if kind == "int8" else 2)
    copies = max(2, math.ceil(4 * L2_BYTES / bytes_w))
    x = torch.randn(1, k, device=dev, dtype=dt)
    if kind == "int8":
        ws = [torch.randint(-128, 128, (n, k), device=dev, dtype=torch.int8) for _ in range(copies)]
        s = (torch.rand(n, device=dev) * 0.01 + 0.001).to(dt)
        argsets = [(x, w, s) for w in ws]
        fn = int8_linear
    else:
        ws = [torch.randn(n, k, device=dev, dtype=dt) / k ** 0.5 for _ in range(copies)]
        argsets = [(x, w) for w in ws]
        fn = bf16_linear
    calls = max(copies, 20)
    variants: dict = {"eager": fn}
    if kind == "int8" and torch._C._dispatch_has_kernel_for_dispatch_key("aten::_weight_int8pack_mm", "CUDA"):
        variants["aten"] = lambda x, w, s: torch._weight_int8pack_mm(x, w, s)
    programs: dict = {}
    compile_s: dict = {}
    for name, templates in (("fxwrap", "default"), ("gemv", "always")):
        torch._dynamo.reset()
        programs[name] = []
        variants[name] = torch.compile(fn, backend=fxwrap.Backend(
            "cuda", {"templates": templates, "on_program": programs[name].append}), fullgraph=True)
    torch._dynamo.reset()
    variants["inductor"] = torch.compile(fn, fullgraph=True)
    if max_autotune:
        variants["max-autotune"] = torch.compile(fn, mode="max-autotune-no-cudagraphs", fullgraph=True)
    want = fn(*argsets[0]).float()
    errors = {}
    for name, f in variants.items():
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # Inductor's autotuning tables
            got = f(*argsets[0]).float()
        compile_s[name] = time.perf_counter() - t0
        errors[name] = ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
    pairs = [(torch.empty(bytes_w, device=dev, dtype=torch.uint8), torch.randint(0, 255, (bytes_w,), device=dev,
                                                                                 dtype=torch.uint8))
             for _ in range(copies)]
    copy_us, _ = graph_time_us(lambda dst, src: dst.copy_(src), pairs, calls)
    del pairs
    us, how = {}, {}
    for name, f in variants.items():
        us[name], how[name] = graph_time_us(f, argsets, calls)
    chosen, tiling = choice_of(programs["fxwrap"])
    _, gemv_tiling = choice_of(programs["gemv"])
    return {"K": k, "N": n, "kind": kind, "bytes": bytes_w, "copy_us": copy_us, "us": us, "how": how,
            "errors": errors, "compile_s": compile_s, "chose": chosen, "tiling": tiling if chosen == "triton_gemv"
            else "-", "gemv_tiling": gemv_tiling}


def report(rows: list, say, peak_gbs: float = 3350.0) -> None:
    for kind in dict.fromkeys(r["kind"] for r in rows):
        part = [r for r in rows if r["kind"] == kind]
        names = list(part[0]["us"])
        say(f"\n## {kind} weights ({'bf16 activations, int8 weight, bf16 per-channel scale' if kind == 'int8' else 'bf16'})"
            f": microseconds per call (GPU, CUDA graph) and GB/s of weight read\n")
        head = f"| K x N | MB | copy us | " + " | ".join(f"{v} us" for v in names) + \
            " | gemv GB/s | gemv % copy | gemv % peak | fxwrap % copy | fxwrap vs eager | vs inductor | vs max-autotune | chose | gemv tiling |"
        say(head)
        say("|" + "---|" * (head.count("|") - 1))
        for r in part:
            copy_bw = 2 * r["bytes"] / r["copy_us"] / 1e3
            gemv_bw = r["bytes"] / r["us"]["gemv"] / 1e3
            fx_bw = r["bytes"] / r["us"]["fxwrap"] / 1e3
            ratio = lambda other: (f"{r['us'][other] / r['us']['fxwrap']:.2f}x" if other in r["us"] else "-")  # noqa: E731
            say(f"| {r['K']}x{r['N']} | {r['bytes'] / 1e6:.1f} | {r['copy_us']:.1f} | "
                + " | ".join(f"{r['us'][v]:.1f}" + ("" if r["how"][v] == "graph" else "*") for v in names)
                + f" | {gemv_bw:.0f} | {100 * gemv_bw / copy_bw:.0f}% | {100 * gemv_bw / peak_gbs:.0f}% | "
                f"{100 * fx_bw / copy_bw:.0f}% | "
                f"{ratio('eager')} | {ratio('inductor')} | {ratio('max-autotune')} | {r['chose']} | {r['gemv_tiling']} |")
        say("\nmax error relative to max|eager| per variant; compile seconds of the first call:")
        for r in part:
            say(f"  {r['K']}x{r['N']}: " + ", ".join(f"{v} {e:.1e}" for v, e in r["errors"].items())
                + " | " + ", ".join(f"{v} {s:.1f}s" for v, s in r["compile_s"].items()))
        marks = {v for r in part for v, h in r["how"].items() if h != "graph"}
        if marks:
            say(f"  * not capturable in a CUDA graph, timed with events (host overhead included): {sorted(marks)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bf16,int8", help="comma-separated: bf16, int8")
    ap.add_argument("--shapes", default="", help="comma-separated KxN (default: the Llama-like eight)")
    ap.add_argument("--no-max-autotune", action="store_true", help="leave Inductor max-autotune out (slow compiles)")
    ap.add_argument("--peak-gbs", type=float, default=3350.0, help="the card's peak HBM GB/s (H100 SXM: 3350)")
    ap.add_argument("--out", default="", help="also write the log here")
    ap.add_argument("--json", default="", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    say = Tee(args.out or None)
    if not torch.cuda.is_available():
        say("gemv.py needs a CUDA GPU")
        return 2
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    kinds = [k for k in args.dtypes.split(",") if k]
    say(f"# GEMV bandwidth: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"triton {__import__('triton').__version__}")
    torch.manual_seed(0)
    for name in ("cache_size_limit", "recompile_limit"):  # one function, compiled by every variant
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    rows = []
    t0 = time.perf_counter()
    for kind in kinds:
        for k, n in shapes:
            r = run_shape(k, n, kind, not args.no_max_autotune, say)
            rows.append(r)
            copy_bw, gemv_bw = 2 * r["bytes"] / r["copy_us"] / 1e3, r["bytes"] / r["us"]["gemv"] / 1e3
            say(f"  {kind} {k}x{n}: " + ", ".join(f"{v} {t:.1f}us" for v, t in r["us"].items())
                + f", copy {r['copy_us']:.1f}us; gemv {gemv_bw:.0f} GB/s = {100 * gemv_bw / copy_bw:.0f}% of copy, "
                f"{100 * gemv_bw / args.peak_gbs:.0f}% of peak; default mode chose {r['chose']} "
                f"({time.perf_counter() - t0:.0f}s)")
    say(f"copy bandwidth per shape counts the bytes read and written; % peak is of --peak-gbs {args.peak_gbs:.0f} GB/s")
    report(rows, say, args.peak_gbs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
