"""What the Metal target cannot render runs as ATen extern calls, with a log line."""
from __future__ import annotations

import json
import logging

import pytest
import torch

import fxwrap
from fxwrap.targets.base import Target, WrapperCodegen
from fxwrap.targets.host.device import CpuDevice
from fxwrap.targets.mps_metal.emitter import MetalEmitter
from metal_helpers import OPTIONS, kernels
from shared_helpers import in_two_processes


def run(fn, args, target=None):
    programs = []
    options = dict(OPTIONS, on_program=programs.append)
    if target is not None:
        options.pop("execute")
        options["target"] = target
    f = fxwrap.compile(fn, options=options)
    got, want = f(*args), fn(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    return programs


@pytest.mark.parametrize("dynamic", [False, True])
def test_float64_falls_back_to_aten(caplog, dynamic):
    x = torch.randn(17, 33, dtype=torch.float64)
    y = torch.randn(17, 33)
    fn = lambda x, y: (x.sin() * 2 + 1, x.sum(1), torch.softmax(y, -1) * 3)  # noqa: E731
    with caplog.at_level(logging.INFO, logger="fxwrap"):
        programs = run(fn, (x, y))
    ks = kernels(programs)
    assert ks and all("double" not in k.source for k in ks)  # the float32 part is a kernel
    origins = " ".join(k.source.splitlines()[1] for k in ks)  # "// from: <ATen node names>"
    assert "amax" in origins and "sin" not in origins and "sum_1" not in origins
    assert "stays an ATen extern call on target mps_shim" in caplog.text and "torch.float64" in caplog.text
    externs = [n for p in programs for n in p.graph_module.graph.nodes
               if n.op == "call_function" and "sin" in str(n.target)]
    assert externs, "sin of a float64 tensor must be an ATen call"


def test_unrenderable_kernel_is_rebuilt_as_externs(caplog):
    """An EmitError from the emitter (here: a threadgroup size that is not a multiple of
    the SIMD width, which only reductions use) turns that kernel's nodes into externs."""
    bad = Target("mps_shim_tg48", "cpu", CpuDevice(), MetalEmitter, WrapperCodegen,
                 options={"execute": "shim", "threadgroup_size": 48})
    x = torch.randn(8, 40)
    fn = lambda x: (x.sum(1), x.exp() + 1)  # noqa: E731
    programs = []
    with caplog.at_level(logging.INFO, logger="fxwrap"):
        f = torch.compile(fn, backend=fxwrap.Backend(bad, {"on_program": programs.append}))
        for g, w in zip(f(x), fn(x)):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    ks = kernels(programs)
    assert [k.launch.kind for k in ks] == ["pointwise"]
    assert "cannot render the kernel" in caplog.text and "multiple of the SIMD width" in caplog.text


def test_mps_target_without_a_device_says_what_to_do():
    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS: the real launcher runs")
    from fxwrap.runtime.launch import MetalLaunch
    from fxwrap.targets.mps_metal.launcher import mps_launcher
    with pytest.raises(RuntimeError, match="execute': 'shim'"):
        mps_launcher("kernel void k() {}", MetalLaunch(symbol="k", pointers=0, size_symbols=(), grid="1",
                                                       threadgroup_size=1, kind="pointwise"))


def test_sources_are_metal_and_deterministic():
    # the last output covers other rows than the reductions: a pointwise kernel of its own
    # deterministic: two processes that share nothing (hash seeds, caches) render the same Metal
    code = ("import json, torch, fxwrap\n"
            "fn = lambda x: (torch.softmax(x, -1), x.var(0), x[1:].to(torch.bfloat16) * 2)\n"
            "p = fxwrap.lower(fn, torch.randn(6, 70), options={'target': 'mps', 'execute': 'shim'})\n"
            "print(json.dumps([n.target.source for n in p.graph_module.graph.nodes "
            "if isinstance(n.target, fxwrap.Kernel)]))\n")
    first, second = in_two_processes(code)
    sources = json.loads(first)
    assert sources and first == second
    text = "\n".join(sources)
    for piece in ("kernel void", "device const float*", "[[thread_position_in_grid]]",
                  "[[threadgroup_position_in_grid]]", "threadgroup float", "bfloat(", "metal::exp"):
        assert piece in text, piece
