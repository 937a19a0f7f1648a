"""Optimizer steps over many small tensors: eager, Inductor and fxwrap in one interleaved
run (horizontal fusion: combo kernels, ``core/combo.py``).

    python benchmarks/optimizer.py                      # CPU, small sizes, quick
    python benchmarks/optimizer.py --device cuda --out optimizer.log

Cases, each over the 40 parameters of a small GPT-2-like transformer (3 layers; width 768
on CUDA, 64 on the CPU; embeddings, attention, MLP, layer norms: matrices, vectors, odd
sizes):

* ``adam_like``: one compiled function doing Adam's update of the 40 tensors by hand
  (``m.lerp_(g, 0.1)``, ``v.mul_(b2).addcmul_(g, g, value=1 - b2)``, ``p.addcdiv_(m,
  v.sqrt() / c2 + eps, value=-lr / c1)``), its steps' constants baked in;
* ``Adam-foreach``, ``Adam-loop``, ``AdamW-foreach``, ``AdamW-loop``: ``torch.compile`` of
  ``lambda: opt.step()`` for ``torch.optim.Adam`` / ``AdamW`` with ``foreach=True`` / ``False``.

Per case and backend: microseconds per step (the median of interleaved rounds; on CUDA the
GPU time of back-to-back steps queued behind a spin, and the wall time), the ratio to
Inductor, the kernels a step launches (CUDA: from torch.profiler, every backend; CPU:
fxwrap's kernel launches, and the kernels Inductor generated), and the bandwidth a step reaches as a share of a
copy's: a step reads the parameters, gradients and both moments and writes the parameters
and moments (7 x 4 bytes an element, the least a step can move),
``% of copy = (7 x 4 x elements / t) / (2 x copied bytes / t_copy)``.  For fxwrap the bytes
its kernels move a step are counted too (``MB/step``, and their ratio to the least, ``/ least``):
each kernel reads its inputs, writes its outputs and reads those outputs it also loads (an
in-place update), as its loop IR says (the ``lowering`` log, ``LoopIRReads``).
On CUDA each kernel of a step is also listed from ``torch.profiler`` with its time and, for
fxwrap's kernels, its bandwidth (those bytes over its time) as a share of a copy's and its
launch config (a combo kernel's: the autotuned one).  The issue's bar: fxwrap <= 0.90 of Inductor on
every case, each kernel >= 70% of copy bandwidth.
"""
from __future__ import annotations

import argparse
import logging
import re
import statistics
import sys
import time

import torch
import torch._dynamo

import fxwrap

BACKENDS = ("eager", "inductor", "fxwrap")
CASES = ("adam_like", "Adam-foreach", "Adam-loop", "AdamW-foreach", "AdamW-loop")
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8


def transformer_shapes(width: int, layers: int = 3, vocab: int | None = None) -> list[tuple[int, ...]]:
    """The parameter shapes of a GPT-2-like model: 2 + 12 per layer + 2 tensors (40 for 3 layers)."""
    vocab = vocab or 8 * width + 7
    shapes = [(vocab, width), (1024 if width >= 256 else 128, width)]
    for _ in range(layers):
        shapes += [(width,), (width,), (3 * width, width), (3 * width,), (width, width), (width,),
                   (width,), (width,), (4 * width, width), (4 * width,), (width, 4 * width), (width,)]
    return shapes + [(width,), (width,)]


def adam_like(params, grads, exp_avgs, exp_avg_sqs):
    """Adam's update at step 1, by hand: what a user writes, or what ``fused`` Adam computes."""
    c1, c2 = 1 - BETA1, (1 - BETA2) ** 0.5
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        m.lerp_(g, 1 - BETA1)
        v.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
        p.addcdiv_(m, v.sqrt() / c2 + EPS, value=-LR / c1)


class LoopIRReads(logging.Handler):
    """The buffers each fxwrap kernel loads, read from the loop IR the ``lowering`` log prints
    (``%3 = load.f32 arg5[768*x0 + x1]``; a combo kernel's record holds all its members): the
    kernels since the last ``take()``, by name."""

    LOAD = re.compile(r"= load\.\w+ (\w+)\[")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.pending: dict[str, set[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        self.pending[text.split(":", 1)[0]] = set(self.LOAD.findall(text))

    def take(self) -> dict[str, set[str]]:
        taken, self.pending = self.pending, {}
        return taken


def watch_loads() -> LoopIRReads:
    """A ``LoopIRReads`` on the ``fxwrap.lowering`` logger (kept from the console)."""
    handler = LoopIRReads()
    log = logging.getLogger("fxwrap.lowering")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    return handler


LOADS = watch_loads()


def make_step(case: str, backend: str, shapes, device, programs: list):
    """A callable doing one step of ``case`` with ``backend``, its tensors' element count, and
    the parameters it updates; each fxwrap program is appended to ``programs`` as
    ``(program, the buffers each of its kernels loads)``."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(device) for s in shapes]
    grads = [torch.randn(s, generator=gen).to(device) for s in shapes]
    compile_ = {"eager": None, "inductor": lambda f: torch.compile(f),
                "fxwrap": lambda f: torch.compile(f, backend=fxwrap.Backend(
                    "cuda" if torch.device(device).type == "cuda" else "cpu",
                    # compiled afresh: a program from the cache logs no loop IR (its bytes unknown)
                    {"on_program": lambda p: programs.append((p, LOADS.take())), "cache": False}))}
    wrap = compile_[backend]
    if case == "adam_like":
        m = [torch.zeros_like(p) for p in params]
        v = [torch.zeros_like(p) for p in params]
        fn = adam_like if wrap is None else wrap(adam_like)
        return (lambda: fn(params, grads, m, v)), sum(p.numel() for p in params), params
    name, mode = case.split("-")
    leaves = [torch.nn.Parameter(p) for p in params]
    for p, g in zip(leaves, grads):
        p.grad = g
    opt = getattr(torch.optim, name)(leaves, lr=LR, foreach=(mode == "foreach"))
    step = opt.step if wrap is None else wrap(lambda: opt.step())
    return step, sum(p.numel() for p in params), leaves


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_steps(step, device, reps: int) -> tuple[float, float | None]:
    """``(wall us per step, GPU us per step or None)`` over ``reps`` back-to-back steps."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        step()
    _sync(device)
    wall = (time.perf_counter() - start) * 1e6 / reps
    if torch.device(device).type != "cuda":
        return wall, None
    # the GPU spins while the host queues the steps: the events time the kernels back to back
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(1.5 * wall * 1e-6 * reps * 2e9) + 1_000_000)
    begin.record()
    for _ in range(reps):
        step()
    end.record()
    end.synchronize()
    return wall, begin.elapsed_time(end) * 1e3 / reps


def copy_time(numel: int, device, reps: int) -> float:
    """Microseconds of a copy of ``numel`` float32 elements (what "copy bandwidth" means here)."""
    src, dst = torch.randn(numel, device=device), torch.empty(numel, device=device)
    wall, gpu = time_steps(lambda: dst.copy_(src), device, reps)
    return gpu if gpu is not None else wall


def fxwrap_kernel_bytes(programs: list) -> dict[str, int]:
    """Each kernel's bytes moved in the last fxwrap program (the one a step runs): every argument
    buffer read (input) or written (output), an output the kernel also loads both."""
    out: dict[str, int] = {}
    for program, loads in programs[-1:]:
        for node in program.graph_module.graph.nodes:
            if not isinstance(node.target, fxwrap.Kernel):
                continue
            if node.target.name not in loads:
                return {}  # no loop IR logged for it: unknown
            loaded = loads[node.target.name]
            total = 0
            for arg, spec in zip(node.args, node.target.signature):
                val = getattr(arg, "meta", {}).get("val")
                if isinstance(val, torch.Tensor):
                    both = spec.role == "inout" or (spec.role == "output" and spec.name in loaded)
                    total += val.numel() * val.element_size() * (2 if both else 1)
            out[node.target.name] = out.get(node.target.name, 0) + total
    return out


def fxwrap_kernel_count(programs: list) -> int:
    return sum(isinstance(n.target, fxwrap.Kernel) for p, _ in programs[-1:] for n in p.graph_module.graph.nodes)


def profile_kernels(step) -> list[tuple[str, float]]:
    """``(kernel name, us)`` of each GPU kernel one step launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return [(e.name, e.device_time) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=None, help="steps a round (default 20 on CUDA, 5 on CPU)")
    parser.add_argument("--width", type=int, default=None, help="model width (default 768 on CUDA, 64 on CPU)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    reps = args.reps or (20 if cuda else 5)
    shapes = transformer_shapes(args.width or (768 if cuda else 64))
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    numel = sum(int(torch.Size(s).numel()) for s in shapes)
    t_copy = copy_time(numel, args.device, reps)
    copy_bw = 2 * 4 * numel / t_copy  # bytes per us
    say(f"# optimizer steps over {len(shapes)} tensors, {numel} elements; device {args.device}; "
        f"torch {torch.__version__}; copy of {4 * numel} bytes {t_copy:.1f} us ({copy_bw / 1e3:.0f} GB/s)")
    say("| case | backend | us/step | GPU us/step | / inductor | kernels/step | % of copy | MB/step | / least |")
    say("|---|---|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        torch._dynamo.reset()
        programs: list = []
        steps, counts, params = {}, {}, {}
        for backend in BACKENDS:
            before = _generated_kernels()
            steps[backend], n, params[backend] = make_step(case, backend, shapes, args.device, programs)
            steps[backend]()  # compile
            counts[backend] = (fxwrap_kernel_count(programs) if backend == "fxwrap"
                               else _generated_kernels() - before if backend == "inductor" else None)
        samples = {b: [] for b in BACKENDS}
        for _ in range(args.rounds):  # interleaved
            for backend in BACKENDS:
                samples[backend].append(time_steps(steps[backend], args.device, reps))
        kernel_lists = {b: profile_kernels(steps[b]) for b in BACKENDS} if cuda else {}
        medians = {}
        for backend in BACKENDS:
            wall = statistics.median(s[0] for s in samples[backend])
            gpu = statistics.median(s[1] for s in samples[backend]) if cuda else None
            medians[backend] = gpu if cuda else wall
        for backend in BACKENDS:
            wall = statistics.median(s[0] for s in samples[backend])
            t = medians[backend]
            count = len(kernel_lists[backend]) if cuda else counts[backend]
            share = 7 * 4 * n / t / copy_bw * 100
            moved = sum(fxwrap_kernel_bytes(programs).values()) if backend == "fxwrap" else None
            traffic = f"{moved / 1e6:.2f} | {moved / (7 * 4 * n):.2f}" if moved else "- | -"
            say(f"| {case} | {backend} | {wall:.1f} | {'%.1f' % t if cuda else '-'} | "
                f"{t / medians['inductor']:.2f} | {count if count is not None else '-'} | {share:.0f}% | {traffic} |")
        # every backend ran as many steps from the same start: the parameters agree
        for backend in ("inductor", "fxwrap"):
            error = max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(params[backend], params["eager"]))
            say(f"    {case} {backend}: max |param - eager's| after every step {error:.2e}")
        if cuda:
            sizes = fxwrap_kernel_bytes(programs)
            configs = {n.target.name: dict(n.target.launch.config) for p, _ in programs[-1:]
                       for n in p.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)}
            for backend in ("inductor", "fxwrap"):
                for name, us in kernel_lists[backend]:
                    moved = sizes.get(name) if backend == "fxwrap" else None
                    bw = f"{moved / us / copy_bw * 100:.0f}% of copy" if moved else "-"
                    config = f", config {configs[name]}" if backend == "fxwrap" and name in configs else ""
                    say(f"    {case} {backend} kernel {name[:60]}: {us:.1f} us, {bw}{config}")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


def _generated_kernels() -> int:
    """Inductor's count of kernels it generated so far (its kernels a step, on the CPU)."""
    from torch._inductor import metrics
    return metrics.generated_kernel_count


if __name__ == "__main__":
    sys.exit(main())
