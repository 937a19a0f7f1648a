"""Run in fresh interpreters by test_program_cache.py: compile one small function through
``torch.compile`` under a few variations and print the cache keys each took.

    python cache_keys_child.py

Prints one JSON line: {case: {"program": [program keys], "graph": [warm-start graph keys]}}
for the cases "base", "base again" (the same program, a fresh dynamo: a warm-start hit, so no
program key), "float64", "shape",
"option" (reuse=False).  The reference target compiles nothing, so the child is quick.
"""
import json

import torch

from fxwrap.programs import assembly, graph_cache

keys: dict = {}
case = None


def recording(module, name, kind):
    original = getattr(module, name)

    def record(*args, **kwargs):
        key = original(*args, **kwargs)
        keys.setdefault(case, {"program": [], "graph": []})[kind].append(key)
        return key
    setattr(module, name, record)


recording(assembly, "program_key", "program")
recording(graph_cache, "graph_key", "graph")


def f(t):
    return torch.tanh(t) * 2 + 1


g = torch.Generator().manual_seed(0)
x = torch.randn(8, 16, generator=g)
cases = {"base": (x, {}), "base again": (x, {}), "float64": (x.double(), {}),
         "shape": (torch.randn(4, 16, generator=g), {}), "option": (x, {"reuse": False})}
with torch.no_grad():
    for case, (value, options) in cases.items():
        torch._dynamo.reset()
        compiled = torch.compile(f, backend="fxwrap", dynamic=False,
                                 options={"target": "reference", **options})
        torch.testing.assert_close(compiled(value), f(value))
print(json.dumps(keys))
