"""First-call compile time of the suite models, fxwrap vs Inductor, each compile in a fresh process.

    PYTHONPATH=. python benchmarks/compile_time.py                      # llama, gpt, convnet, mlp on CPU
    PYTHONPATH=. python benchmarks/compile_time.py --models gpt --variants training-fp32 --repeat 2
    PYTHONPATH=. python benchmarks/compile_time.py --other /path/to/older/checkout   # before/after

Per model and variant (one thread, CPU), each backend's first call (compile + one run; for
training the forward and the backward) in a new process with the whole-graph caches off
(Inductor's FX graph and AOTAutograd caches, fxwrap's program cache) and:

* ``cold``: empty kernel caches (a fresh ``FXWRAP_CACHE_DIR`` / ``TORCHINDUCTOR_CACHE_DIR``):
  every kernel compiled, every template candidate timed -- a model never seen before;
* ``kernels``: a second process on the same cache directory: the kernel binaries (and
  fxwrap's template timings) cached, the graphs lowered again.

fxwrap's columns also split its own time (``compile_aten_graph``) into its phases
(``fxwrap.core.logs.PhaseTimer``: lowering, schedule, render, compile kernels, template
choice, ...), summed over the programs.  ``--other PATH`` runs fxwrap a second time from
another checkout (``PYTHONPATH=PATH``) in the same rounds, so a before/after pair is taken
under the same machine load.  ``--repeat N`` keeps each column's fastest of N (noise only
adds time).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("llama", "gpt", "convnet", "mlp")
VARIANTS = ("inference-fp32", "training-fp32")


def child(backend: str, model_name: str, variant: str) -> dict:
    """One first call in this (fresh) process; returns seconds."""
    import torch

    torch.set_num_threads(1)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    sys.path.insert(0, HERE)
    import suite_models

    phases: dict[str, float] = {}
    if backend == "fxwrap":
        from fxwrap.core import logs

        timers = []
        init = logs.PhaseTimer.__init__

        def recording_init(self, *args, **kwargs):
            init(self, *args, **kwargs)
            timers.append(self)
        logs.PhaseTimer.__init__ = recording_init
    step = suite_models.cpu_step(
        model_name, variant, lambda model: torch.compile(model) if backend == "inductor" else
        torch.compile(model, backend="fxwrap", options={"cache": False}))

    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    if backend == "fxwrap":
        for timer in timers:
            for name, seconds in timer.phases.items():
                phases[name] = phases.get(name, 0.0) + seconds
    return {"first_s": first, "phases": phases}


def _spawn(backend: str, model: str, variant: str, cache_dir: str, path: str | None) -> dict:
    root = path or os.path.dirname(HERE)
    env = dict(os.environ, FXWRAP_CACHE_DIR=os.path.join(cache_dir, "fxwrap"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir, "inductor"), FXWRAP_PROGRAM_CACHE="0",
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, __file__, "--child", backend, model, variant], capture_output=True,
                         text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{backend} {model} {variant} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _phases(result: dict) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(result["phases"].items(), key=lambda kv: -kv[1]) if v >= 0.05)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--repeat", type=int, default=1, help="keep each column's fastest of this many")
    parser.add_argument("--other", help="another fxwrap checkout, run as 'fxwrap (other)' in the same rounds")
    parser.add_argument("--no-inductor", action="store_true", help="leave Inductor out")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", nargs=3, metavar=("BACKEND", "MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    runs = [("fxwrap", "fxwrap", None)]
    if args.other:
        runs.insert(0, ("fxwrap (other)", "fxwrap", args.other))
    if not args.no_inductor:
        runs.append(("inductor", "inductor", None))
    print(f"# one thread, {args.repeat} repeat(s); seconds of the first call; cold = empty kernel caches, "
          "kernels = kernel binaries cached", flush=True)
    results = []
    for model in args.models.split(","):
        for variant in args.variants.split(","):
            best: dict[str, dict] = {}
            for _ in range(args.repeat):
                for label, backend, path in runs:
                    with tempfile.TemporaryDirectory(prefix="fxwrap-compile-time-") as cache_dir:
                        cold = _spawn(backend, model, variant, cache_dir, path)
                        warm = _spawn(backend, model, variant, cache_dir, path)
                    for kind, r in (("cold", cold), ("kernels", warm)):
                        key = f"{label}|{kind}"
                        if key not in best or r["first_s"] < best[key]["first_s"]:
                            best[key] = r
            row = {"model": model, "variant": variant, **{k: v for k, v in best.items()}}
            results.append(row)
            for label, _, _ in runs:
                cold, warm = best[f"{label}|cold"], best[f"{label}|kernels"]
                extra = f"   cold phases: {_phases(cold)}" if cold["phases"] else ""
                print(f"{model:<8} {variant:<15} {label:<15} cold {cold['first_s']:6.2f} s  "
                      f"kernels {warm['first_s']:6.2f} s{extra}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
