"""The linear layers of the model suite on CUDA: cuBLAS + a separate epilogue kernel vs the
Triton GEMM template with its epilogue fused, vs Inductor max-autotune; and what fxwrap's
``templates="auto"`` chose.

    python benchmarks/gemm_cuda.py                      # every layer, bf16
    python benchmarks/gemm_cuda.py --layers gpt --dtype float32 --json out.json

Each layer is ``epilogue(F.linear(x, w, b))`` at the shapes of ``benchmarks/suite_models.py``
(size ``large``: llama, gpt, mlp, convnet's head) and of ``fxwrap/testing/models.py``, with the
epilogue the model applies (bias, GELU, SiLU, a residual add, SwiGLU's product).  Columns,
microseconds per call (median of rounds that run every variant in turn, CUDA events):

* ``extern``: fxwrap, ``options={"templates": "off"}`` -- cuBLAS, then the epilogue kernel;
* ``template``: fxwrap, ``"always"`` -- the Triton GEMM with the epilogue fused;
* ``auto``: fxwrap, ``"auto"`` (the default) -- and ``chose``: ``template`` or ``extern``;
* ``inductor``: ``torch.compile(mode="max-autotune-no-cudagraphs")``;
* ``eager``.

The issue's bar: ``auto`` never slower than ``extern`` (within noise, 3%), and the template
chosen on at least half of the layers where it wins.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

import fxwrap

# (model, layer, M, K, N, bias, epilogue); M is batch x sequence for the token models
LAYERS = [
    ("llama", "wq", 4096, 1024, 1024, False, "none"),
    ("llama", "wk", 4096, 1024, 256, False, "none"),
    ("llama", "wo", 4096, 1024, 1024, False, "residual"),
    ("llama", "w1", 4096, 1024, 2720, False, "silu"),
    ("llama", "w3", 4096, 1024, 2720, False, "mul"),
    ("llama", "w2", 4096, 2720, 1024, False, "residual"),
    ("llama", "head", 4096, 1024, 32000, False, "none"),
    ("gpt", "qkv", 4096, 768, 2304, True, "none"),
    ("gpt", "proj", 4096, 768, 768, True, "residual"),
    ("gpt", "fc1", 4096, 768, 3072, True, "gelu_tanh"),
    ("gpt", "fc2", 4096, 3072, 768, True, "residual"),
    ("gpt", "head", 4096, 768, 32000, False, "none"),
    ("mlp", "fc0", 512, 1024, 4096, True, "gelu"),
    ("mlp", "fc1", 512, 4096, 4096, True, "gelu"),
    ("mlp", "head", 512, 4096, 10, True, "none"),
    ("convnet", "head", 64, 256, 10, True, "none"),
    ("testing.mlp", "fc0", 16, 32, 64, True, "gelu"),
    ("testing.mlp", "fc1", 16, 64, 10, True, "none"),
    ("testing.transformer", "qkv", 16, 32, 96, True, "none"),
    ("testing.transformer", "out", 16, 32, 32, True, "residual"),
    ("testing.transformer", "fc1", 16, 32, 128, True, "gelu"),
    ("testing.transformer", "fc2", 16, 128, 32, True, "residual"),
]


def layer_fn(epilogue: str):
    def fn(x, w, b, other):
        y = F.linear(x, w, b)
        if epilogue == "gelu":
            return F.gelu(y)
        if epilogue == "gelu_tanh":
            return F.gelu(y, approximate="tanh")
        if epilogue == "silu":
            return F.silu(y)
        if epilogue == "residual":
            return other + y
        if epilogue == "mul":
            return other * y
        return y
    return fn


def time_us(fn, args, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def template_config(programs) -> str:
    """The tiling the template kernel of ``programs`` runs with: ``MBLOCKxNBLOCKxKBLOCK/warps/stages``."""
    for p in programs:
        for node in p.graph_module.graph.nodes:
            if isinstance(node.target, fxwrap.Kernel) and "# plan: template" in node.target.source:
                c = dict(node.target.launch["config"])
                return f"{c['MBLOCK']}x{c['NBLOCK']}x{c['KBLOCK']}/w{c['num_warps']}/s{c['num_stages']}"
    return "-"


def choice_times(programs) -> str:
    """The compile-time medians the choice was made on (``TemplateChoice.times``), in ms."""
    from fxwrap.wrapper_ir.lines import TemplateChoice
    for p in programs:
        for line in p.lines:
            if isinstance(line, TemplateChoice) and line.times:
                return " ".join(f"{k}={v:.4f}" for k, v in line.times)
    return ""


def chose_template(programs) -> str:
    """``template`` when a kernel of the programs is a template kernel, else ``extern``."""
    for p in programs:
        for node in p.graph_module.graph.nodes:
            if isinstance(node.target, fxwrap.Kernel) and "# plan: template" in node.target.source:
                return "template"
    return "extern"


def run_layer(row, dtype, rounds: int, reps: int, inductor: bool = True) -> dict:
    model, name, M, K, N, has_bias, epilogue = row
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    w = torch.randn(N, K, device="cuda", dtype=dtype) / K ** 0.5
    b = torch.randn(N, device="cuda", dtype=dtype) if has_bias else None
    other = torch.randn(M, N, device="cuda", dtype=dtype)
    fn = layer_fn(epilogue)
    args = (x, w, b, other)
    variants, programs = {"eager": fn}, {}
    for mode in ("off", "always", "auto"):
        torch._dynamo.reset()
        programs[mode] = []
        variants[{"off": "extern", "always": "template", "auto": "auto"}[mode]] = torch.compile(
            fn, backend=fxwrap.Backend(options={"templates": mode, "on_program": programs[mode].append}))
    if inductor:
        variants["inductor"] = torch.compile(fn, mode="max-autotune-no-cudagraphs")
    want = fn(*args).float()
    errors = {}
    for key, f in variants.items():
        got = f(*args).float()  # compiles (and autotunes)
        errors[key] = ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for key, f in variants.items():  # warm up
        time_us(f, args, 3)
    for _ in range(rounds):
        for key, f in variants.items():
            times[key].append(time_us(f, args, reps))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": model, "layer": name, "M": M, "K": K, "N": N, "bias": has_bias, "epilogue": epilogue,
            "us": med, "chose": chose_template(programs["auto"]), "config": template_config(programs["always"]),
            "choice_ms": choice_times(programs["auto"]), "template_applied":
            chose_template(programs["always"]) == "template", "max_rel_error": errors}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default="")
    ap.add_argument("--no-inductor", action="store_true", help="leave Inductor max-autotune out (its compile is slow)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gemm_cuda.py needs a CUDA GPU")
        return 2
    dtype = getattr(torch, args.dtype)
    wanted = set(filter(None, args.layers.split(",")))
    rows = [r for r in LAYERS if not wanted or r[0] in wanted]
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, torch {torch.__version__}; us per call, median of "
          f"{args.rounds} rounds x {args.reps} calls")
    head = f"{'layer':<26}{'MxKxN':>18}{'epilogue':>10}{'extern':>9}{'template':>9}{'auto':>9}" \
           f"{'inductor':>9}{'eager':>9}  chose     tmpl/ext  tiling  [compile-time ms]"
    print(head)
    results = []
    for row in rows:
        r = run_layer(row, dtype, args.rounds, args.reps, inductor=not args.no_inductor)
        results.append(r)
        u = r["us"]
        label, dims = f"{r['model']}.{r['layer']}", f"{r['M']}x{r['K']}x{r['N']}"
        print(f"{label:<26}{dims:>18}{r['epilogue']:>10}"
              f"{u['extern']:9.1f}{u['template']:9.1f}{u['auto']:9.1f}{u.get('inductor', float('nan')):9.1f}"
              f"{u['eager']:9.1f}"
              f"  {r['chose']:<9} {u['template'] / u['extern']:.2f}  {r['config']}  [{r['choice_ms']}]"
              + ("" if r["template_applied"] else "  (template refused)"), flush=True)
    wins = [r for r in results if r["us"]["template"] < r["us"]["extern"] * 0.97]
    chosen_wins = [r for r in wins if r["chose"] == "template"]
    slower = [r for r in results if r["us"]["auto"] > r["us"]["extern"] * 1.03]
    print(f"template faster than extern on {len(wins)}/{len(results)} layers; chosen on {len(chosen_wins)} "
          f"of those; auto slower than extern (>3%) on {len(slower)}: "
          f"{[r['model'] + '.' + r['layer'] for r in slower]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "dtype": args.dtype, "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
