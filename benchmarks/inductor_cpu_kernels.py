"""Inductor's C++ kernels and extern calls one by one, for comparing with fxwrap's
``benchmarks/models.py --profile`` (one thread, thread CPU time).

    python benchmarks/inductor_cpu_kernels.py llama          # a model of benchmarks/suite_models.py
    python benchmarks/inductor_cpu_kernels.py hf_llama 25    # the 25 costliest names

Compiles the model's inference (small sizes, one thread) with Inductor, wraps each
``cpp_fused_*`` kernel and ``extern_kernels.*`` call of its output code in a timer, runs it
5 times and prints, per name, the sum over its calls of each call's fastest time.  Calls
outside those two (``torch.ops.aten`` externs such as SDPA) are left in the whole call's time.
"""
from __future__ import annotations

import collections
import math
import os
import sys
import time

import torch
import torch._inductor.config as inductor_config
from torch._inductor.codecache import PyCodeCache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_models  # noqa: E402


def main() -> None:
    name = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    inductor_config.fx_graph_cache = False
    torch.set_num_threads(1)
    entry = next(m for m in suite_models.MODELS if m.name == name)
    why = suite_models.missing(entry)
    if why:
        sys.exit(f"{name}: {why}")
    torch.manual_seed(0)
    model, make_inputs, _ = entry.build("cpu", "small")
    model.eval()
    inputs = make_inputs(1)
    compiled = torch.compile(model)
    with torch.no_grad():
        compiled(*inputs)
    modules = PyCodeCache.modules if isinstance(PyCodeCache.modules, list) else list(PyCodeCache.modules.values())
    best: dict[str, dict[int, float]] = collections.defaultdict(lambda: collections.defaultdict(lambda: math.inf))
    calls: collections.Counter = collections.Counter()

    def timed(label, fn):
        def call(*args, **kwargs):
            start = time.thread_time()
            result = fn(*args, **kwargs)
            seconds = time.thread_time() - start
            calls[label] += 1
            best[label][calls[label]] = min(best[label][calls[label]], seconds)
            return result
        return call

    class Externs:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, attr):
            return timed(f"extern_kernels.{attr}", getattr(self.inner, attr))

    for module in modules:
        names = module.__dict__
        for key, value in list(names.items()):
            if key.startswith("cpp_fused") and callable(value):
                names[key] = timed(key, value)
        if "extern_kernels" in names and not isinstance(names["extern_kernels"], Externs):
            names["extern_kernels"] = Externs(names["extern_kernels"])
    whole = math.inf
    with torch.no_grad():
        for _ in range(5):
            calls.clear()
            start = time.thread_time()
            compiled(*inputs)
            whole = min(whole, time.thread_time() - start)
    rows = sorted(((sum(v.values()), len(v), k) for k, v in best.items()), reverse=True)
    print(f"Inductor {name}: whole call {whole * 1e3:.2f} ms, these calls {sum(r[0] for r in rows) * 1e3:.2f} ms")
    for seconds, count, label in rows[:top]:
        print(f"  {seconds * 1e3:8.3f} ms {count:3d}x {label[:110]}")


if __name__ == "__main__":
    main()
