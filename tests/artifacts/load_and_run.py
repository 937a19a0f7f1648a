"""Run in a fresh interpreter by the tests of this folder: load a saved program, run it
on saved inputs, compare with eager's saved numbers, and report what got imported.

    python load_and_run.py PROGRAM CASE   # CASE: torch.save'd {"mode", "args", "expected", ...}

Prints one JSON line: {"modules": [every module loaded], "kernels": [loader classes]}.
"""
import json
import sys

import torch

import fxwrap

program_path, case_path = sys.argv[1], sys.argv[2]
case = torch.load(case_path, weights_only=False)
loaded = fxwrap.load(program_path)
if case["mode"] == "run":
    got = loaded.run(*case["args"])
    kernels = loaded.kernels
else:  # "training": forward on the graph inputs, backward on what it saved and the tangents
    forward, backward = loaded.forward, loaded.backward
    flat = forward(*forward.arguments(case["args"]))
    n = case["user_outputs"]
    grads = backward(*flat[n:], *case["tangents"])
    kernels = forward.kernels + backward.kernels
modules = sorted(sys.modules)  # before torch.testing, which imports sympy
if case["mode"] == "run":
    torch.testing.assert_close(got, case["expected"], rtol=1e-4, atol=1e-4)
else:
    torch.testing.assert_close(list(flat[:n]), case["expected"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close([g for g in grads if g is not None], case["grads"], rtol=1e-4, atol=1e-4)
print(json.dumps({"modules": modules,
                  "kernels": [getattr(k.loader, "__name__", type(k.loader).__name__) for k in kernels]}))
