"""Per-launch cost of the profiler check in Kernel.__call__ with no profiler running (docs/debugging.md):
a small model's call time with the check and without it, interleaved; then the check alone.

    python benchmarks/profiler_check_cost.py
"""
import statistics, time, torch, fxwrap
from fxwrap.runtime.kernel import Kernel
from fxwrap.testing.models import TransformerBlock

torch.manual_seed(0)
torch.set_num_threads(1)
model = TransformerBlock().eval()
x = torch.randn(2, 8, 32)
program = fxwrap.lower(model, x, target="cpu")
launches = sum(isinstance(n.target, Kernel) for n in program.graph_module.graph.nodes)
checked = Kernel.__call__

def unchecked(self, *args):
    return self._launcher(*args)

graph_inputs = program.arguments((x,))
def per_call(n=2000):
    start = time.perf_counter()
    for _ in range(n):
        program(*graph_inputs)
    return (time.perf_counter() - start) / n

with torch.no_grad():
    for _ in range(200):
        program(*graph_inputs)
    with_check, without = [], []
    for _ in range(15):
        Kernel.__call__ = checked; with_check.append(per_call())
        Kernel.__call__ = unchecked; without.append(per_call())
    Kernel.__call__ = checked
a, b = statistics.median(with_check), statistics.median(without)
print(f"{launches} kernel launches per call; median call: with check {a*1e6:.2f} us, without {b*1e6:.2f} us; "
      f"difference {(a-b)*1e6:.2f} us per call = {(a-b)/launches*1e9:.0f} ns per launch "
      f"(min with {min(with_check)*1e6:.2f}, min without {min(without)*1e6:.2f})")

# the check alone: a Kernel whose launcher does nothing, called 10^6 times
k = Kernel("noop", "", "cpu", ())
k.bind(lambda *a: None)
import timeit
for _ in range(3):
    Kernel.__call__ = checked; c = min(timeit.repeat(lambda: k(1, 2), number=200000, repeat=5)) / 200000
    Kernel.__call__ = unchecked; u = min(timeit.repeat(lambda: k(1, 2), number=200000, repeat=5)) / 200000
    print(f"no-op kernel call: with check {c*1e9:.0f} ns, without {u*1e9:.0f} ns, check costs {(c-u)*1e9:.0f} ns")
Kernel.__call__ = checked
