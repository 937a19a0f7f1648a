"""The walk-through of docs/debugging.md: find a planted bad kernel with check_nan, then
where the time goes with fxwrap.profile, in a small transformer block.

    PYTHONPATH=examples/debugging python examples/debugging/walkthrough.py [--quick]

``--quick`` profiles 2 calls instead of 20 (tests/cpu/test_debugging_walkthrough.py runs it so).
"""
import importlib.metadata
import os
import sys
import tempfile

import torch

import fxwrap
from fxwrap.plugins.manager import PluginManager, installed_entry_points, use_plugin_manager
from fxwrap.runtime.debug import NonFiniteValueError
from fxwrap.testing.models import TransformerBlock

torch.manual_seed(0)
model = TransformerBlock(d=256, heads=8).eval()
x = torch.randn(8, 128, 256)

print("== 1. a plugin's erf lowering is wrong: the compiled block returns NaN")
planted = importlib.metadata.EntryPoint("planted_gelu", "planted_gelu", group="fxwrap")
with use_plugin_manager(PluginManager([*installed_entry_points(), planted])):
    program = fxwrap.lower(model, x, target="cpu")
    out = program.run(x)
    print(f"NaN in the output: {int(out.isnan().sum())} of {out.numel()}")

    print("== 2. check_nan: stop at the first launch that writes NaN or Inf")
    try:  # lower() runs the function once, so the check fires here already
        fxwrap.lower(model, x, target="cpu", options={"check_nan": True})
    except NonFiniteValueError as error:
        print(error)
        found = error
    else:
        sys.exit("check_nan found no NaN: the planted lowering did not reach the program")
    name = found.launch.split()[-1]
    (launch,) = [line for line in program.lines
                 if line.writes() and getattr(getattr(line, "kernel", None), "name", None) == name]
    print("\n".join(launch.kernel.source.splitlines()[:5]))

    print("== 3. print_values: what went into that kernel and what came out")
    inputs = [b.name for b in launch.reads() if b not in launch.writes()]
    fxwrap.lower(model, x, target="cpu", options={"print_values": [*inputs, name]})

print("== 4. without the plugin: where does the time go?")
program = fxwrap.lower(model, x, target="cpu")
torch.testing.assert_close(program.run(x), model(x), rtol=1e-4, atol=1e-4)
quick = "--quick" in sys.argv[1:]
report = fxwrap.profile(program, x, warmup=0 if quick else 3, iters=2 if quick else 20)
print(report)
# the trace goes where FXWRAP_TRACE_DIR says (kept), else to a temporary folder removed at the end
keep = os.environ.get("FXWRAP_TRACE_DIR")
with tempfile.TemporaryDirectory(prefix="fxwrap-trace-") as scratch:
    path = report.to_chrome_trace(os.path.join(keep or scratch, "transformer_trace.json"))
    print("wrote", path, f"({os.path.getsize(path)} bytes)" + ("" if keep else "; removed at exit: set "
                                                                 "FXWRAP_TRACE_DIR to keep it"))
