"""Run in fresh interpreters by test_program_cache.py: compile a small model through
``torch.compile`` (inference, or training with a backward) and check eager's numbers.

    python compile_twice.py CASE [DEVICE]    # CASE: inference | training | dynamic; DEVICE: cpu (default), cuda

Prints one JSON line: {"kernel_builds": n, "programs": [kinds]} -- kernel_builds counts
``Renderer.render`` calls (0 when every program came from the program cache).
"""
import json
import sys

import torch

import fxwrap  # noqa: F401  (registers nothing; the backend is found by name)
from fxwrap.wrapper_ir import render

builds = []
original = render.Renderer.render


def counting(self):
    builds.append(1)
    return original(self)


render.Renderer.render = counting
case = sys.argv[1]
device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
g = torch.Generator().manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=g))
model.to(device)
x = torch.randn(4, 16, generator=g).to(device)
programs = []
compiled = torch.compile(model, backend="fxwrap", dynamic=case == "dynamic",
                         options={"on_program": lambda p: programs.append(p.kind)})
if case == "training":
    out = compiled(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(x)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(grads, [p.grad for p in model.parameters()])
else:
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        if case == "dynamic":
            x2 = torch.randn(7, 16, generator=g).to(device)
            torch.testing.assert_close(compiled(x2), model(x2))
print(json.dumps({"kernel_builds": len(builds), "programs": programs}))
