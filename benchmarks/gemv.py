"""Decode GEMVs at the bandwidth limit: few-row products ``x[M, K] @ w.T`` (``w`` an
``nn.Linear`` weight ``[N, K]``, ``M`` the decode batch: 1 to 8) of Llama-like layers, bf16 and
int8 weight-only, on CUDA (or, to try the script, the CPU).

    python benchmarks/gemv.py --out gemv.log                  # both tables (bf16, int8), M = 1
    python benchmarks/gemv.py --dtypes int8 --no-max-autotune  # quicker
    python benchmarks/gemv.py --shapes 4096x4096,4096x11008   # some shapes (KxN)
    python benchmarks/gemv.py --dtypes int8 --rows 1,2,4,8 --shapes 4096x14336,14336x4096,4096x4096
                                                             # issue 39: int8 weight-only, M = 1..8
    python benchmarks/gemv.py --device cpu --quick            # the script itself, on the CPU

Per shape, row count and weight dtype, time per call (CUDA: a CUDA graph of many calls,
replayed and timed with events: no host overhead; each call reads another copy of the
weight, so that the weights read per replay exceed the L2 cache and every call streams from
HBM; the CPU: wall time of the same calls).  The variants' rounds are interleaved (round r
times every variant once, in an order turning each round), each variant's time its fastest
round:

* ``copy``: ``dst.copy_(src)`` of a tensor of the weight's bytes, the achievable bound; its
  bandwidth counts the bytes read and written;
* ``eager``: bf16 ``F.linear(x, w)`` (cuBLAS); int8 ``F.linear(x, w.to(bf16)) * s`` (a
  dequantizing kernel, then cuBLAS), and ``aten``: ``torch._weight_int8pack_mm`` (ATen's own
  kernel, where this torch has one on the device);
* ``fxwrap``: ``torch.compile(backend="fxwrap")`` in the default mode (the GEMV template timed
  against the ATen call, the faster kept: ``chose``), and ``gemv``: the templates forced
  (``templates="always"``: the GEMV up to 8 rows) with its tiling;
* ``inductor``: ``torch.compile`` default, and ``max-autotune``: ``max-autotune-no-cudagraphs``
  (its compiles are most of a run's time: cases that start after ``--max-autotune-budget-s``
  leave it out, and the log says so).

Columns: microseconds per call, GB/s of the bytes a call must move (weight, int8 scale,
activations and output), the GEMV's % of the copy's bandwidth and of the card's peak
(``--peak-gbs``), and speed-ups of fxwrap over eager and over both Inductors (>1: fxwrap
faster).  Every variant's output is checked against eager's (max error relative to the
largest |value|).

**Candidate tilings** (CUDA): every tiling the GEMV's table offers for the case
(``fxwrap.targets.cuda_triton.gemv.GEMV_BANDS``) is bound in turn into the forced program and
timed like the variants (``config`` lines: us, GB/s, ``FORM``; ``*`` the autotuner's pick,
whose own times, on one copy of the weight, are printed beside).  The table is retuned from
these lines: the best tiling of each row count first, the ones that never win out.
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
from fxwrap.targets.base import KernelSource
from fxwrap.targets.cuda_triton import plugin as triton_plugin

SHAPES = [(1024, 1024), (1024, 3072), (1024, 4096), (4096, 1024), (4096, 4096), (4096, 11008), (11008, 4096),
          (4096, 32000)]
QUICK_SHAPES = [(512, 1024)]  # --quick: one small layer
L2_BYTES = 50 * 2 ** 20    # an H100's L2 (H200: 60 MB): the weights of one replay are 4x this, at least
MAX_COPIES = 64
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


def _cuda_runner(fn, argsets: list, calls: int):
    """``(run, how)``: ``run()`` makes ``calls`` calls cycling over ``argsets``, captured in
    one CUDA graph (``how`` "graph"); where capture fails, launched eagerly (``how`` says
    "events": host overhead included)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in argsets[:3]:
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()

    def eager_calls():
        for i in range(calls):
            fn(*argsets[i % len(argsets)])

    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            eager_calls()
        run, how = graph.replay, "graph"
    except Exception as error:  # noqa: BLE001 - reported in the table
        torch.cuda.synchronize()
        run, how = eager_calls, f"events ({type(error).__name__})"
    run()
    torch.cuda.synchronize()
    return run, how


def _cpu_runner(fn, argsets: list, calls: int):
    def run():
        for i in range(calls):
            fn(*argsets[i % len(argsets)])
    run()
    return run, "wall"


def _round_us(run, calls: int, device: str) -> float:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1e6 / calls


def interleaved_us(variants: dict, argsets: dict, calls: int, device: str) -> tuple[dict, dict]:
    """``({name: microseconds per call}, {name: how})``: every variant's calls prepared
    (``argsets[name]``, cycled), then ``ROUNDS`` rounds each timing every variant once, the
    order turning each round; a variant's time is its fastest round."""
    runner = _cuda_runner if device == "cuda" else _cpu_runner
    prepared = {name: runner(fn, argsets[name], calls) for name, fn in variants.items()}
    names = list(prepared)
    best = {name: math.inf for name in names}
    for r in range(ROUNDS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            best[name] = min(best[name], _round_us(prepared[name][0], calls, device))
    return best, {name: how for name, (_, how) in prepared.items()}


def gemv_kernel(programs):
    """The GEMV template's ``Kernel`` in the compiled programs, or None."""
    for p in programs:
        for node in p.graph_module.graph.nodes:
            if isinstance(node.target, fxwrap.Kernel) and "# plan: template triton_gemv" in node.target.source:
                return node.target
    return None


def tiling(config) -> str:
    c = dict(config)
    form = f"/form{c['FORM']}" if "FORM" in c else ""
    return f"{c['MBLOCK']}x{c['NBLOCK']}x{c['KBLOCK']}/w{c['num_warps']}/s{c['num_stages']}{form}"


def choice_of(programs) -> tuple[str, str]:
    """``(chosen candidate, the GEMV's tiling)`` of the compiled programs."""
    chosen = "-"
    for p in programs:
        for line in p.lines:
            if isinstance(line, TemplateChoice):
                chosen = line.chosen
    kernel = gemv_kernel(programs)
    return chosen, tiling(kernel.launch.config) if kernel is not None else "-"


def candidate_times(kernel, program_fn, argsets: list, calls: int, target_name: str = "cuda",
                    device: str = "cuda") -> list[dict]:
    """Every candidate tiling of the GEMV ``kernel`` bound into the program ``program_fn``
    runs (one CUDA graph each: the launcher bound when the graph is captured), all timed
    interleaved as the variants are; the autotuner's own pick bound again after.  One dict
    per tiling: ``config``, ``us``, ``autotune_ms`` (its time in the autotuner, on one copy of
    the weight), ``picked``."""
    target = next(t for t in triton_plugin.fxwrap_targets() if t.name == target_name)
    emitter = target.emitter(target)
    picked = kernel.launch.config
    tuned = dict(kernel.launch.timings_ms)
    launchers = {}
    for cfg in kernel.launch.configs:
        source = KernelSource(kernel.name, kernel.source, "triton", kernel.signature, kernel.launch.replace(config=cfg))
        try:
            launchers[cfg] = emitter.load(source)
        except Exception as error:  # noqa: BLE001 - a tiling that does not fit: reported
            launchers[cfg] = error

    def bound(cfg):
        def call(*args):
            kernel.bind(launchers[cfg])
            return program_fn(*args)
        return call

    usable = [cfg for cfg, launcher in launchers.items() if not isinstance(launcher, Exception)]
    try:
        us, _ = interleaved_us({i: bound(cfg) for i, cfg in enumerate(usable)}, dict.fromkeys(range(len(usable)),
                                                                                          argsets), calls, device)
    finally:
        kernel.bind(launchers[picked])
    rows = [{"config": tiling(cfg), "us": us[i], "picked": cfg == picked,
             "autotune_ms": tuned.get(",".join(f"{k}={v}" for k, v in cfg))} for i, cfg in enumerate(usable)]
    rows += [{"config": tiling(cfg), "us": math.nan, "picked": False, "autotune_ms": None,
              "error": f"{type(launcher).__name__}: {str(launcher)[:120]}"}
             for cfg, launcher in launchers.items() if isinstance(launcher, Exception)]
    return rows


def bf16_linear(x, w):
    return F.linear(x, w)


def int8_linear(x, w, s):
    return F.linear(x, w.to(x.dtype)) * s


def call_bytes(kind: str, rows: int, k: int, n: int) -> int:
    """Bytes one call must move: the weight (int8: and its bf16 scale), the bf16 activations and output."""
    weight = n * k * (1 if kind == "int8" else 2) + (2 * n if kind == "int8" else 0)
    return weight + 2 * rows * k + 2 * rows * n


def run_case(k: int, n: int, kind: str, rows: int, args, say, max_autotune: bool = True) -> dict:
    dev, dt = args.device, torch.bfloat16
    target = "cuda" if dev == "cuda" else "cpu"
    weight_bytes = n * k * (1 if kind == "int8" else 2)
    copies = min(MAX_COPIES, max(2, math.ceil(4 * L2_BYTES / weight_bytes)))
    x = torch.randn(rows, k, device=dev, dtype=dt)
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
    key = "CUDA" if dev == "cuda" else "CPU"
    if kind == "int8" and torch._C._dispatch_has_kernel_for_dispatch_key("aten::_weight_int8pack_mm", key):
        variants["aten"] = lambda x, w, s: torch._weight_int8pack_mm(x, w, s)
    programs: dict = {}
    compile_s: dict = {}
    torch._dynamo.reset()
    for name, templates in (("fxwrap", "default"), ("gemv", "always")):
        programs[name] = []
        variants[name] = torch.compile(fn, backend=fxwrap.Backend(
            target, {"templates": templates, "on_program": programs[name].append}), fullgraph=True, dynamic=False)
    variants["inductor"] = torch.compile(fn, fullgraph=True, dynamic=False)
    if max_autotune:
        variants["max-autotune"] = torch.compile(fn, mode="max-autotune-no-cudagraphs", fullgraph=True, dynamic=False)
    want = fn(*argsets[0]).float()
    errors = {}
    for name, f in variants.items():
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # Inductor's autotuning tables
            got = f(*argsets[0]).float()
        compile_s[name] = time.perf_counter() - t0
        errors[name] = ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
    pairs = [(torch.empty(weight_bytes, device=dev, dtype=torch.uint8),
              torch.randint(0, 255, (weight_bytes,), device=dev, dtype=torch.uint8)) for _ in range(min(copies, 8))]
    timed = {"copy": lambda dst, src: dst.copy_(src), **variants}
    us, how = interleaved_us(timed, {name: pairs if name == "copy" else argsets for name in timed}, calls, dev)
    copy_us = us.pop("copy")
    how.pop("copy")
    del pairs
    chosen, fx_tiling = choice_of(programs["fxwrap"])
    _, gemv_tiling = choice_of(programs["gemv"])
    kernel = gemv_kernel(programs["gemv"])
    candidates = candidate_times(kernel, variants["gemv"], argsets, calls) if kernel is not None and dev == "cuda" \
        else []
    return {"K": k, "N": n, "M": rows, "kind": kind, "weight_bytes": weight_bytes,
            "bytes": call_bytes(kind, rows, k, n), "copy_us": copy_us, "us": us, "how": how,
            "errors": errors, "compile_s": compile_s, "chose": chosen,
            "tiling": fx_tiling if chosen == "triton_gemv" else "-", "gemv_tiling": gemv_tiling,
            "candidates": candidates}


def report(rows: list, say, peak_gbs: float = 3350.0) -> None:
    for kind in dict.fromkeys(r["kind"] for r in rows):
        part = [r for r in rows if r["kind"] == kind]
        names = list(dict.fromkeys(v for r in part for v in r["us"]))
        say(f"\n## {kind} weights ({'bf16 activations, int8 weight, bf16 per-channel scale' if kind == 'int8' else 'bf16'})"
            ": microseconds per call and GB/s of the bytes a call moves (weight, scale, activations, output)\n")
        head = "| K x N | M | MB | copy us | " + " | ".join(f"{v} us" for v in names) + \
            " | gemv GB/s | fxwrap GB/s | gemv % copy | gemv % peak | fxwrap vs eager | vs inductor | " \
            "vs max-autotune | chose | gemv tiling |"
        say(head)
        say("|" + "---|" * (head.count("|") - 1))
        for r in part:
            copy_bw = 2 * r["weight_bytes"] / r["copy_us"] / 1e3
            gemv_bw = r["bytes"] / r["us"]["gemv"] / 1e3
            fx_bw = r["bytes"] / r["us"]["fxwrap"] / 1e3
            ratio = lambda other: (f"{r['us'][other] / r['us']['fxwrap']:.2f}x" if other in r["us"] else "-")  # noqa: E731
            say(f"| {r['K']}x{r['N']} | {r['M']} | {r['bytes'] / 1e6:.1f} | {r['copy_us']:.1f} | "
                + " | ".join((f"{r['us'][v]:.1f}" + ("" if r["how"][v] in ("graph", "wall") else "*"))
                             if v in r["us"] else "-" for v in names)
                + f" | {gemv_bw:.0f} | {fx_bw:.0f} | {100 * gemv_bw / copy_bw:.0f}% | {100 * gemv_bw / peak_gbs:.0f}% | "
                f"{ratio('eager')} | {ratio('inductor')} | {ratio('max-autotune')} | {r['chose']} | {r['gemv_tiling']} |")
        say("\nmax error relative to max|eager| per variant; compile seconds of the first call:")
        for r in part:
            say(f"  {r['K']}x{r['N']} M={r['M']}: " + ", ".join(f"{v} {e:.1e}" for v, e in r["errors"].items())
                + " | " + ", ".join(f"{v} {s:.1f}s" for v, s in r["compile_s"].items()))
        marks = {v for r in part for v, h in r["how"].items() if h not in ("graph", "wall")}
        if marks:
            say(f"  * not capturable in a CUDA graph, timed with events (host overhead included): {sorted(marks)}")
        if any(r["candidates"] for r in part):
            say("\ncandidate tilings of the GEMV (MBLOCK x NBLOCK x KBLOCK / warps / stages / form), fastest first; "
                "* the autotuner's pick, (ms) its time there:")
            for r in part:
                say(f"  {r['K']}x{r['N']} M={r['M']}:")
                for c in sorted(r["candidates"], key=lambda c: (math.isnan(c["us"]), c["us"])):
                    if "error" in c:
                        say(f"    config {c['config']}: failed: {c['error']}")
                        continue
                    tuned = f" (autotune {c['autotune_ms']:.4f} ms)" if c["autotune_ms"] is not None else ""
                    say(f"    config {c['config']}{' *' if c['picked'] else ''}: {c['us']:.1f} us, "
                        f"{r['bytes'] / c['us'] / 1e3:.0f} GB/s{tuned}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bf16,int8", help="comma-separated: bf16, int8")
    ap.add_argument("--shapes", default="", help="comma-separated KxN (default: the Llama-like eight)")
    ap.add_argument("--rows", default="1", help="comma-separated row counts M (the decode batch), e.g. 1,2,4,8")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda (the GEMV template; CUDA graphs) or cpu (the cpu target; wall time)")
    ap.add_argument("--quick", action="store_true",
                    help=f"one small shape ({QUICK_SHAPES[0][0]}x{QUICK_SHAPES[0][1]}) unless --shapes, "
                         "no max-autotune")
    ap.add_argument("--no-max-autotune", action="store_true", help="leave Inductor max-autotune out (slow compiles)")
    ap.add_argument("--max-autotune-budget-s", type=float, default=150.0,
                    help="cases that start after this many seconds of the run leave Inductor max-autotune out "
                         "(its compiles dominate the run; said in the log)")
    ap.add_argument("--peak-gbs", type=float, default=4800.0, help="the card's peak HBM GB/s (H200: 4800, H100 SXM: 3350)")
    ap.add_argument("--out", default="", help="also write the log here")
    ap.add_argument("--json", default="", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    args.no_max_autotune |= args.quick
    say = Tee(args.out or None)
    if args.device == "cuda" and not torch.cuda.is_available():
        say("gemv.py: no CUDA GPU here; `--device cpu --quick` runs the script on the CPU")
        return 2
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or \
        (QUICK_SHAPES if args.quick else SHAPES)
    kinds = [k for k in args.dtypes.split(",") if k]
    row_counts = [int(m) for m in args.rows.split(",") if m]
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    say(f"# GEMV bandwidth: {where}, torch {torch.__version__}, triton {__import__('triton').__version__}; "
        f"command: python benchmarks/gemv.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    if args.device == "cpu":
        say("# cpu: the cpu target's templates; candidate tilings of the Triton GEMV are CUDA-only (skipped)")
    torch.manual_seed(0)
    for name in ("cache_size_limit", "recompile_limit"):  # one function, compiled by every variant
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    results = []
    t0 = time.perf_counter()
    for kind in kinds:
        for k, n in shapes:
            for rows in row_counts:
                late = time.perf_counter() - t0 > args.max_autotune_budget_s
                if late and not args.no_max_autotune:
                    say(f"  ({kind} {k}x{n} M={rows}: started after --max-autotune-budget-s "
                        f"{args.max_autotune_budget_s:.0f}s: no max-autotune)")
                r = run_case(k, n, kind, rows, args, say, max_autotune=not (args.no_max_autotune or late))
                results.append(r)
                copy_bw = 2 * r["weight_bytes"] / r["copy_us"] / 1e3
                gemv_bw, fx_bw = (r["bytes"] / r["us"][v] / 1e3 for v in ("gemv", "fxwrap"))
                say(f"  {kind} {k}x{n} M={rows}: " + ", ".join(f"{v} {t:.1f}us" for v, t in r["us"].items())
                    + f", copy {r['copy_us']:.1f}us; gemv {gemv_bw:.0f} GB/s = {100 * gemv_bw / copy_bw:.0f}% of copy,"
                    f" fxwrap {fx_bw:.0f} GB/s; default mode chose {r['chose']} ({time.perf_counter() - t0:.0f}s)")
    say("copy bandwidth counts the bytes read and written; GB/s: the bytes a call moves over its time; "
        f"% peak is of --peak-gbs {args.peak_gbs:.0f} GB/s")
    report(results, say, args.peak_gbs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
