"""A scan next to a copy of the same bytes: ``torch.cumsum`` of ``rows x n`` float32 compiled
by fxwrap (``target="cuda"``), as a fraction of the copy bandwidth (read + write of the
tensor's bytes, ``torch.Tensor.copy_`` of the same bytes timed the same way).  Issue 18's bar:
the 1-row 1M-element cumsum at 70% or more of the copy's bandwidth.

    python benchmarks/scans.py [--rows 1] [--n 1048576] [--op cumsum|cumprod|logcumsumexp|cummax] [--dtype float32]
    python benchmarks/scans.py --sweep            # a few shapes, one line each
    python benchmarks/scans.py --plan split       # long rows in the two-launch split scan (compare)
    python benchmarks/scans.py --chunk 2048 --window 64   # the look-back plan's chunk and window

Each line names the plan the scan kernel ran (``lookback-scan`` for long rows of cumsum, cumprod
and logcumsumexp: one launch after the zero fill of its status words; ``split-scan``: two launches;
``scan``: one program per row).

Times are CUDA-event medians of 11 rounds; each round times scan, copy and eager one after
the other (interleaved, so a slow moment of the device hits all three), each as 200
back-to-back replays of a CUDA graph of ``--calls-per-graph`` calls (default 1: the
device's work alone: at 4 MB a call's host cost, dynamo's guards included, is longer than
the kernels; ``--no-graphs`` times plain calls).  A graph of one call costs a graph launch
per call (about 2-3 us on an H100/H200, as long as a 4 MB copy); ``--calls-per-graph 20``
captures 20 calls in one graph, as ``triton.testing.do_bench_cudagraph`` does, so the
kernels run back to back and the time is their own.  Prints the GB/s of each and the ratio.  CPU: ``--device cpu``
(one thread: ``torch.set_num_threads(1)`` and ``OMP_NUM_THREADS=1`` before starting).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import fxwrap
from fxwrap.targets.cuda_triton.tiling import Planner
from fxwrap.ir.lines import CallKernel

OPS = {
    "cumsum": lambda x: torch.cumsum(x, -1),
    "cumprod": lambda x: torch.cumprod(x, -1),
    "logcumsumexp": lambda x: torch.logcumsumexp(x, -1),
    "cummax": lambda x: torch.cummax(x, -1).values,
}


def graphed(fn, calls_per_graph: int = 1):
    """``fn`` captured ``calls_per_graph`` times in one CUDA graph: a replay is the device
    work alone, without the host's per-call cost (dynamo's guards, the runner), for scan and
    copy alike."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    return graph.replay


def _seconds_of(fn, device: str, calls: int) -> float:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - t0


def per_call_s(fns: list, device: str, calls_per_fn: list[int], calls: int = 200, repeats: int = 11) -> list[float]:
    """The median seconds per call of each of ``fns`` (one of which runs
    ``calls_per_fn[i]`` calls), timed in ``repeats`` interleaved rounds."""
    for fn in fns:
        for _ in range(20):
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            samples[i].append(_seconds_of(fn, device, calls) / (calls * calls_per_fn[i]))
    return [statistics.median(s) for s in samples]


def measure(op: str, rows: int, n: int, dtype: torch.dtype, device: str, graphs: bool = True,
            calls_per_graph: int = 1) -> dict:
    x = torch.randn(rows, n, device=device, dtype=dtype)
    fn = OPS[op]
    programs: list = []
    torch._dynamo.reset()
    # (no whole-program cache: --plan and --chunk change the program, not its cache key)
    compiled = fxwrap.compile(fn, target=device, options={"on_program": programs.append, "cache": False})
    torch.testing.assert_close(compiled(x), fn(x), rtol=1e-3, atol=1e-2 * max(1.0, n ** 0.5 / 100))
    plans = [getattr(line.kernel.launch, "plan", line.kernel.target) for p in programs for line in p.lines
             if isinstance(line, CallKernel)]
    dst = torch.empty_like(x)
    nbytes = 2 * x.numel() * x.element_size()
    scan, copy, eager = (lambda: compiled(x)), (lambda: dst.copy_(x)), (lambda: fn(x))
    per = 1
    if device == "cuda" and graphs:
        per = calls_per_graph
        scan, copy, eager = (graphed(f, per) for f in (scan, copy, eager))
    t_scan, t_copy, t_eager = per_call_s([scan, copy, eager], device, [per] * 3)
    return {"op": op, "plan": "+".join(plans), "shape": (rows, n), "dtype": str(dtype), "scan_us": t_scan * 1e6, "copy_us": t_copy * 1e6,
            "eager_us": t_eager * 1e6, "scan_GBps": nbytes / t_scan / 1e9, "copy_GBps": nbytes / t_copy / 1e9,
            "fraction_of_copy": t_copy / t_scan}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--op", default="cumsum", choices=sorted(OPS))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--plan", default="auto", choices=["auto", "split"],
                    help="split: long rows in the two-launch split scan, not the look-back scan")
    ap.add_argument("--chunk", type=int, help="the look-back scan's chunk (RBLOCK, a power of two), fixed")
    ap.add_argument("--window", type=int, help="the look-back scan's status words per look-back step")
    ap.add_argument("--no-graphs", action="store_true", help="time plain calls (host cost included), not CUDA graph replays")
    ap.add_argument("--calls-per-graph", type=int, default=1,
                    help="calls captured in one CUDA graph (20: the kernels back to back, without a graph launch each)")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    if a.plan == "split":
        Planner.scan_lookback = False
    if a.chunk:
        Planner.lookback_min_chunk = Planner.lookback_max_chunk = a.chunk
    if a.window:
        Planner.lookback_window = a.window
    cases = [(a.op, a.rows, a.n)]
    if a.sweep:
        cases = [("cumsum", 1, 1 << 20), ("cumsum", 1, 1 << 24), ("cumsum", 8, 1 << 17), ("cumsum", 4096, 1024),
                 ("cumsum", 64, 50000), ("logcumsumexp", 1, 1 << 20), ("cummax", 1, 1 << 20)]
    name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    print(f"# {name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{a.calls_per_graph} call(s) per CUDA graph")
    for op, rows, n in cases:
        r = measure(op, rows, n, dtype, a.device, graphs=not a.no_graphs, calls_per_graph=a.calls_per_graph)
        print(f"{r['op']:<13} {rows}x{n:<9} {r['dtype']:<14} {r['plan']:<14} fxwrap {r['scan_us']:8.1f} us ({r['scan_GBps']:7.1f} GB/s)  "
              f"copy {r['copy_us']:7.1f} us ({r['copy_GBps']:7.1f} GB/s)  eager {r['eager_us']:8.1f} us  "
              f"fraction of copy {r['fraction_of_copy']:.2f}")


if __name__ == "__main__":
    main()
