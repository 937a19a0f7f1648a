"""Where the time of a call and of a cold compile goes, on CUDA: the evidence behind the
launch-overhead and cold-compile rows of ``compare.py``.

    python benchmarks/overhead_probe.py [--calls] [--compile] [--profile-dir DIR]

``--calls``: host time per call (median of 7 repeats of 2000 calls, ``perf_counter``,
synchronized at the end of each repeat) of every form a GraphModule node of the
launch-overhead workload can take -- allocations, the ``mm`` extern, a kernel launch
through ``cuLaunchKernel`` (fxwrap's driver path) and through Triton's
``CompiledKernel.run``, ``fxwrap.free`` -- and of the whole workload for Inductor and
fxwrap with each launcher.

``--compile``: the cold compile of every ``compare.py`` CUDA workload (fresh cache
directories, as ``compare.py`` does), fxwrap with each launcher and Inductor; with
``--profile-dir`` each fxwrap compile is also profiled (cProfile, one ``.prof`` file per
workload and launcher) and the seconds spent in the main phases are printed.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402

import fxwrap  # noqa: E402


def per_call_us(fn, calls: int = 2000, repeats: int = 7) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def _kernels(program):
    return [n for n in program.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]


def _node_args(node, placeholders: dict) -> list:
    """Arguments for calling ``node``'s target alone: the graph's inputs where it reads
    them, fresh tensors of the traced layout for its other buffers."""
    args = []
    for x in node.args:
        if isinstance(x, torch.fx.Node) and x.op == "placeholder":
            args.append(placeholders[x.name])
        elif isinstance(x, torch.fx.Node):
            v = x.meta["val"]
            args.append(torch.randn(v.shape, dtype=v.dtype, device="cuda").as_strided(v.shape, v.stride()))
        else:
            args.append(x)
    return args


def _launch_rows(bound, args) -> list:
    """The pieces of one launch: the bare driver or Triton call with fixed arguments."""
    import ctypes

    rows = []
    n = bound.grid(*args[bound.npointers:])
    stream = torch.cuda.current_stream().cuda_stream
    if getattr(bound, "path", "") in ("cuda-driver", "cuda-native"):
        sp = ctypes.c_void_p(stream)
        slots, params = bound.driver.buffers()
        bound.pack(slots, 0, *[t.data_ptr() for t in args[:bound.npointers]], *args[bound.npointers:])
        rows.append(("  bare cuLaunchKernel (ctypes, fixed arguments)",
                     lambda: bound.cu_launch(bound.function, n, 1, 1, bound.threads, 1, 1, bound.shared, sp,
                                             params, None)))
        rows.append(("  pack_into of the arguments",
                     lambda: bound.pack(slots, 0, *[t.data_ptr() for t in args[:bound.npointers]],
                                        *args[bound.npointers:])))
    c = bound.compiled
    run = c.run
    rows.append(("  bare CompiledKernel.run (fixed arguments)",
                 lambda: run(n, 1, 1, stream, c.function, c.packed_metadata, None, None, None, *args,
                             *bound.trailing)))
    rows.append(("  grid function", lambda: bound.grid(*args[bound.npointers:])))
    rows.append(("  torch._C._cuda_getCurrentRawStream(0)", lambda: bound.stream(0)))
    return rows


def probe_calls() -> None:
    from fxwrap.targets.cuda_triton import emitter as triton_emitter

    dev = torch.device("cuda", 0)
    a, b = torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev) / 8
    c = torch.empty(64, 64, device=dev)
    rows = [
        ("torch.empty_strided(size, stride, dtype=, device=torch.device)",
         lambda: torch.empty_strided((64, 64), (64, 1), dtype=torch.float32, device=dev)),
        ("torch.empty_strided(..., device='cuda:0')",
         lambda: torch.empty_strided((64, 64), (64, 1), dtype=torch.float32, device="cuda:0")),
        ("torch.empty((64, 64), dtype=, device=)", lambda: torch.empty((64, 64), dtype=torch.float32, device=dev)),
    ]
    guards = getattr(torch._C._dynamo, "guards", None)
    fast = getattr(guards, "_empty_strided_cuda", None)
    if fast is not None:
        rows.append(("torch._C._dynamo.guards._empty_strided_cuda (Inductor's)",
                     lambda: fast((64, 64), (64, 1), torch.float32)))
    rows += [
        ("torch.ops.aten.mm.out(a, b, out=c)", lambda: torch.ops.aten.mm.out(a, b, out=c)),
        ("torch.mm(a, b, out=c)", lambda: torch.mm(a, b, out=c)),
        ("torch.ops.aten.mm.default(a, b)", lambda: torch.ops.aten.mm.default(a, b)),
        ("fxwrap.free(c)", lambda: fxwrap.free(c)),
    ]
    rows.append(("a.new_empty_strided(size, stride)", lambda: a.new_empty_strided((64, 64), (64, 1))))
    for launcher in ("driver", "triton"):
        os.environ["FXWRAP_TRITON_LAUNCHER"] = launcher
        triton_emitter.clear_caches()
        torch._dynamo.reset()
        program = fxwrap.lower(compare.launch_chain_fn, a, b, target="cuda")
        graph_inputs = program.arguments((a, b))
        node = _kernels(program)[0]
        kern = node.target
        args = _node_args(node, dict(zip((p.name for p in program.graph_module.graph.find_nodes(op="placeholder")),
                                         graph_inputs)))
        bound = kern._launcher
        path = getattr(bound, "path", "?")
        rows += _launch_rows(bound, args)
        rows.append((f"Kernel call {kern.name} ({path} launcher)", lambda k=kern, args=args: k(*args)))
        rows.append((f"fxwrap program.runner, whole workload ({path} launcher)",
                     lambda r=program.runner, inputs=graph_inputs: r(*inputs)))
        rows.append((f"fxwrap program.graph_module (ATen externs), whole workload ({path} launcher)",
                     lambda gm=program.graph_module, inputs=graph_inputs: gm(*inputs)))
    os.environ.pop("FXWRAP_TRITON_LAUNCHER", None)
    torch._dynamo.reset()
    ind = torch.compile(compare.fresh_function(compare.launch_chain_fn), backend="inductor")
    ind(a, b)
    rows.append(("Inductor default, whole workload (dynamo guards included)", lambda: ind(a, b)))
    fx = torch.compile(compare.fresh_function(compare.launch_chain_fn), backend=fxwrap.Backend())
    fx(a, b)
    rows.append(("fxwrap backend, whole workload (dynamo guards included)", lambda: fx(a, b)))
    print("== host time per call (us, median of 7 x 2000 calls)")
    for name, fn in rows:
        print(f"{per_call_us(fn):9.2f}  {name}", flush=True)


PHASES = [  # (label, "file:function" substring of the profiled function whose cumulative time it is)
    ("dynamo + AOTAutograd trace, whole first call", "torch/_dynamo/convert_frame.py:_compile"),
    ("fxwrap compile_aten_graph (lowering ... kernel loads)", "fxwrap/api.py:compile_aten_graph"),
    ("  triton compile (all stages)", "triton/compiler/compiler.py:compile"),
    ("    make_cubin (ptxas)", "nvidia/compiler.py:make_cubin"),
    ("    make_llir", "nvidia/compiler.py:make_llir"),
    ("    make_ttgir", "nvidia/compiler.py:make_ttgir"),
    ("  launcher stub builds (compile_module_from_src)", ":compile_module_from_src"),
    ("  fxwrap autotune timing", "cuda_triton/autotune.py:choose"),
    ("  cuda driver loads", "cuda_driver.py:_load_cubin"),
]


def phase_seconds(stats: pstats.Stats) -> dict[str, float]:
    """Cumulative seconds of each phase (the largest cumulative time of a matching function)."""
    out = {}
    for label, key in PHASES:
        out[label] = max((ct for (file, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()
                          if key in f"{file}:{name}"), default=0.0)
    return out


def _cold(case, variant, root, launcher=None, profile_path=None) -> float:
    from fxwrap.targets.cuda_triton import emitter as triton_emitter

    if launcher:
        os.environ["FXWRAP_TRITON_LAUNCHER"] = launcher
        triton_emitter.clear_caches()
    compare.fresh_caches(root)
    compiled = compare.make_compiled(case.fn, variant, [])
    prof = cProfile.Profile() if profile_path else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    case.run(compiled)
    torch.cuda.synchronize()
    if prof:
        prof.disable()
        prof.dump_stats(profile_path)
    os.environ.pop("FXWRAP_TRITON_LAUNCHER", None)
    return time.perf_counter() - t0


def probe_compile(profile_dir: str | None) -> None:
    """Cold compiles; the profiled ones load kernels one at a time (cProfile sees only
    its own thread), so their phases add up but their total is not the timed one."""
    from fxwrap.targets.cuda_triton.emitter import TritonEmitter

    compare.configure_cold_compiles()
    root = tempfile.mkdtemp(prefix="fxwrap_probe_")
    compare.warm_up_process("cuda", root)
    inductor, fxwrap_variant = compare.Variant("inductor", "inductor"), compare.Variant("fxwrap", "fxwrap")
    totals: dict[str, float] = {}
    print("== cold compile (s): workload, variant, seconds")
    for wl in compare.WORKLOADS:
        torch.manual_seed(0)
        case = wl.make("cuda", "cuda")
        for name, variant, launcher in (("inductor", inductor, None), ("fxwrap-driver", fxwrap_variant, "driver"),
                                        ("fxwrap-triton", fxwrap_variant, "triton")):
            dt = _cold(case, variant, root, launcher)
            totals[name] = totals.get(name, 0.0) + dt
            print(f"{wl.name:24s} {name:14s} {dt:6.2f}", flush=True)
        if profile_dir:
            threads = TritonEmitter.load_threads
            os.environ["FXWRAP_TRITON_COMPILE_THREADS"] = "1"
            TritonEmitter.load_threads = 1
            try:
                path = os.path.join(profile_dir, f"{wl.name}.prof")
                dt = _cold(case, fxwrap_variant, root, "driver", path)
            finally:
                TritonEmitter.load_threads = threads
                os.environ.pop("FXWRAP_TRITON_COMPILE_THREADS", None)
            print(f"{wl.name:24s} {'profiled, one thread':14s} {dt:6.2f}")
            for label, sec in phase_seconds(pstats.Stats(path)).items():
                print(f"{'':28s}{sec:6.2f}  {label}")
        del case
        torch._dynamo.reset()
    print("== summed: " + "  ".join(f"{k} {v:.2f} s" for k, v in totals.items()))
    for k in ("fxwrap-driver", "fxwrap-triton"):
        print(f"   {k}/inductor = {totals[k] / totals['inductor']:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--profile-dir")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs CUDA")
    if args.profile_dir:
        os.makedirs(args.profile_dir, exist_ok=True)
    if args.calls or not args.compile:
        probe_calls()
    if args.compile:
        probe_compile(args.profile_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
