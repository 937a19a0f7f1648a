"""Whole models: eager vs Inductor vs fxwrap in one process, interleaved.

    python benchmarks/models.py --device cpu --quick            # plain models, inference fp32
    python benchmarks/models.py --device cuda                   # every model and variant
    python benchmarks/models.py --models gpt,convnet --variants inference-fp32 --profile
    python benchmarks/models.py --device cuda --markdown out.md --json out.json
    python benchmarks/models.py --device cuda --mode reduce-overhead  # both compilers under CUDA graphs
    python benchmarks/models.py --suite vision --variants inference-bf16,training-amp --out vision.log
    python benchmarks/models.py --device cpu --threads 1,2 --out cpu_suite.log   # the CPU suite, 1 and 2 threads

``--suite core`` (the default set): hand-written Llama (RoPE, grouped KV heads), GPT, conv net,
MLP; HF transformers models built from configs (GPT-2, BERT, Llama with grouped KV heads, T5);
one decode step with a static KV cache (hand-written, ``index_copy_``; HF Llama with its
``StaticCache``), inference only.  ``--threads 1,2`` runs every model and variant at each thread
count (``torch.set_num_threads``: torch's OpenMP runtime, which Inductor's and fxwrap's C++
kernels share; each compiled again at that count, since Inductor writes the count into its code).

``--suite vision``: the torchvision families (ResNet-18/50, EfficientNet-B0, MobileNet-V3,
ConvNeXt-T, RegNetY-400MF, Swin-T, ViT-B/16, FCN-ResNet50 segmentation), built from their
constructors with random weights at a user's sizes (32 images of 224x224 on a GPU, 8 for
the segmentation net; on the CPU one 224x224 image, what a CPU user classifies at a time: run it
at one thread on a shared machine, ``OMP_NUM_THREADS=1``); skipped, with the reason, without
torchvision (a torchvision whose compiled ops do not load against this torch is imported without
them: ``suite_models.import_torchvision``, with a note).

Per model and variant (``inference-fp32``, ``inference-bf16``, ``training-fp32``,
``training-bf16``, ``training-amp``: a float32 model stepped under ``torch.autocast`` in
bfloat16): milliseconds per iteration of each backend (the median of rounds
that run eager, Inductor and fxwrap one after the other, so machine noise hits all
three alike), the ratios, the first-call (compile) time of Inductor and fxwrap (with
the whole-graph caches of both off: Inductor's FX graph and AOTAutograd caches, fxwrap's
program cache; the per-kernel caches -- Inductor's compiled kernels under
``$TORCHINDUCTOR_CACHE_DIR``, fxwrap's under ``$FXWRAP_CACHE_DIR`` -- as ``--kernel-caches`` says:
``as-is`` (the default) leaves them as earlier runs left them, so one compiler may hit its cache
where the other compiles; ``cold`` gives both an empty folder of their own for each model,
variant and thread count (and clears Inductor's in-memory code caches): every kernel compiled;
``warm`` compiles and runs each model once with both first, untimed, then resets dynamo: every
kernel a cache hit; the first output line says which), and a
correctness check against eager (the output; for training the loss and every
parameter's gradient), the peak memory of one call of each backend (CUDA: the allocator's
counters; CPU: the profiler's allocation events) and fxwrap's planned peak (the largest
``program.peak_bytes``; fxwrap's CPU peak counts the arena its programs keep across calls).  On CUDA also: CUDA kernels per
iteration, GPU kernel time per iteration, host time per call (the Python time of
one call, measured without waiting for the GPU), and for inference the memory floor: the
bytes of every parameter, buffer (a KV cache) and input, read once at the card's copy
bandwidth (measured in the run), and each compiler's time as a multiple of it.  ``--profile`` prints the top kernels
and externs of fxwrap's programs by time (CUDA: the profiler's kernels; CPU: each node
of the program's GraphModule timed through an FX interpreter).  The last lines are the
geomean of fxwrap/Inductor for inference and for training.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory_peaks  # noqa: E402
import suite_models  # noqa: E402

import fxwrap  # noqa: E402

VARIANTS = ("inference-fp32", "inference-bf16", "training-fp32", "training-bf16", "training-amp")
TOL = {torch.float32: (2e-3, 2e-3), torch.bfloat16: (6e-2, 6e-2)}


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _cast_inputs(inputs, dtype):
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)


def _step(model, inputs, training, loss_fn, amp=False):
    if training:
        with torch.autocast(inputs[0].device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(*inputs)
            loss = loss_fn(out)
        loss.backward()
        return loss.detach()
    with torch.no_grad():
        return model(*inputs)


def _flat_tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat_tensors(o)]
    return []


def _check(name, got, want, models, training, dtype) -> str:
    rtol, atol = TOL[dtype]
    problems = []
    for i, (g, w) in enumerate(zip(_flat_tensors(got), _flat_tensors(want))):
        if not torch.allclose(g.float(), w.float(), rtol=rtol, atol=atol * max(1.0, w.float().abs().max().item())):
            problems.append(f"output {i}: max error {(g.float() - w.float()).abs().max().item():.3g}")
    if training:
        (compiled, eager) = models
        for (pname, p), q in zip(compiled.named_parameters(), eager.parameters()):
            if (p.grad is None) != (q.grad is None):
                problems.append(f"grad {pname}: one side has none")
            elif p.grad is not None:
                scale = max(1.0, q.grad.float().abs().max().item())
                if not torch.allclose(p.grad.float(), q.grad.float(), rtol=rtol, atol=atol * scale * 5):
                    err = (p.grad.float() - q.grad.float()).abs().max().item()
                    problems.append(f"grad {pname}: max error {err:.3g} (scale {scale:.3g})")
    return "OK" if not problems else "MISMATCH " + "; ".join(problems[:3])


def _time_call(fn, device, reps, clock=time.perf_counter):
    _sync(device)
    start = clock()
    for _ in range(reps):
        fn()
    _sync(device)
    return (clock() - start) / reps * 1e3


def _clock(args, device):
    """``--cpu-clock`` at one CPU thread: the thread's CPU time, which the time spent waiting for
    a core on a loaded machine does not inflate (every backend then runs on this thread alone)."""
    if args.cpu_clock and device == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def _host_time(fn, device, reps=5):
    """Python time of one call without waiting for the device (CUDA only)."""
    _sync(device)
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
        _sync(device)
    return statistics.median(samples) * 1e3


def _cuda_kernels(fn):
    """CUDA kernels launched by one call and their summed device time (ms)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(events), sum(e.device_time for e in events) / 1e3, prof


_COPY_BANDWIDTH: list[float] = []


def _copy_bandwidth() -> float:
    """The card's copy bandwidth, bytes read and written a second (a 512 MiB ``copy_``), once a process."""
    if not _COPY_BANDWIDTH:
        src, dst = (torch.empty(2**29, dtype=torch.uint8, device="cuda") for _ in range(2))
        dst.copy_(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        _COPY_BANDWIDTH.append(2 * 10 * src.numel() / (start.elapsed_time(end) / 1e3))
    return _COPY_BANDWIDTH[0]


def _memory_floor(model, inputs) -> dict:
    """What an inference call cannot go below: every parameter, buffer (a KV cache) and input
    read once at the copy bandwidth (``floor_ms``), with those bytes (``floor_mib``)."""
    storages = {}
    for t in [*model.parameters(), *model.buffers(), *(i for i in inputs if isinstance(i, torch.Tensor))]:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    nbytes = sum(storages.values())
    return {"floor_ms": nbytes / _copy_bandwidth() * 1e3, "floor_mib": nbytes / 2**20,
            "copy_gbs": _copy_bandwidth() / 1e9}


def _peak_memory(fn, device):
    """MiB held at most during one ``fn()`` above what was held before it (CUDA: the caching
    allocator's counters; CPU: the profiler's allocation events, ``memory_peaks.measured_peak``)."""
    return memory_peaks.measured_peak(fn, device) / 2**20


def _profile_cpu(programs, recorded, top, runs=5):
    """Each node of fxwrap's GraphModules, timed through an FX interpreter: the fastest of ``runs``
    runs per node, summed over the programs' nodes of one name (kernels: their name and what ATen
    nodes they compute; externs: the op and its input shapes).  At one thread the clock is the
    thread's CPU time (``time.thread_time``): on a loaded machine the time the thread waits
    for a core is not counted; at more threads, wall time."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    best: dict[tuple, float] = {}
    labels: dict[tuple, str] = {}

    def label(node) -> str:
        target = node.target
        if isinstance(target, fxwrap.Kernel):  # the kernel's kind and ops: a model's layers add up
            origins = node.meta.get("fxwrap_origins") or ()
            ops = ",".join(dict.fromkeys(o.target.split(".")[1] if o.target.count(".") > 1 else o.target
                                         for o in origins if o.target not in ("aten.view.default",)))
            return f"{target.name.rstrip('0123456789')} [{ops[:90]}]"
        shapes = " ".join(str(tuple(a.meta["val"].shape)) for a in node.args if isinstance(a, torch.fx.Node)
                          and isinstance(a.meta.get("val"), torch.Tensor))
        return f"{getattr(target, '__name__', str(target))} {shapes}"

    class Timed(torch.fx.Interpreter):
        def __init__(self, gm, index):
            super().__init__(gm)
            self.index = index

        def run_node(self, node):
            start = clock()
            result = super().run_node(node)
            if node.op == "call_function":
                key = (self.index, node.name)
                best[key] = min(best.get(key, math.inf), clock() - start)
                labels.setdefault(key, label(node))
            return result

    for _ in range(runs):
        for index, (program, args) in enumerate(recorded):
            with torch.no_grad():
                Timed(program.graph_module, index).run(*args)
    totals: dict[str, list] = {}
    for key, seconds in best.items():
        entry = totals.setdefault(labels[key], [0.0, 0])
        entry[0] += seconds
        entry[1] += 1
    whole = sum(v for v, _ in totals.values()) or 1.0
    kind = "thread CPU time" if clock is time.thread_time else "wall time"
    lines = [f"      per node, the fastest of {runs} runs ({kind}), {whole * 1e3:.2f} ms in all:"]
    lines += [f"      {v * 1e3:8.3f} ms {100 * v / whole:5.1f}% {n:3d}x {k}"
              for k, (v, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]]
    return "\n".join(lines)


@contextlib.contextmanager
def _kernel_caches(mode: str):
    """``cold``: an empty per-kernel cache folder of its own for each of Inductor and fxwrap
    while one model runs (``$TORCHINDUCTOR_CACHE_DIR``, ``$FXWRAP_CACHE_DIR``; Inductor's
    in-memory code caches cleared before and after), removed after; otherwise as they are."""
    if mode != "cold":
        yield
        return
    inductor_utils = importlib.import_module("torch._inductor.utils")
    # torch 2.11 and later: clear_caches; earlier: clear_inductor_caches
    clear = getattr(inductor_utils, "clear_caches", None) or inductor_utils.clear_inductor_caches
    saved = {name: os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "FXWRAP_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="models-kernel-caches-") as folder:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(folder, "inductor")
        os.environ["FXWRAP_CACHE_DIR"] = os.path.join(folder, "fxwrap")
        clear()
        try:
            yield
        finally:
            clear()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _warm_kernel_caches(base, inputs, training, loss_fn, amp, args) -> None:
    """``--kernel-caches warm``: compile and run ``base`` once with each compiler (untimed),
    then reset dynamo: the timed first calls find every kernel in the caches."""
    for compiled in (torch.compile(copy.deepcopy(base), mode=args.mode),
                     torch.compile(copy.deepcopy(base), backend="fxwrap",
                                   options={**args.options, "mode": args.mode, "cache": False})):
        _step(compiled, inputs, training, loss_fn, amp)
    torch._dynamo.reset()


def run_one(entry, variant, args, device) -> dict:
    training, dtype = variant.startswith("training"), torch.bfloat16 if variant.endswith("bf16") else torch.float32
    amp = variant == "training-amp"  # a float32 model, its step under autocast (bf16)
    size = "small" if device == "cpu" else "large"
    torch.manual_seed(0)
    base, make_inputs, loss_fn = entry.build(device, size)
    base = base.to(device=device, dtype=dtype)
    base.train(training)
    if not training:
        base.eval()
    inputs = _cast_inputs(make_inputs(1), dtype)
    if args.kernel_caches == "warm":
        _warm_kernel_caches(base, inputs, training, loss_fn, amp, args)
    programs, recorded = [], []

    def on_program(program):
        programs.append(program)
        if args.profile and device == "cpu":
            inner = program.runner

            def record(*graph_inputs):
                if len(recorded) < len(programs):
                    recorded.append((program, [t.detach() if isinstance(t, torch.Tensor) else t
                                               for t in graph_inputs]))
                return inner(*graph_inputs)
            program.runner = record

    eager = base
    backends = {"eager": eager,
                "inductor": torch.compile(copy.deepcopy(base), mode=args.mode),
                "fxwrap": torch.compile(copy.deepcopy(base), backend="fxwrap",
                                        options={**args.options, "mode": args.mode, "on_program": on_program,
                                                 "cache": False})}
    result = {"model": entry.name, "variant": variant, "threads": torch.get_num_threads()}
    outs = {}
    for name, model in backends.items():
        if training:
            model.zero_grad(set_to_none=True)
        _sync(device)
        start = time.perf_counter()
        outs[name] = _step(model, inputs, training, loss_fn, amp)
        _sync(device)
        result[f"{name}_first_s"] = time.perf_counter() - start
    for name in ("inductor", "fxwrap"):
        result[f"check_{name}"] = _check(name, outs[name], outs["eager"],
                                         (backends[name], eager), training, torch.bfloat16 if amp else dtype)
    for model in backends.values():
        model.zero_grad(set_to_none=True)

    def call(model):
        def fn():
            if training:
                model.zero_grad(set_to_none=True)
            return _step(model, inputs, training, loss_fn, amp)
        return fn

    calls = {name: call(model) for name, model in backends.items()}
    for fn in calls.values():  # warm up (CUDA graphs of Inductor's, allocator caches)
        fn()
    one = _time_call(calls["eager"], device, 1)
    reps = max(1, min(50, int(args.round_ms / max(one, 1e-3))))
    samples = {name: [] for name in calls}
    clock = _clock(args, device)
    result["clock"] = "cpu" if clock is time.thread_time else "wall"
    for _ in range(args.rounds):
        for name, fn in calls.items():
            samples[name].append(_time_call(fn, device, reps, clock))
    for name in calls:
        result[f"{name}_ms"] = statistics.median(samples[name])
    for name, fn in calls.items():
        result[f"{name}_peak_mib"] = _peak_memory(fn, device)
    # the CPU runner's arena storage (fxwrap/runtime/arena.py) is allocated before the measured call
    # and kept across calls, one for all programs that run one after another (a training step's
    # forward and backward): the profiler does not see it, so the largest arena is added
    held = max((getattr(getattr(p.runner, "arena_pool", None), "nbytes", 0) for p in programs), default=0)
    result["fxwrap_peak_mib"] += held / 2**20
    result["fxwrap_planned_mib"] = max((p.peak_bytes for p in programs), default=0) / 2**20
    if device == "cuda":
        for name, fn in calls.items():
            result[f"{name}_host_ms"] = _host_time(fn, device)
            kernels, gpu_ms, prof = _cuda_kernels(fn)
            result[f"{name}_kernels"], result[f"{name}_gpu_ms"] = kernels, gpu_ms
            if args.profile and name == "fxwrap":
                result["profile"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.top)
        if not training:
            result.update(_memory_floor(base, inputs))
    elif args.profile:
        result["profile"] = _profile_cpu(programs, recorded, args.top, args.profile_runs)
    result["fxwrap_programs"] = len(programs)
    return result


def _fmt(result) -> str:
    r = result
    line = (f"{r['model']:>18} {r['variant']:<15} {r.get('threads', '')}t{'c' if r.get('clock') == 'cpu' else ' '} eager {r['eager_ms']:8.2f}  inductor {r['inductor_ms']:8.2f}  "
            f"fxwrap {r['fxwrap_ms']:8.2f} ms | fx/eager {r['fxwrap_ms'] / r['eager_ms']:.2f}  "
            f"fx/ind {r['fxwrap_ms'] / r['inductor_ms']:.2f} | compile ind {r['inductor_first_s']:.1f}s "
            f"fx {r['fxwrap_first_s']:.1f}s | {r['check_fxwrap']}")
    if "fxwrap_kernels" in r:
        line += (f"\n{'':>26}kernels ind {r['inductor_kernels']} fx {r['fxwrap_kernels']} eager {r['eager_kernels']}"
                 f" | gpu ms ind {r['inductor_gpu_ms']:.2f} fx {r['fxwrap_gpu_ms']:.2f}"
                 f" | host ms ind {r['inductor_host_ms']:.2f} fx {r['fxwrap_host_ms']:.2f}")
    if "floor_ms" in r:
        line += (f"\n{'':>26}floor {r['floor_ms']:.3f} ms ({r['floor_mib']:.1f} MiB of weights, buffers and inputs"
                 f" at {r['copy_gbs']:.0f} GB/s copy) | ind {r['inductor_ms'] / r['floor_ms']:.1f}x"
                 f" fx {r['fxwrap_ms'] / r['floor_ms']:.1f}x the floor")
    if "fxwrap_peak_mib" in r:
        line += (f"\n{'':>26}peak MiB ind {r['inductor_peak_mib']:.1f} fx {r['fxwrap_peak_mib']:.1f}"
                 f" eager {r['eager_peak_mib']:.1f} (fx/ind {r['fxwrap_peak_mib'] / max(r['inductor_peak_mib'], 1e-9):.2f})"
                 f" | fxwrap planned {r['fxwrap_planned_mib']:.1f}")
    return line


def _markdown(results, device) -> str:
    head = ["model", "variant", "threads", "eager ms", "Inductor ms", "fxwrap ms", "fx/eager", "fx/Inductor",
            "compile Ind s", "compile fx s"]
    if device == "cuda":
        head += ["kernels Ind/fx", "GPU ms Ind/fx"]
    head += ["peak MiB Ind/fx", "peak fx/Ind"]
    head.append("check")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "error" in r or "skipped" in r:
            rows.append(f"| {r['model']} | {r['variant']} | {r.get('threads', '')} | "
                        + (r.get("error") or r.get("skipped")) + " |")
            continue
        cells = [r["model"], r["variant"], str(r["threads"]), f"{r['eager_ms']:.2f}", f"{r['inductor_ms']:.2f}", f"{r['fxwrap_ms']:.2f}",
                 f"{r['fxwrap_ms'] / r['eager_ms']:.2f}", f"{r['fxwrap_ms'] / r['inductor_ms']:.2f}",
                 f"{r['inductor_first_s']:.1f}", f"{r['fxwrap_first_s']:.1f}"]
        if device == "cuda":
            cells += [f"{r['inductor_kernels']}/{r['fxwrap_kernels']}",
                      f"{r['inductor_gpu_ms']:.2f}/{r['fxwrap_gpu_ms']:.2f}"]
        cells += [f"{r['inductor_peak_mib']:.1f}/{r['fxwrap_peak_mib']:.1f}",
                  f"{r['fxwrap_peak_mib'] / max(r['inductor_peak_mib'], 1e-9):.2f}"]
        cells.append(r["check_fxwrap"])
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def geomeans(results) -> dict:
    out = {}
    threads = sorted({r["threads"] for r in results if "threads" in r})
    for kind in ("inference", "training"):
        for count in threads:
            ratios = [r["fxwrap_ms"] / r["inductor_ms"] for r in results
                      if r["variant"].startswith(kind) and "fxwrap_ms" in r and r["threads"] == count]
            label = kind if len(threads) == 1 else f"{kind} {count} thread{'s' * (count > 1)}"
            if ratios:
                out[label] = math.exp(sum(map(math.log, ratios)) / len(ratios))
            slower = [(r["fxwrap_ms"] / r["eager_ms"], r["model"]) for r in results
                      if r["variant"].startswith(kind) and "fxwrap_ms" in r and r["threads"] == count]
            if slower:
                out[f"{label} worst fxwrap/eager"] = max(slower)
        peaks = [r["fxwrap_peak_mib"] / r["inductor_peak_mib"] for r in results
                 if r["variant"].startswith(kind) and r.get("inductor_peak_mib")]
        if peaks:
            out[f"{kind} peak memory"] = math.exp(sum(map(math.log, peaks)) / len(peaks))
    return out


def _set_threads(count: int) -> None:
    """``count`` OpenMP threads for eager's ATen ops and both compilers' C++ kernels: all three run
    in torch's OpenMP runtime (the kernels' libgomp.so.1 resolves to the copy torch loaded), whose
    thread count ``torch.set_num_threads`` sets; ``OMP_NUM_THREADS`` is set alike for any process
    started from here."""
    torch.set_num_threads(count)
    os.environ["OMP_NUM_THREADS"] = str(count)


def _summary(means: dict) -> list[str]:
    return [f"{kind}: {value[0]:.3f} ({value[1]})" if isinstance(value, tuple)
            else f"geomean fxwrap/Inductor {kind}: {value:.3f}" for kind, value in means.items()]


class _Tee:
    """Writes to the terminal and to the ``--out`` log alike."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--suite", default=None, choices=("core", "vision"),
                        help="only the models of this suite (vision: the torchvision families)")
    parser.add_argument("--out", default=None, help="also write every printed line to this file")
    parser.add_argument("--variants", default=None, help=f"comma-separated, of {','.join(VARIANTS)}")
    parser.add_argument("--quick", action="store_true", help="plain models, inference-fp32, few rounds")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--round-ms", type=float, default=200.0, help="time per backend per round")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--profile-runs", type=int, default=5, help="--profile: each node's fastest of this many")
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--mode", default="default", choices=("default", "reduce-overhead", "max-autotune"),
                        help="torch.compile mode of both compilers (reduce-overhead: CUDA graphs)")
    parser.add_argument("--cpu-clock", action="store_true",
                        help="at one thread, time with the thread's CPU time (time.thread_time) instead of "
                             "wall time: a loaded machine's waits for a core are not counted")
    parser.add_argument("--threads", default=None,
                        help="comma-separated thread counts (torch.set_num_threads), e.g. 1,2: every model "
                             "and variant at each (default: torch's count)")
    parser.add_argument("--kernel-caches", default="as-is", choices=("as-is", "cold", "warm"),
                        help="the per-kernel caches of both compilers for the compile column: as earlier runs "
                             "left them (as-is), empty for each model (cold), or filled by an untimed compile "
                             "first (warm); see the module docstring")
    parser.add_argument("--options", type=json.loads, default={},
                        help='fxwrap options as JSON, e.g. \'{"partition": "min_cut"}\'')
    args = parser.parse_args(argv)
    device = args.device
    names = args.models.split(",") if args.models else [m.name for m in suite_models.MODELS
                                                        if args.suite in (None, m.suite)]
    if args.out:
        sys.stdout = _Tee(sys.stdout, open(args.out, "a"))
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    if args.quick:
        names = [n for n in names if not suite_models.MODELS[[m.name for m in suite_models.MODELS].index(n)].needs]
        variants, args.rounds = ["inference-fp32"], min(args.rounds, 3)
    if device == "cpu":
        variants = [v for v in variants if not v.endswith("bf16")] if not args.variants else variants
    unknown = set(names) - {m.name for m in suite_models.MODELS} | set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown model(s)/variant(s) {sorted(unknown)}")
    # the compile column measures a compile, not a cache hit (see the module docstring)
    importlib.import_module("torch._inductor.config").fx_graph_cache = False
    importlib.import_module("torch._functorch.config").enable_autograd_cache = False
    thread_counts = [int(n) for n in args.threads.split(",")] if args.threads else [torch.get_num_threads()]
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    print(f"# {device}: torch {torch.__version__}, threads {','.join(map(str, thread_counts))}, mode {args.mode}"
          + (f", {torch.cuda.get_device_name()}" if device == "cuda" else "")
          + (f", load average {load[0]:.2f} at the start" if load else "")
          + f", kernel caches {args.kernel_caches} for the compile column", flush=True)
    results = []
    for entry in suite_models.MODELS:
        if entry.name not in names:
            continue
        why = suite_models.missing(entry)
        for variant in variants:
            if not entry.training and variant.startswith("training"):
                continue  # a decode step: inference only
            for count in thread_counts:
                _set_threads(count)
                if why:
                    results.append({"model": entry.name, "variant": variant, "threads": count, "skipped": why})
                    print(f"{entry.name:>18} {variant:<15} skipped: {why}", flush=True)
                    continue
                torch._dynamo.reset()
                try:
                    with _kernel_caches(args.kernel_caches):
                        result = run_one(entry, variant, args, device)
                except Exception as error:  # noqa: BLE001 - one model's failure is reported, the rest run
                    result = {"model": entry.name, "variant": variant, "threads": count,
                              "error": f"{type(error).__name__}: {error}"[:300]}
                    print(f"{entry.name:>18} {variant:<15} {count}t ERROR {result['error']}", flush=True)
                    results.append(result)
                    continue
                results.append(result)
                print(_fmt(result), flush=True)
                if "profile" in result:
                    print(result["profile"], flush=True)
    if load:
        print(f"# load average {os.getloadavg()[0]:.2f} at the end", flush=True)
    means = geomeans(results)
    for line in _summary(means):
        print(line)
    bad = [r for r in results if "error" in r or r.get("check_fxwrap", "OK") != "OK"]
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(_markdown(results, device) + "\n\n" + "\n".join(_summary(means)) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "profile"} for r in results], f, indent=1)
    if bad:
        print(f"{len(bad)} model(s) failed or mismatched", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
