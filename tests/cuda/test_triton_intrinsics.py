"""A target-defined op (``fxwrap/ir/intrinsics.py``) on the Triton emitter: the Triton target
(``cuda``, or ``triton-interpret`` without a GPU) with gelu declared as its own op, spelled
through ``erfc`` (``gelu(x) = 0.5 x erfc(-x / sqrt 2)``) where fxwrap's decomposition uses
``erf``: the kernel holds the spelling, the numbers are eager's."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.targets.cuda_triton.emitter import TritonEmitter
from triton_helpers import DEVICE, TARGET


class ErfcGeluEmitter(TritonEmitter):
    intrinsics = (fxwrap.Intrinsic("erfc_gelu", "(0.5 * {0} * libdevice.erfc({0} * -0.7071067811865476))",
                                   replaces=torch.ops.aten.gelu.default, when={"approximate": "none"}),)


def test_the_triton_emitter_renders_an_intrinsic_through_its_spelling():
    target = dataclasses.replace(TARGET, name=f"{TARGET.name}-erfc-gelu", emitter=ErfcGeluEmitter)
    x, y = torch.randn(33, 70, device=DEVICE), torch.randn(33, 70, device=DEVICE)
    program = fxwrap.lower(lambda a, b: F.gelu(a.sin()) * b, x, y, target=target)
    (kernel,) = [line.kernel for line in program.lines if type(line).__name__ == "DefineKernel"]
    assert "libdevice.erfc(" in kernel.source and "erf(" not in kernel.source.replace("erfc(", "")
    torch.testing.assert_close(program.run(x, y), F.gelu(x.sin()) * y)


def test_the_intrinsic_in_a_gemm_templates_epilogue():
    """gelu(x @ w + b) * 2 as one GEMM template kernel whose epilogue calls the intrinsic
    (the target keeps the Triton target's name: its templates are offered by name)."""
    target = dataclasses.replace(TARGET, emitter=ErfcGeluEmitter)
    x, w, b = (torch.randn(16, 32, device=DEVICE), torch.randn(32, 48, device=DEVICE),
               torch.randn(48, device=DEVICE))

    def linear_gelu(x, w, b):
        return F.gelu(x @ w + b) * 2

    program = fxwrap.lower(linear_gelu, x, w, b, target=target, options={"templates": "always"})
    (kernel,) = [line.kernel for line in program.lines if type(line).__name__ == "DefineKernel"]
    assert "tl.dot(" in kernel.source and "libdevice.erfc(" in kernel.source
    torch.testing.assert_close(program.run(x, w, b), linear_gelu(x, w, b), rtol=1e-3, atol=1e-3)
