"""Compile and run from many threads at once: ``python -m fxwrap.testing.stress --threads 8``.

Each thread, released together by a barrier, does every kind of work a program does with
fxwrap, on inputs of its own, and checks each result against eager:

* ``fxwrap.lower`` of a new instance of one module class (instances share a code object);
* ``torch.compile(fn, backend="fxwrap")`` of a function (the backend looked up by name);
* ``fxwrap.load`` of a program another thread's lowering saved, and a run of it;
* a training step of a compiled module: forward, then ``backward()``, gradients checked.

Run two such processes with one ``FXWRAP_CACHE_DIR`` (``tests/cpu/test_thread_stress.py``
does) and the on-disk caches are shared too.  It prints ``STRESS OK <n> tasks`` or raises
with every failure; ``--device cuda`` runs the same on a GPU (CUDA's backward runs on the
autograd engine's device thread).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import traceback

import torch

import fxwrap


class Block(torch.nn.Module):
    """One module class: every thread lowers an instance of its own."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _pointwise(x, y):
    return (x.sin() * y + 1).relu().softmax(-1)


def _check(got, expected, what: str) -> None:
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


def run_thread(index: int, device: str, folder: str, barrier: threading.Barrier, rounds: int) -> None:
    torch.manual_seed(1000 + index)
    barrier.wait()
    for round_ in range(rounds):
        x = torch.randn(4, 8, 32, device=device)
        block = Block().to(device)
        program = fxwrap.lower(block, x)
        _check(program.run(x), block(x), f"thread {index} lower")
        path = os.path.join(folder, f"block-{index}-{round_}.fxw")
        program.save(path)

        a, b = torch.randn(16, 24, device=device), torch.randn(16, 24, device=device)
        compiled = torch.compile(_pointwise, backend="fxwrap")
        _check(compiled(a, b), _pointwise(a, b), f"thread {index} torch.compile")

        loaded = fxwrap.load(path)
        x2 = torch.randn(4, 8, 32, device=device)
        _check(loaded.run(x2), block(x2), f"thread {index} load")

        train = Block().to(device)
        reference = Block().to(device)
        reference.load_state_dict(train.state_dict())
        step = torch.compile(train, backend="fxwrap")
        step(x).square().mean().backward()
        reference(x).square().mean().backward()
        for (name, p), q in zip(train.named_parameters(), reference.parameters()):
            _check(p.grad, q.grad, f"thread {index} backward {name}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    failures: list[str] = []
    barrier = threading.Barrier(args.threads)
    # While AOTAutograd traces in one thread, torch's FX-tracing flag is set for the whole
    # process, and a torch.compile'd call on another thread raises "Detected that you are
    # using FX to symbolically trace a dynamo-optimized function" unless this is off; off,
    # such a call runs its function eagerly (docs/programs.md, Threads).
    torch._dynamo.config.error_on_nested_fx_trace = False
    with tempfile.TemporaryDirectory(prefix="fxwrap-stress-") as folder:
        def target(i):
            try:
                run_thread(i, args.device, folder, barrier, args.rounds)
            except BaseException:  # noqa: BLE001  (every failure is reported, with its thread)
                failures.append(f"thread {i}:\n{traceback.format_exc()}")
                barrier.abort()
        threads = [threading.Thread(target=target, args=(i,), name=f"stress-{i}") for i in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failures:
        raise SystemExit("STRESS FAILED\n" + "\n".join(failures))
    print(f"STRESS OK {args.threads * args.rounds * 4} tasks on {args.device}")
    return 0


def run_processes(device: str, cache_dir: str, processes: int = 2, threads: int = 8,
                  timeout: float = 600) -> list[str]:
    """Run ``processes`` stress processes at once, sharing the cache folder ``cache_dir``;
    the failures, one text per failed process (exit status, the end of its output), or ``[]``."""
    env = dict(os.environ, FXWRAP_CACHE_DIR=cache_dir, OMP_NUM_THREADS="1")
    command = [sys.executable, "-X", "faulthandler", "-m", "fxwrap.testing.stress",
               "--threads", str(threads), "--device", device]
    running = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(processes)]
    failures = []
    for process in running:
        out, err = process.communicate(timeout=timeout)
        if process.returncode != 0 or f"STRESS OK {threads * 4} tasks on {device}" not in out:
            failures.append(f"exit {process.returncode}\n{out[-2000:]}\n{err[-6000:]}")
    return failures


if __name__ == "__main__":
    raise SystemExit(main())
