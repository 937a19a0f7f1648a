"""Write the source of every kernel of a few programs, per target, to a folder: run it
before and after a compiler change and diff the folders (kernel sources must not change
unless the change means them to)::

    PYTHONPATH=. python benchmarks/kernel_sources.py /tmp/before cpu,triton-interpret,mps_shim,reference
    ... change the compiler ...
    PYTHONPATH=. python benchmarks/kernel_sources.py /tmp/after cpu,triton-interpret,mps_shim,reference
    diff -r /tmp/before /tmp/after

Files are named ``<target>__<program>__<0 forward/inference, 1 backward>__<kernel>.src``; each
program's printed Wrapper IR (``Program.code()``, nested programs included) is
``<target>__<program>__<0 or 1>.code``.  The programs: a few models and op families
(``cases``), control flow (``torch.cond``, ``while_loop``) and the fuzzer's programs of seeds
``FUZZ_SEEDS`` (``fxwrap.testing.fuzz``).
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
    yield from control_flow_cases()
    yield from fuzz_cases()


def main(out_dir: str, targets: list[str]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for target in targets:
        for name, fn, inputs, options in all_cases():
            try:
                lowered = fxwrap.lower(fn, *inputs, target=target, **options)
            except Exception as exc:  # keep going: a failure shows as missing files
                print("FAIL", target, name, type(exc).__name__, str(exc)[:200])
                continue
            programs = [lowered.forward, lowered.backward] if hasattr(lowered, "backward") else [lowered]
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
