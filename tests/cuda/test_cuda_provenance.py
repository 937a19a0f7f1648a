"""Provenance, the autotune/cache loggers and the debug dump on the Triton target: ``cuda`` on
a GPU (autotuning timed for real), ``triton-interpret`` without one."""
from __future__ import annotations

import logging
import os

import torch

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel

HERE = os.path.basename(__file__)
CUDA = torch.cuda.is_available()
TARGET = "cuda" if CUDA else "triton-interpret"
DEVICE = "cuda" if CUDA else "cpu"

gelu_mm = lambda x, w: torch.nn.functional.gelu(torch.exp(x) @ w) * 2  # noqa: E731
LINE = gelu_mm.__code__.co_firstlineno


def test_triton_kernels_name_their_nodes_and_line(caplog):
    caplog.set_level(logging.DEBUG, logger="fxwrap")
    x, w = torch.randn(64, 32, device=DEVICE), torch.randn(32, 48, device=DEVICE)
    program = fxwrap.lower(gelu_mm, x, w, target=TARGET)
    torch.testing.assert_close(program.run(x, w), gelu_mm(x, w), rtol=1e-4, atol=1e-4)
    kernels = [line for line in program.lines if isinstance(line, CallKernel)]
    externs = [line for line in program.lines if isinstance(line, CallExtern) and line.origins]
    assert [o.node for o in kernels[0].origins] == ["exp"]
    gelu = kernels[-1]
    assert [o.node for o in gelu.origins] == ["gelu", "mul"] and gelu.origins[-1].target == "aten.mul.Tensor"
    assert {o.location for line in kernels + externs for o in line.origins} == {f"{HERE}:{LINE}"}
    header = gelu.kernel.source.split("import triton")[0]
    assert "# from: " in header and f"{HERE}:{LINE} in <lambda>" in header
    for node in program.graph_module.graph.nodes:
        if isinstance(node.target, fxwrap.Kernel):
            assert node.meta["fxwrap_origins"], node.format_node()
    autotune = [r.getMessage() for r in caplog.records if r.name == "fxwrap.autotune"]
    assert autotune  # a GPU: the configs timed; the interpreter: why nothing was timed
    if CUDA:
        assert any("chose" in text or "not tuned: one config" in text for text in autotune), autotune


def test_same_triton_kernel_from_two_lines_shares_its_launcher(caplog):
    caplog.set_level(logging.DEBUG, logger="fxwrap.cache")
    one = lambda t: torch.sigmoid(t) * 3  # noqa: E731
    two = lambda t: torch.sigmoid(t) * 3  # noqa: E731
    x = torch.randn(1000, device=DEVICE)
    a, b = fxwrap.lower(one, x, target=TARGET), fxwrap.lower(two, x, target=TARGET)
    (ka,), (kb,) = ([line.kernel for line in p.lines if isinstance(line, CallKernel)] for p in (a, b))
    assert ka.source != kb.source
    from fxwrap.targets.cuda_triton.emitter import body_digest
    assert body_digest(ka.source, ka.launch) == body_digest(kb.source, kb.launch)
    texts = [r.getMessage() for r in caplog.records if r.name == "fxwrap.cache"]
    assert any("in-process launcher hit" in t for t in texts), texts
    torch.testing.assert_close(b.run(x), one(x))
