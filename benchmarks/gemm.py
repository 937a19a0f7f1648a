"""GEMM templates: linear layers with their epilogues, eager vs Inductor vs fxwrap, in one
process, interleaved (each round runs every backend once, so machine noise hits all alike).

    python benchmarks/gemm.py                          # 1 and 2 threads, fp32 and bf16, every case
    python benchmarks/gemm.py --threads 1 --cases relu_linear --dtypes float32
    python benchmarks/gemm.py --max-autotune           # + Inductor's max-autotune (its C++ GEMM template)

Cases: ``relu(linear(x, w, b))`` 128x768 by 3072x768 (issue 18) and the linear layers of
the model suite's small models (benchmarks/suite_models.py): GPT (tokens 8 x 128, dim
192: qkv, proj + residual, fc1 + tanh gelu as the model has it (and
with the erf gelu), fc2 + residual), Llama (dim 192, hidden 512: w1 +
silu, w2 + residual, no bias), MLP (batch 64: 256 -> 512 + gelu).  Backends: eager,
Inductor (default; ``--max-autotune`` adds mode="max-autotune-no-cudagraphs"), fxwrap
with templates "off" (the ATen call + an epilogue kernel), "auto" (the timed choice) and
"always" (the template forced).  Each thread count runs in a subprocess of its own
(``OMP_NUM_THREADS`` and ``torch.set_num_threads``).  Printed: median ms per backend,
``auto / min(eager, inductor)`` and ``always / min(eager, inductor)``, and fxwrap's choice.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

# name -> (rows, in, out, bias, epilogue)
CASES = {
    "relu_linear": (128, 768, 3072, True, "relu"),
    "gpt_qkv": (1024, 192, 576, True, "none"),
    "gpt_proj_residual": (1024, 192, 192, True, "residual"),
    "gpt_fc1_gelu": (1024, 192, 768, True, "gelu_tanh"),
    "gpt_fc1_gelu_erf": (1024, 192, 768, True, "gelu"),
    "gpt_fc2_residual": (1024, 768, 192, True, "residual"),
    "llama_w1_silu": (1024, 192, 512, False, "silu"),
    "llama_w2_residual": (1024, 512, 192, False, "residual"),
    "mlp_fc_gelu": (64, 256, 512, True, "gelu"),
    # the hand Llama's other linear layers: wq / wo, wk / wv of 2 grouped KV heads (64 wide),
    # w3 times the SwiGLU gate silu(w1 x), and the LM head (vocabulary 1000)
    "llama_wq": (1024, 192, 192, False, "none"),
    "llama_wkv_gqa": (1024, 192, 64, False, "none"),
    "llama_w3_gate": (1024, 192, 512, False, "gate"),
    "llama_head": (1024, 192, 1000, False, "none"),
}
EPILOGUES = {
    "none": lambda y, r: y,
    "relu": lambda y, r: torch.relu(y),
    "gelu": lambda y, r: F.gelu(y),
    "gelu_tanh": lambda y, r: F.gelu(y, approximate="tanh"),
    "silu": lambda y, r: F.silu(y),
    "residual": lambda y, r: y + r,
    "gate": lambda y, r: F.silu(r) * y,
}


def make_case(name, dtype):
    rows, k, n, bias, epilogue = CASES[name]
    ep = EPILOGUES[epilogue]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    r = torch.randn(rows, n, generator=g).to(dtype)

    def fn(x, w, b, r):
        return ep(F.linear(x, w, b), r)
    return fn, (x, w, b, r)


def timed(fn, args, seconds=0.05):
    """ms per call; at one thread the thread's CPU time (a loaded machine's waits for a core
    not counted: every backend then runs on this thread alone)."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    fn(*args)
    start = clock()
    fn(*args)
    once = max(clock() - start, 1e-6)
    reps = max(1, min(200, int(seconds / once)))
    start = clock()
    for _ in range(reps):
        fn(*args)
    return (clock() - start) / reps * 1e3


def run_child(opts) -> list[dict]:
    import fxwrap
    torch.set_num_threads(opts.threads)
    results = []
    for dtype_name in opts.dtypes:
        dtype = getattr(torch, dtype_name)
        for case in opts.cases:
            fn, args = make_case(case, dtype)
            backends = {"eager": fn, "inductor": torch.compile(fn)}
            if opts.max_autotune:
                backends["inductor-max-autotune"] = torch.compile(fn, mode="max-autotune-no-cudagraphs")
            choice = {}
            for mode in ("off", "auto", "always"):
                programs: list = []
                backends[f"fxwrap-{mode}"] = torch.compile(
                    fn, backend=fxwrap.Backend("cpu", {"templates": mode, "on_program": programs.append}))
                backends[f"fxwrap-{mode}"](*args)
                if mode == "auto":
                    notes = [ln for p in programs for ln in p.lines if isinstance(ln, fxwrap.lines.TemplateChoice)]
                    choice = {"chosen": [c.chosen for c in notes], "compile_time_ms": [dict(c.times) for c in notes]}
            want = fn(*args)
            tol = 5e-2 if dtype == torch.bfloat16 else 1e-3
            for name, c in backends.items():
                torch.testing.assert_close(c(*args), want, atol=tol, rtol=tol, msg=lambda m: f"{case} {name}: {m}")
            samples = {name: [] for name in backends}
            for _ in range(opts.rounds):
                for name, c in backends.items():
                    samples[name].append(timed(c, args))
            ms = {name: statistics.median(v) for name, v in samples.items()}
            best = min(ms["eager"], ms["inductor"])
            results.append({"case": case, "dtype": dtype_name, "threads": opts.threads, "ms": ms,
                            "auto_vs_best": ms["fxwrap-auto"] / best, "always_vs_best": ms["fxwrap-always"] / best,
                            **choice})
            torch._dynamo.reset()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-autotune", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        opts.threads = opts.threads[0]
        print("RESULTS " + json.dumps(run_child(opts)))
        return
    results = []
    for threads in opts.threads:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        cmd = [sys.executable, __file__, "--child", "--threads", str(threads), "--rounds", str(opts.rounds),
               "--dtypes", *opts.dtypes, "--cases", *opts.cases] + (["--max-autotune"] if opts.max_autotune else [])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULTS ")), None)
        if line is None:
            sys.exit(f"benchmark child failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        results += json.loads(line[len("RESULTS "):])
    names = list(results[0]["ms"]) if results else []
    print(f"{'case':22} {'dtype':9} thr " + " ".join(f"{n:>14}" for n in names)
          + "   auto/best always/best  chosen")
    for r in results:
        print(f"{r['case']:22} {r['dtype']:9} {r['threads']:3} " + " ".join(f"{r['ms'][n]:14.3f}" for n in names)
              + f"   {r['auto_vs_best']:9.2f} {r['always_vs_best']:11.2f}  {','.join(r.get('chosen', []))}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
