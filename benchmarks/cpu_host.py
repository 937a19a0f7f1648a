"""Per-call host cost of small CPU programs: eager vs Inductor vs fxwrap, one process, interleaved.

    OMP_NUM_THREADS=1 python benchmarks/cpu_host.py                        # every workload, 1 thread
    OMP_NUM_THREADS=1 python benchmarks/cpu_host.py --workloads hf --profile fxwrap   # cProfile one backend

Workloads (fp32, batch 1, the CPU):

* ``hf``: one decode step of HF transformers' ``LlamaForCausalLM`` from a small config
  (``--layers`` 2, ``--dim`` 128, 4 heads, 2 KV heads, vocabulary 512) with its ``StaticCache``
  (the cache is prefilled eagerly once: it initializes itself on its first write);
* ``hand``: one decode step of ``benchmarks/decode.py``'s hand-written Llama (same sizes);
* ``mlp``: a 3-layer MLP, 8 rows of 128.

Backends: ``eager``, ``inductor`` (``torch.compile`` default) and ``fxwrap`` (default options), each
compiled ``fullgraph=True``.  Timing: ``--rounds`` rounds, each running every backend ``--calls``
times back to back (interleaved: load on the machine hits every backend alike); the median over
rounds of the microseconds per call.  Every backend's output is checked against eager's first.
``--profile B`` also prints the cProfile of backend B's calls (tottime, then cumulative).
``fxwrap-ro`` is a backend too (``mode="reduce-overhead"``: the CPU launch list replayed).

Measured (2026-11-27, 2-core AMD EPYC shared by 8 sessions, load average 12-17, 1 thread,
11 rounds of 100 calls, us per call; "before" is commit 3bb5ee0 run the same way just
before, in its own process; ratios are within each run):

    | workload | eager | Inductor | fxwrap before | fxwrap after | fxwrap-ro after | fxwrap/eager before -> after | fxwrap/Inductor before -> after |
    | hf decode step | 4700 / 3842 | 1525 / 1178 | 2046 | 1113 | 1080 | 0.44 -> 0.29 | 1.34 -> 0.95 |
    | hand decode step | 3360 / 1753 | 1363 / 676 | 2817 | 747 | 616 | 0.84 -> 0.43 | 2.07 -> 1.11 |
    | MLP 8x128 | 919 / 530 | 1158 / 594 | 980 | 603 | 609 | 1.07 -> 1.14 | 0.85 -> 1.02 |

(eager and Inductor: before / after run.)  The MLP's time is its three GEMMs (no view, no
check, three launches): slower than eager's MKL at these shapes, in both runs.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import types

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode  # noqa: E402

import fxwrap  # noqa: E402


def _torchvision_importable() -> None:
    """transformers imports torchvision where it is installed; a torchvision whose compiled ops do
    not load against this torch fails at its meta registrations: skip them (no detection op is used)."""
    try:
        import torchvision  # noqa: F401
    except (RuntimeError, ImportError):
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")


def hf_workload(args):
    """``make(backend) -> step()`` of one HF static-cache decode step, or why there is none."""
    _torchvision_importable()
    made = decode.hf_model(args.layers, args.dim, args.heads, args.kv_heads, args.dim * 2, args.vocab,
                           args.max_seq, torch.float32, torch.device("cpu"))
    if isinstance(made, str):
        return made
    model, cache, call, _ = made
    token = torch.full((1, 1), 7, dtype=torch.long)
    pos = torch.tensor([3])
    with torch.no_grad():  # the cache initializes itself on its first write: eagerly
        call(model, token, torch.tensor([0]))

    lengths = [layer.cumulative_length for layer in cache.layers if hasattr(layer, "cumulative_length")]

    def make(variant):
        step = decode.compile_variant(lambda tok, p: call(model, tok, p), variant)

        def run():
            for length in lengths:  # the cache advances its own position at every step: back to 3
                length.fill_(3)
            return step(token, pos)
        return run
    return make


def hand_workload(args):
    torch.manual_seed(0)
    model = decode.HandLlama(args.layers, args.dim, args.heads, args.kv_heads, args.dim * 2, args.vocab,
                             args.max_seq, torch.float32).eval()
    token = torch.full((1, 1), 7, dtype=torch.long)
    pos = torch.tensor([3])

    def make(variant):
        step = decode.compile_variant(lambda tok, p: model(tok, p), variant)
        return lambda: step(token, pos)
    return make


def mlp_workload(args):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, 4 * args.dim),
                          nn.GELU(), nn.Linear(4 * args.dim, args.dim)).eval()
    x = torch.randn(8, args.dim)

    def make(variant):
        fn = decode.compile_variant(model, variant)
        return lambda: fn(x)
    return make


WORKLOADS = {"hf": hf_workload, "hand": hand_workload, "mlp": mlp_workload}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="hf,hand,mlp")
    ap.add_argument("--backends", default="eager,inductor,fxwrap")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--max-seq", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--profile", default="", help="a backend to cProfile (after the timing)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    for key in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, key):
            setattr(torch._dynamo.config, key, 64)
    backends = [b for b in args.backends.split(",") if b]
    print(f"# cpu_host: torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"load {os.getloadavg()[0]:.1f}; {' '.join(sys.argv[1:] if argv is None else argv)}")
    print("| workload | " + " | ".join(f"{b} us" for b in backends) + " | fxwrap/eager | fxwrap/inductor |")
    print("|---|" + "---|" * (len(backends) + 2))
    for name in [w for w in args.workloads.split(",") if w]:
        make = WORKLOADS[name](args)
        if isinstance(make, str):
            print(f"| {name} | skipped: {make} |")
            continue
        with torch.no_grad():
            calls = {b: make(b) for b in backends}
            want = calls[backends[0]]().clone()
            for b, fn in calls.items():
                for _ in range(3):
                    got = fn()
                torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3, msg=lambda m, b=b: f"{name}/{b}: {m}")
            samples = {b: [] for b in backends}
            for _ in range(args.rounds):
                for b, fn in calls.items():
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        fn()
                    samples[b].append((time.perf_counter() - t0) / args.calls * 1e6)
            med = {b: statistics.median(s) for b, s in samples.items()}
            ratio = lambda a, b: f"{med[a] / med[b]:.2f}" if a in med and b in med else "-"  # noqa: E731
            print(f"| {name} | " + " | ".join(f"{med[b]:.1f}" for b in backends)
                  + f" | {ratio('fxwrap', 'eager')} | {ratio('fxwrap', 'inductor')} |", flush=True)
            if args.profile in calls:
                fn = calls[args.profile]
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(args.calls):
                    fn()
                profiler.disable()
                for order in ("tottime", "cumulative"):
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(args.top)
                    print(f"-- {name}/{args.profile} by {order} ({args.calls} calls)\n" + text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
