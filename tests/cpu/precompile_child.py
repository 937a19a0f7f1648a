"""One process of tests/cpu/test_precompile.py: precompile a small model with
``fxwrap.aot_compile`` and save it, or load a saved one with ``fxwrap.load_compiled``; run it
(inference, or a forward and backward), compare with eager, and print JSON: the largest error,
which programs were lowered (``compile_aten_graph`` calls), how many frames dynamo traced, how
many graphs went through AOTAutograd, the warm-start cache's counters and the precompiled
graphs loaded.

    python precompile_child.py save|load PATH MODE [--batch-norm] [--batch N] [--device cuda]
    MODE: inference | training
"""
import argparse
import copy
import json

import torch
from torch._dynamo.utils import counters

import fxwrap
import fxwrap.api as api
from fxwrap.programs import graph_cache, precompile

parser = argparse.ArgumentParser()
parser.add_argument("action", choices=("save", "load"))
parser.add_argument("path")
parser.add_argument("mode", choices=("inference", "training"))
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--batch-norm", action="store_true")
parser.add_argument("--device", default="cpu")
args = parser.parse_args()

lowered = []
compile_aten_graph = api.compile_aten_graph


def counting(gm, target, kind="inference", *rest, **kwargs):
    lowered.append(kind)
    return compile_aten_graph(gm, target, kind, *rest, **kwargs)


api.compile_aten_graph = counting
torch.manual_seed(0)  # the same weights in every process; fresh inputs below
layers = [torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8), torch.nn.Softmax(-1)]
if args.batch_norm:
    layers.insert(1, torch.nn.BatchNorm1d(32))
model = torch.nn.Sequential(*layers).to(args.device)
reference = copy.deepcopy(model)
torch.manual_seed(torch.seed())
x = torch.randn(args.batch, 16, device=args.device)
example = torch.randn(8, 16, device=args.device)
weights = torch.arange(8, dtype=torch.float32, device=args.device)

if args.action == "save":
    if args.mode == "inference":
        with torch.no_grad():
            compiled = fxwrap.aot_compile(model, (example,))
    else:
        compiled = fxwrap.aot_compile(model, (example.requires_grad_(),))
    compiled.save(args.path)
else:
    compiled = fxwrap.load_compiled(args.path, model)

if args.mode == "inference":
    with torch.no_grad():
        outs = [compiled(x)] + [b.clone() for b in model.buffers()]
        refs = [reference(x)] + list(reference.buffers())
else:
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = compiled(xc), reference(xe)
    (out * weights).sum().backward()
    (ref * weights).sum().backward()
    outs = [out, xc.grad] + [p.grad for p in model.parameters()] + list(model.buffers())
    refs = [ref, xe.grad] + [p.grad for p in reference.parameters()] + list(reference.buffers())
err = max((a - b).abs().max().item() for a, b in zip(outs, refs))
print(json.dumps({"err": err, "lowered": lowered, "frames": counters["frames"]["total"],
                  "captured": counters["stats"]["calls_captured"], "aot": counters["aot_autograd"]["total"],
                  "stats": dict(graph_cache.stats), "loaded": precompile.stats["graphs"]}))
