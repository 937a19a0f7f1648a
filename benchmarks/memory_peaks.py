"""Inference peak memory of one call: eager vs Inductor vs fxwrap, and fxwrap's planned peak.

    python benchmarks/memory_peaks.py                                   # the default models, CPU
    python benchmarks/memory_peaks.py --models convnext_tiny,hf_gpt2 --batch 1 --image 128
    python benchmarks/memory_peaks.py --device cuda --dtype bf16 --batch 32

The measured peak is the most bytes the call holds at once above what was allocated
before it (its outputs included): on CUDA ``torch.cuda.max_memory_allocated``; on the
CPU the allocation and free events of ``torch.profiler`` (``profile_memory``) summed in
time order (every allocation of the call: kernels' buffers, externs' workspaces and
outputs).  ``planned`` is the largest ``program.peak_bytes`` of fxwrap's programs (the
memory plan at the compile-time sizes), and ``frees-only`` the same plan without reuse.
Models: the vision ones of ``suite_models`` (torchvision) and ``gpt2`` (transformers'
GPT-2, ``--layers`` layers, batch x ``--seq`` tokens).
"""
from __future__ import annotations

import argparse
import copy
import gc
import os
import sys
import types

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fxwrap  # noqa: E402,F401  (registers the backend)

MIB = 2 ** 20


def _torchvision():
    """torchvision's models; its compiled ops may fail to load against this torch (then
    its meta registrations are skipped: the models build, detection ops stay missing)."""
    try:
        import torchvision.models  # noqa: F401
    except (ImportError, RuntimeError, AttributeError):
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision.models  # noqa: F401
    return sys.modules["torchvision.models"]


def build(name: str, args, device: str, dtype: torch.dtype):
    """(model, inputs) of ``name`` at the command line's sizes."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    models = _torchvision()  # first: transformers imports torchvision
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        config = GPT2Config(n_layer=args.layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        model = GPT2LMHeadModel(config)
        inputs = (torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=g),)
    else:
        model = getattr(models, name)(weights=None)
        inputs = (torch.randn(args.batch, 3, args.image, args.image, generator=g).to(dtype),)
    model = model.to(device=device, dtype=dtype).eval()
    return model, tuple(t.to(device) for t in inputs)


def measured_peak(fn, device: str) -> int:
    """Most bytes held at once during ``fn()`` above those held before it."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def run_model(name: str, args) -> dict:
    device, dtype = args.device, {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model, inputs = build(name, args, device, dtype)
    programs = []
    compiled = {"eager": model,
                "inductor": torch.compile(copy.deepcopy(model)),
                "fxwrap": torch.compile(copy.deepcopy(model), backend="fxwrap",
                                        options={"on_program": programs.append, "cache": False})}
    result = {"model": name, "check": "OK"}
    with torch.no_grad():
        expected = None
        for backend, fn in compiled.items():
            out = fn(*inputs)  # compile and warm up
            out = out.logits if hasattr(out, "logits") else out
            if expected is None:
                expected = out
            else:
                tol = 2e-3 if dtype == torch.float32 else 6e-2
                try:
                    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
                except AssertionError as error:  # reported, the peaks still measured
                    result["check"] = f"{backend} differs from eager: {str(error).splitlines()[0]}"
            del out
            fn(*inputs)
            result[backend] = measured_peak(lambda fn=fn: fn(*inputs), device)
    result["planned"] = max((p.peak_bytes for p in programs), default=0)
    result["frees_only"] = max((p.memory.peak_bytes_frees_only for p in programs), default=0)
    result["programs"] = len(programs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="convnext_tiny,mobilenet_v3_large,swin_t,gpt2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    print(f"{'model':>20} {'eager':>8} {'inductor':>9} {'fxwrap':>8} {'planned':>8} {'frees-only':>10}"
          f"  (MiB, one inference call, {args.device} {args.dtype}, batch {args.batch})")
    for name in args.models.split(","):
        torch._dynamo.reset()
        r = run_model(name, args)
        print(f"{name:>20} {r['eager'] / MIB:8.1f} {r['inductor'] / MIB:9.1f} {r['fxwrap'] / MIB:8.1f} "
              f"{r['planned'] / MIB:8.1f} {r['frees_only'] / MIB:10.1f}  fx/ind {r['fxwrap'] / max(r['inductor'], 1):.2f}"
              f"  ({r['programs']} programs) {r['check']}", flush=True)


if __name__ == "__main__":
    main()
