"""Whole models: eager vs Inductor vs fxwrap in one process, interleaved.

    python benchmarks/models.py --device cpu --quick            # plain models, inference fp32
    python benchmarks/models.py --device cuda                   # every model and variant
    python benchmarks/models.py --models gpt,convnet --variants inference-fp32 --profile
    python benchmarks/models.py --device cuda --markdown out.md --json out.json
    python benchmarks/models.py --device cuda --mode reduce-overhead  # both compilers under CUDA graphs
    python benchmarks/models.py --suite vision --variants inference-bf16,training-amp --out vision.log

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
program cache; the per-kernel binary caches of both stay as they are), and a
correctness check against eager (the output; for training the loss and every
parameter's gradient).  On CUDA also: peak memory of each backend, CUDA kernels per
iteration, GPU kernel time per iteration, and host time per call (the Python time of
one call, measured without waiting for the GPU).  ``--profile`` prints the top kernels
and externs of fxwrap's programs by time (CUDA: the profiler's kernels; CPU: each node
of the program's GraphModule timed through an FX interpreter).  The last lines are the
geomean of fxwrap/Inductor for inference and for training.
"""
from __future__ import annotations

import argparse
import copy
import gc
import importlib
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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


def _time_call(fn, device, reps):
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / reps * 1e3


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


def _peak_memory(fn, device):
    if device != "cuda":
        return None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _profile_cpu(programs, recorded, top):
    """Each node of fxwrap's GraphModules, timed through an FX interpreter."""
    totals: dict[str, float] = {}

    class Timed(torch.fx.Interpreter):
        def run_node(self, node):
            start = time.perf_counter()
            result = super().run_node(node)
            if node.op == "call_function":
                target = node.target
                key = target.name if isinstance(target, fxwrap.Kernel) else getattr(target, "__name__", str(target))
                totals[key] = totals.get(key, 0.0) + time.perf_counter() - start
            return result

    for program, args in recorded:
        with torch.no_grad():
            Timed(program.graph_module).run(*args)
    whole = sum(totals.values()) or 1.0
    lines = [f"      {v * 1e3:8.3f} ms {100 * v / whole:5.1f}%  {k}"
             for k, v in sorted(totals.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(lines)


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
    result = {"model": entry.name, "variant": variant}
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
    for _ in range(args.rounds):
        for name, fn in calls.items():
            samples[name].append(_time_call(fn, device, reps))
    for name in calls:
        result[f"{name}_ms"] = statistics.median(samples[name])
    if device == "cuda":
        for name, fn in calls.items():
            result[f"{name}_peak_mib"] = _peak_memory(fn, device)
            result[f"{name}_host_ms"] = _host_time(fn, device)
            kernels, gpu_ms, prof = _cuda_kernels(fn)
            result[f"{name}_kernels"], result[f"{name}_gpu_ms"] = kernels, gpu_ms
            if args.profile and name == "fxwrap":
                result["profile"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.top)
    elif args.profile:
        result["profile"] = _profile_cpu(programs, recorded, args.top)
    result["fxwrap_programs"] = len(programs)
    return result


def _fmt(result) -> str:
    r = result
    line = (f"{r['model']:>18} {r['variant']:<15} eager {r['eager_ms']:8.2f}  inductor {r['inductor_ms']:8.2f}  "
            f"fxwrap {r['fxwrap_ms']:8.2f} ms | fx/eager {r['fxwrap_ms'] / r['eager_ms']:.2f}  "
            f"fx/ind {r['fxwrap_ms'] / r['inductor_ms']:.2f} | compile ind {r['inductor_first_s']:.1f}s "
            f"fx {r['fxwrap_first_s']:.1f}s | {r['check_fxwrap']}")
    if "fxwrap_kernels" in r:
        line += (f"\n{'':>26}kernels ind {r['inductor_kernels']} fx {r['fxwrap_kernels']} eager {r['eager_kernels']}"
                 f" | gpu ms ind {r['inductor_gpu_ms']:.2f} fx {r['fxwrap_gpu_ms']:.2f}"
                 f" | host ms ind {r['inductor_host_ms']:.2f} fx {r['fxwrap_host_ms']:.2f}"
                 f" | peak MiB ind {r['inductor_peak_mib']:.0f} fx {r['fxwrap_peak_mib']:.0f}"
                 f" eager {r['eager_peak_mib']:.0f} (fx/ind {r['fxwrap_peak_mib'] / max(r['inductor_peak_mib'], 1e-9):.2f})")
    return line


def _markdown(results, device) -> str:
    head = ["model", "variant", "eager ms", "Inductor ms", "fxwrap ms", "fx/eager", "fx/Inductor",
            "compile Ind s", "compile fx s"]
    if device == "cuda":
        head += ["kernels Ind/fx", "GPU ms Ind/fx", "peak MiB Ind/fx", "peak fx/Ind"]
    head.append("check")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "error" in r or "skipped" in r:
            rows.append(f"| {r['model']} | {r['variant']} | " + (r.get("error") or r.get("skipped")) + " |")
            continue
        cells = [r["model"], r["variant"], f"{r['eager_ms']:.2f}", f"{r['inductor_ms']:.2f}", f"{r['fxwrap_ms']:.2f}",
                 f"{r['fxwrap_ms'] / r['eager_ms']:.2f}", f"{r['fxwrap_ms'] / r['inductor_ms']:.2f}",
                 f"{r['inductor_first_s']:.1f}", f"{r['fxwrap_first_s']:.1f}"]
        if device == "cuda":
            cells += [f"{r['inductor_kernels']}/{r['fxwrap_kernels']}",
                      f"{r['inductor_gpu_ms']:.2f}/{r['fxwrap_gpu_ms']:.2f}",
                      f"{r['inductor_peak_mib']:.0f}/{r['fxwrap_peak_mib']:.0f}",
                      f"{r['fxwrap_peak_mib'] / max(r['inductor_peak_mib'], 1e-9):.2f}"]
        cells.append(r["check_fxwrap"])
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def geomeans(results) -> dict:
    out = {}
    for kind in ("inference", "training"):
        ratios = [r["fxwrap_ms"] / r["inductor_ms"] for r in results
                  if r["variant"].startswith(kind) and "fxwrap_ms" in r]
        if ratios:
            out[kind] = math.exp(sum(map(math.log, ratios)) / len(ratios))
        peaks = [r["fxwrap_peak_mib"] / r["inductor_peak_mib"] for r in results
                 if r["variant"].startswith(kind) and r.get("inductor_peak_mib")]
        if peaks:
            out[f"{kind} peak memory"] = math.exp(sum(map(math.log, peaks)) / len(peaks))
    return out


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
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--mode", default="default", choices=("default", "reduce-overhead", "max-autotune"),
                        help="torch.compile mode of both compilers (reduce-overhead: CUDA graphs)")
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
    print(f"# {device}: torch {torch.__version__}, {torch.get_num_threads()} threads, mode {args.mode}"
          + (f", {torch.cuda.get_device_name()}" if device == "cuda" else ""), flush=True)
    results = []
    for entry in suite_models.MODELS:
        if entry.name not in names:
            continue
        why = suite_models.missing(entry)
        for variant in variants:
            if why:
                results.append({"model": entry.name, "variant": variant, "skipped": why})
                print(f"{entry.name:>18} {variant:<15} skipped: {why}", flush=True)
                continue
            torch._dynamo.reset()
            try:
                result = run_one(entry, variant, args, device)
            except Exception as error:  # noqa: BLE001 - one model's failure is reported, the rest run
                result = {"model": entry.name, "variant": variant, "error": f"{type(error).__name__}: {error}"[:300]}
                print(f"{entry.name:>18} {variant:<15} ERROR {result['error']}", flush=True)
                results.append(result)
                continue
            results.append(result)
            print(_fmt(result), flush=True)
            if "profile" in result:
                print(result["profile"], flush=True)
    means = geomeans(results)
    for kind, value in means.items():
        print(f"geomean fxwrap/Inductor {kind}: {value:.3f}")
    bad = [r for r in results if "error" in r or r.get("check_fxwrap", "OK") != "OK"]
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(_markdown(results, device) + "\n\n" + "\n".join(
                f"geomean fxwrap/Inductor {k}: {v:.3f}" for k, v in means.items()) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "profile"} for r in results], f, indent=1)
    if bad:
        print(f"{len(bad)} model(s) failed or mismatched", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
