"""Debug modes and profiling on a GPU (run on the device): check_nan names a planted
kernel, fxwrap.profile's CUDA-event times add up to the call, torch.profiler names the
Triton kernels.  Needs CUDA."""
import importlib.metadata
import json
import os
import sys

import pytest
import torch
from torch import nn

import fxwrap
from fxwrap.plugins.manager import PluginManager, installed_entry_points, use_plugin_manager
from fxwrap.runtime.debug import NonFiniteValueError
from fxwrap.runtime.kernel import Kernel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "null")


def test_check_nan_names_the_planted_kernel_on_cuda(monkeypatch):
    monkeypatch.syspath_prepend(FIXTURES)
    planted = importlib.metadata.EntryPoint("nan_log1p", "fxwrap_plugin_fixtures.nan_log1p", group="fxwrap")
    x, w = torch.randn(64, 32, device="cuda"), torch.randn(32, 16, device="cuda")
    with use_plugin_manager(PluginManager([*installed_entry_points(), planted])):
        torch._dynamo.reset()
        with pytest.raises(NonFiniteValueError) as info:
            fxwrap.lower(lambda a, b: torch.log1p(a.abs()) @ b, x, w, target="cuda", options={"check_nan": True})
    assert "log1p" in str(info.value) and info.value.launch.startswith("kernel fxwrap_")
    assert (info.value.nan, info.value.buffer) == (64 * 32, "buf0")
    torch._dynamo.reset()
    clean = fxwrap.lower(lambda a, b: torch.log1p(a.abs()) @ b, x, w, target="cuda", options={"check_nan": True})
    torch.testing.assert_close(clean.run(x, w), torch.log1p(x.abs()) @ w)
    with pytest.raises(ValueError, match="mode='cudagraphs'"):
        fxwrap.compile(lambda a: a + 1, options={"mode": "cudagraphs", "check_nan": True})


def test_profile_cuda_event_times_add_up_to_the_call(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.LayerNorm(1024))
    model = model.cuda().eval()
    x = torch.randn(8192, 1024, device="cuda")
    torch._dynamo.reset()
    program = fxwrap.lower(model, x, target="cuda")
    report = fxwrap.profile(program, x, warmup=3, iters=10)
    print(report)
    assert report.device == "cuda"
    assert abs(report.launch_s / report.call_s - 1) < 0.10, str(report)
    kernels = {n.target.name for n in program.graph_module.graph.nodes if isinstance(n.target, Kernel)}
    assert kernels <= {t.name for t in report.launches}
    assert all(t.calls == 10 and t.total_s > 0 and t.gb_per_s > 0 for t in report.launches)
    events = json.loads(report.to_chrome_trace(tmp_path / "trace.json").read_text())["traceEvents"]
    assert len(events) == 10 * len(report.launches)


def test_torch_profiler_shows_triton_kernel_names():
    def f(a, b):
        return torch.relu(a @ b).sin() * 2 + a.sum(1, keepdim=True)

    x, w = torch.randn(256, 256, device="cuda"), torch.randn(256, 256, device="cuda")
    torch._dynamo.reset()
    program = fxwrap.lower(f, x, w, target="cuda")
    kernels = {n.target.name for n in program.graph_module.graph.nodes if isinstance(n.target, Kernel)}
    assert kernels
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        out = program.run(x, w)
        torch.cuda.synchronize()
    torch.testing.assert_close(out, f(x, w), rtol=1e-4, atol=1e-4)
    names = {e.key for e in prof.key_averages()}
    assert kernels <= names, (kernels, sorted(names))
    print(sorted(n for n in names if "fxwrap" in n), file=sys.stderr)
