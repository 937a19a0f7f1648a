"""Lowering time of ``x = x * torch.sigmoid(x)`` repeated n times (issue 16).

The chain fuses into one kernel whose value is a DAG of 2n + 1 loop-IR nodes (a tree
of about 2**n); compile time must grow with the former::

    PYTHONPATH=. python benchmarks/chain_compile_time.py 14,16,18,32,64 [target]
    n=14 cpu 0.12s ok=True
    ...
"""
from __future__ import annotations

import sys
import time

import torch

import fxwrap


def chain(n: int):
    def f(x):
        for _ in range(n):
            x = x * torch.sigmoid(x)
        return x
    return f


def main(argv: list[str]) -> None:
    sizes = [int(a) for a in (argv[0] if argv else "14,16,18,32,64").split(",")]
    target = argv[1] if len(argv) > 1 else "cpu"
    for n in sizes:
        x = torch.randn(64)
        start = time.perf_counter()
        program = fxwrap.lower(chain(n), x, target=target)
        elapsed = time.perf_counter() - start
        ok = torch.allclose(program.run(x), chain(n)(x), atol=1e-5)
        print(f"n={n} {target} {elapsed:.2f}s ok={ok}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
