"""Training memory, fxwrap vs Inductor: the peak of one training step (after two warm-up
steps) and what each forward saves for the backward, grouped by producing op, shape and
dtype (bf16 model on CUDA, the suite's large size).

    python benchmarks/training_memory.py llama          # bf16 weights
    python benchmarks/training_memory.py llama --amp    # float32 weights under bf16 autocast

Besides the peak: the memory held after the forward (what it saved) and the backward's own
rise above that.
"""
import collections
import functools
import sys

import torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
import suite_models  # noqa: E402

import fxwrap  # noqa: E402,F401  (registers the backend)
import torch._inductor.config as ic  # noqa: E402
from torch._inductor.compile_fx import compile_fx, compile_fx_inner  # noqa: E402
ic.fx_graph_cache = False
name = sys.argv[1]
amp = "--amp" in sys.argv[2:]
dev = "cuda"
def saved(gm, label):
    outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    tot = 0; c = collections.Counter()
    for o in outs:
        v = o.meta.get("val") if hasattr(o, "meta") else None
        if isinstance(v, torch.Tensor) and o.op != "placeholder":
            b = v.numel() * v.element_size(); tot += b
            c[(str(getattr(o, "target", "")).split(".")[-2] if "." in str(getattr(o, "target", "")) else str(getattr(o, "target", "")), tuple(v.shape), str(v.dtype))] += 1
    print(f"== {label}: saved (non-input, views counted) {tot/2**20:.0f} MiB in {sum(c.values())} tensors")
    for k, n in sorted(c.items(), key=lambda kv: -kv[1] * torch.Size(kv[0][1]).numel())[:25]:
        print(f"   {n:3d} x {k}")
for backend in ("inductor", "fxwrap"):
    torch.manual_seed(0); torch._dynamo.reset()
    entry = [m for m in suite_models.MODELS if m.name == name][0]
    model, make_inputs, loss_fn = entry.build(dev, "large")
    model = model.to(dev) if amp else model.to(dev).to(torch.bfloat16)
    inp = make_inputs(0)
    graphs = []
    if backend == "inductor":
        def inner(gm, example_inputs, **kw):
            graphs.append(gm); return compile_fx_inner(gm, example_inputs, **kw)
        m = torch.compile(model, backend=functools.partial(compile_fx, inner_compile=inner))
    else:
        m = torch.compile(model, backend="fxwrap", options={"cache": False, "on_program": lambda p: graphs.append(p.graph_module)})
    def forward():
        with torch.autocast(dev, torch.bfloat16, enabled=amp):
            return loss_fn(m(*inp))
    for _ in range(2):
        forward().backward(); model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    loss = forward(); torch.cuda.synchronize()
    held, forward_peak = torch.cuda.memory_allocated() - base, torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    loss.backward(); torch.cuda.synchronize()
    peak = max(forward_peak, torch.cuda.max_memory_allocated() - base)
    print(f"#### {backend} peak {peak/2**20:.0f} MiB; forward peak {forward_peak/2**20:.0f}, held after the forward "
          f"{held/2**20:.0f}, backward peak {(torch.cuda.max_memory_allocated() - base)/2**20:.0f} MiB")
    saved(graphs[0], backend + " forward")
