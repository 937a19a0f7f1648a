"""Kernels of one program are loaded together: ``KernelEmitter.load_threads`` at once,
each launcher returned in its source's place and bound to its own kernel (what a
compiler-subprocess-bound load needs)."""
import threading
import time

import torch

from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.targets.base import KernelEmitter, KernelSource
from fxwrap.wrapper_ir.render import _load_all


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


def test_first_calls_racing_from_threads_load_one_launcher():
    """Eight threads make a kernel's first call at once: the loader runs once and every
    thread launches through that one launcher (a second one would be dropped while its
    launches may still run; a CUDA launcher unloads its module then)."""
    loaded, barrier = [], threading.Barrier(8)

    def slow_loader(kernel):
        time.sleep(0.05)  # a compile: the other threads reach their first call meanwhile
        launcher = lambda x, out: out.copy_(x * 3.0)  # noqa: E731
        loaded.append(launcher)
        return launcher

    kernel = Kernel("k_race", "3", "test", (KernelArg("x", "input"), KernelArg("out", "output")),
                    {}, loader=slow_loader)
    xs = [torch.randn(6, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    outs = [torch.empty(6) for _ in range(8)]

    def first_call(i):
        barrier.wait()
        kernel(xs[i], outs[i])

    threads = [threading.Thread(target=first_call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loaded) == 1 and kernel.launcher() is loaded[0]
    for x, out in zip(xs, outs):
        torch.testing.assert_close(out, x * 3.0)
