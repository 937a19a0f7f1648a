"""One process of tests/cpu/test_warm_start.py: compile a small model with fxwrap, run it
(inference, or a forward and backward), compare with eager, and print JSON: the largest
error, which programs were lowered (``compile_aten_graph`` calls), how many graphs went
through AOTAutograd, and the warm-start cache's counters.

    python warm_start_child.py MODE SHAPES DTYPE [--save BUNDLE] [--load BUNDLE]
    MODE: inference | training;  SHAPES: static | dynamic;  DTYPE: float32 | float64
    --batch-norm: the model has a BatchNorm1d in training mode, whose running statistics (module
    buffers: graph inputs) the compiled graph mutates in place; the error covers them too
"""
import argparse
import json

import torch
from torch._dynamo.utils import counters

import fxwrap
import fxwrap.api as api
from fxwrap.programs import graph_cache

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=("inference", "training"))
parser.add_argument("shapes", choices=("static", "dynamic"))
parser.add_argument("dtype", choices=("float32", "float64"))
parser.add_argument("--save")
parser.add_argument("--load")
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--device", default="cpu")
parser.add_argument("--batch-norm", action="store_true")
parser.add_argument("--then-batch", type=int, help="run again with this many rows (the error covers both runs)")
args = parser.parse_args()

if args.load:
    loaded = fxwrap.load_cache_artifacts(args.load)
lowered = []
compile_aten_graph = api.compile_aten_graph


def counting(gm, target, kind="inference", *rest, **kwargs):
    lowered.append(kind)
    return compile_aten_graph(gm, target, kind, *rest, **kwargs)


api.compile_aten_graph = counting
dtype = getattr(torch, args.dtype)
torch.manual_seed(0)  # the same weights in every process; fresh inputs below
layers = [torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8), torch.nn.Softmax(-1)]
if args.batch_norm:
    layers.insert(1, torch.nn.BatchNorm1d(32))
model = torch.nn.Sequential(*layers).to(dtype=dtype, device=args.device)
model.train()  # batch norm: batch statistics, running statistics updated
torch.manual_seed(torch.seed())
x = torch.randn(args.batch, 16, dtype=dtype, device=args.device)
dynamic = args.shapes == "dynamic"
# dynamic training: the matmul templates' timing crashes under symbolic sizes on main (not this cache)
options = {"templates": "off"} if dynamic else None
compiled = torch.compile(model, backend="fxwrap", dynamic=dynamic, options=options)


def buffers() -> list[torch.Tensor]:
    return [b.clone() for b in model.buffers()]


def error(x) -> float:
    before = buffers()
    if args.mode == "inference":
        with torch.no_grad():
            out = compiled(x)
            after = buffers()
            for b, old in zip(model.buffers(), before):
                b.copy_(old)
            ref = model(x)
        return max([(out - ref).abs().max().item()] +
                   [(a - b).abs().max().item() for a, b in zip(after, buffers())])
    model.zero_grad()
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = compiled(xc)
    (out * torch.arange(8, dtype=dtype, device=args.device)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [xc.grad] + buffers()
    with torch.no_grad():
        for b, old in zip(model.buffers(), before):
            b.copy_(old)
    model.zero_grad()
    ref = model(xe)
    (ref * torch.arange(8, dtype=dtype, device=args.device)).sum().backward()
    grads_ref = [p.grad for p in model.parameters()] + [xe.grad] + buffers()
    return max([(out - ref).abs().max().item()] + [(a - b).abs().max().item() for a, b in zip(grads, grads_ref)])


err = error(x)
if args.then_batch:
    err = max(err, error(torch.randn(args.then_batch, 16, dtype=dtype, device=args.device)))
saved = fxwrap.save_cache_artifacts(args.save) if args.save else None
print(json.dumps({"err": err, "lowered": lowered, "aot": counters["aot_autograd"]["total"],
                  "stats": dict(graph_cache.stats), "saved": saved}))
