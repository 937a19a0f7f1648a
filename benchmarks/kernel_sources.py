"""Write the source of every kernel of a few programs, per target, to a folder: run it
before and after a compiler change and diff the folders (kernel sources must not change
unless the change means them to)::

    PYTHONPATH=. python benchmarks/kernel_sources.py /tmp/before cpu,triton-interpret,mps_shim,reference
    ... change the compiler ...
    PYTHONPATH=. python benchmarks/kernel_sources.py /tmp/after cpu,triton-interpret,mps_shim,reference
    diff -r /tmp/before /tmp/after

Run both with the same ``FXWRAP_CACHE_DIR``: a template choice's measured times (comments in the
``.code`` files, and which candidate wins a tie) come from the timing cache there
(``core.templates.TimingCache``); with two caches those comments differ run to run.

Files are named ``<target>__<program>__<0 forward/inference, 1 backward>__<kernel>.src``; each
program's printed Wrapper IR (``Program.code()``, nested programs included) is
``<target>__<program>__<0 or 1>.code``.  The programs: a few models and op families
(``cases``), products under GEMM/GEMV templates (``template_cases``), control flow
(``torch.cond``, ``while_loop``) and the fuzzer's programs of seeds ``FUZZ_SEEDS``
(``fxwrap.testing.fuzz``).

Target ``cuda-offline`` (not in the default list) writes the kernels of the GPU's plans without
a GPU (``fxwrap.testing.offline_cuda``: rendered, never run), for ``cases`` and the sizes that
select the GPU-only plans (``gpu_plan_cases``: split-outer column reductions, long rows, the
look-back and split scans), static and dynamic: the first program of each only::

    PYTHONPATH=. python benchmarks/kernel_sources.py /tmp/before cuda-offline
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
# every program compiled now: a program cache entry would hold the sources of the compiler that stored it
os.environ["FXWRAP_PROGRAM_CACHE"] = "0"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "models"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import fxwrap  # noqa: E402
from fxwrap.testing.offline_cuda import offline_programs  # noqa: E402
from test_control_flow import branchy, tensor_loop  # noqa: E402
from test_transformer import Block  # noqa: E402

TARGETS = ["cpu", "triton-interpret", "mps_shim", "reference"]
FUZZ_SEEDS = range(930000, 930040)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.b(F.gelu(self.a(x))).softmax(-1)


def silu_chain(x):
    for _ in range(8):
        x = x * torch.sigmoid(x)
    return x


def cases():
    """``(name, function, inputs, lower() options)``: models, masked, indirect and
    multi-output reductions, bf16, integer ops, shared sub-expressions, constants."""
    torch.manual_seed(0)
    yield "block_train", Block(attention="explicit", causal=True), (torch.randn(2, 8, 32),), {"training": True}
    yield "block_dyn", Block(), (torch.randn(2, 8, 32),), {"dynamic": True}
    yield "mlp_train", Mlp(), (torch.randn(4, 16),), {"training": True}
    yield ("cat_pad", lambda x, y: F.pad(torch.cat([x, y * 2], 1), (1, 2)).sum(0),
           (torch.randn(4, 3), torch.randn(4, 5)), {})
    yield ("embed", lambda i, w: (F.embedding(i, w) * 2).relu(),
           (torch.randint(0, 10, (6,)), torch.randn(10, 16)), {})
    yield "gather_neg", lambda x, i: x[i] + x[-1], (torch.randn(10, 4), torch.randint(-10, 10, (5,))), {}
    yield "argmax_var", lambda x: (x.argmax(-1), torch.var_mean(x, -1), x.amax(0)), (torch.randn(7, 9),), {}
    yield ("bf16", lambda x, y: (x * y + x.sigmoid()).to(torch.bfloat16) / 3,
           (torch.randn(8, 8).bfloat16(), torch.randn(8, 8).bfloat16()), {})
    yield ("ints", lambda a, b: ((a // b) % 3, a << 2, (a > b) & (a != 0), torch.where(a > 0, a, -a)),
           (torch.randint(-50, 50, (16,)), torch.randint(1, 9, (16,))), {})
    yield "chain8", silu_chain, (torch.randn(64),), {}
    yield ("consts", lambda x: (x + 0.0) * (x - -0.0) + (x * 2) + (x * 2.0) + x.clamp(-1, 1)
           + float("nan") * (x > 100), (torch.randn(16),), {})


def template_cases():
    """Matrix products the targets' templates compute (``templates="always"``), epilogues fused."""
    torch.manual_seed(0)
    always = {"options": {"templates": "always"}}
    yield ("mm_relu", lambda a, b: torch.relu(a @ b), (torch.randn(32, 16), torch.randn(16, 24)), always)
    yield ("addmm_gelu", lambda a, b, c: F.gelu(torch.addmm(c, a, b)),
           (torch.randn(16, 32), torch.randn(32, 8), torch.randn(8)), always)
    yield "bmm", lambda a, b: torch.bmm(a, b) * 2, (torch.randn(2, 8, 16), torch.randn(2, 16, 12)), always
    yield ("gemv", lambda x, w: torch.sigmoid(x @ w.t()), (torch.randn(1, 64), torch.randn(48, 64)), always)
    yield "gemv_kn", lambda x, w: x @ w, (torch.randn(1, 32), torch.randn(32, 40)), always


def gpu_plan_cases():
    """Sizes whose GPU plans the interpreter's small thresholds never give (``cuda-offline``)."""
    torch.manual_seed(0)
    long_row = torch.randn(1, 1 << 23)
    yield "col_sum", lambda x: x.sum(0), (torch.randn(8192, 64),), {}
    yield "mid_mean", lambda x: x.mean(1), (torch.randn(4, 8192, 32),), {}
    yield "col_var", lambda x: torch.var_mean(x, 0), (torch.randn(8192, 64),), {}
    yield "col_argmax_any", lambda x: (x.argmax(0), (x > 2).any(0)), (torch.randn(8192, 64),), {}
    yield "col_max_int", lambda x: x.max(0).values, (torch.randint(-100, 100, (8192, 64)),), {}
    yield "layer_norm", lambda x: F.layer_norm(x, (8192,)), (torch.randn(16, 8192),), {}
    yield "row_argmin", lambda x: x.argmin(-1), (torch.randn(64, 50000),), {}
    yield "row_prod_bf16", lambda x: x.prod(-1), (torch.randn(64, 1000, dtype=torch.bfloat16),), {}
    yield "row_all", lambda x: (x > -3).all(-1), (torch.randn(64, 5000),), {}
    yield "cumsum_long", lambda x: x.cumsum(-1), (long_row,), {}
    yield "cumsum_long_f64", lambda x: x.cumsum(-1), (long_row.double(),), {}
    yield "cumprod_logcumsumexp_long", lambda x: ((x * 1e-3 + 1).cumprod(-1), x.logcumsumexp(-1)), (long_row,), {}
    yield "cummax_long", lambda x: x.cummax(-1), (long_row,), {}
    yield "cumsum_int_rows", lambda x: x.cumsum(-1), (torch.randint(0, 5, (2, 100000)),), {}
    yield "transpose", lambda x: x.t().contiguous() * 2, (torch.randn(512, 768),), {}


def offline_cases():
    """``cuda-offline``'s programs: the first of each case, static and dynamic."""
    for name, fn, inputs, options in (*cases(), *gpu_plan_cases()):
        yield name, fn, inputs, {}
        yield f"{name}_dyn", fn, inputs, {"dynamic": True}


def control_flow_cases():
    """``torch.cond`` (forward and backward) and ``while_loop``: nested programs."""
    inputs = ((torch.rand(4, 3) + 0.1).requires_grad_(), torch.randn(4, 3, requires_grad=True))
    yield "cond_train", branchy, inputs, {"training": True}
    yield "while_loop", tensor_loop, (torch.randn(6), torch.randn(6)), {}


def fuzz_cases():
    """The fuzzer's programs of seeds ``FUZZ_SEEDS``, as its harness builds them."""
    from fxwrap.testing.fuzz import harness
    from fxwrap.testing.fuzz.generator import generate
    for seed in FUZZ_SEEDS:
        ns = {"torch": torch}
        exec(generate(seed), ns)  # noqa: S102 - the generator's own code
        options = {"training": bool(ns["BACKWARD"]), "dynamic": bool(ns["DYNAMIC"])}
        if options["training"] and not any(t.requires_grad for t in harness.make_inputs(ns)):
            options["training"] = False
        yield f"fuzz{seed}", harness.make_module(ns), tuple(harness.make_inputs(ns)), options


def all_cases():
    yield from cases()
    yield from template_cases()
    yield from control_flow_cases()
    yield from fuzz_cases()


def lowered_programs(target: str, fn, inputs, options) -> list:
    """The programs of one case on ``target``: inference, or forward and backward."""
    if target == "cuda-offline":
        return offline_programs(fn, *inputs, dynamic=options.get("dynamic", False))
    lowered = fxwrap.lower(fn, *inputs, target=target, **options)
    return [lowered.forward, lowered.backward] if hasattr(lowered, "backward") else [lowered]


def main(out_dir: str, targets: list[str]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for target in targets:
        for name, fn, inputs, options in (offline_cases() if target == "cuda-offline" else all_cases()):
            try:
                programs = lowered_programs(target, fn, inputs, options)
            except Exception as exc:  # keep going: a failure shows as missing files
                print("FAIL", target, name, type(exc).__name__, str(exc)[:200])
                continue
            for i, program in enumerate(programs):
                with open(os.path.join(out_dir, f"{target}__{name}__{i}.code"), "w") as f:
                    f.write(program.code())
                for line in program.lines:
                    if type(line).__name__ == "DefineKernel":
                        path = os.path.join(out_dir, f"{target}__{name}__{i}__{line.kernel.name}.src")
                        with open(path, "w") as f:
                            f.write(line.kernel.source)
        print("done", target, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else TARGETS)
