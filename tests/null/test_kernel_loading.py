"""Kernels of one program are loaded together: ``KernelEmitter.load_threads`` at once,
each launcher returned in its source's place and bound to its own kernel (what a
compiler-subprocess-bound load needs)."""
import threading
import time

import torch

from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.targets.base import KernelEmitter, KernelSource
from fxwrap.wrapper_ir.build_render import _load_all


class _SlowEmitter(KernelEmitter):
    load_threads = 4

    def __init__(self):
        super().__init__(None)
        self.threads, self.active, self.most = set(), 0, 0
        self.lock = threading.Lock()

    def load(self, source):
        with self.lock:
            self.threads.add(threading.get_ident())
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(0.05)  # a compiler subprocess
        with self.lock:
            self.active -= 1
        factor = float(source.text)
        return lambda x, out: out.copy_(x * factor)


def _loads(n):
    sig = (KernelArg("x", "input"), KernelArg("out", "output"))
    return [(Kernel(f"k{i}", str(i + 1), "test", sig, {}), KernelSource(f"k{i}", str(i + 1), "test", sig))
            for i in range(n)]


def test_loads_run_concurrently_and_bind_each_kernel_its_launcher():
    emitter, loads = _SlowEmitter(), _loads(8)
    for (kernel, _), launcher in zip(loads, _load_all(emitter, [source for _, source in loads])):
        kernel.bind(launcher)
    assert emitter.most > 1 and len(emitter.threads) > 1
    x = torch.randn(5)
    for i, (kernel, _) in enumerate(loads):
        out = torch.empty(5)
        kernel(x, out)
        torch.testing.assert_close(out, x * (i + 1))


def test_one_thread_loads_in_order():
    emitter, loads = _SlowEmitter(), _loads(3)
    emitter.load_threads = 1
    launchers = _load_all(emitter, [source for _, source in loads])
    assert emitter.most == 1 and len(launchers) == 3
