"""The CPU GEMM templates (``cpp_gemm``; ``cpp_gemv`` for few rows) with the activation epilogues of the model suite's
linear layers -- GELU (erf and tanh), SiLU, each with bias and a residual add -- in
float32 and bfloat16, at sizes that leave remainders everywhere (rows past the register
tile, columns past the packed panel, an odd depth for the bfloat16 pair layout, a depth
past one packed slice; for the row-dot kernel a depth past its 16 lanes and columns past its
8-row blocks): one kernel (the activation inside the template), eager's numbers.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel, DefineKernel
from fxwrap.targets.cpu_cpp.gemv import CppGemv

ACTIVATIONS = {
    # name -> (activation, the prelude function the epilogue must call)
    "gelu": (F.gelu, "fx_erf("),
    # tanh GELU lowers as y * sigmoid(2z) (core/rules/pointwise.py): one exp, no tanh
    "gelu_tanh": (lambda y: F.gelu(y, approximate="tanh"), "fx_sigmoid("),
    "silu": (F.silu, "fx_sigmoid("),
}
# (rows, depth, columns): one element; remainders past MR = 8 rows, NR = 32 columns and an
# odd depth; a depth past KC = 512 (two packed slices, the second accumulating); at most
# CppGemv.MAX_ROWS rows (cpp_gemv under "always"): a k tail past 16 lanes, an n tail past 8
SHAPES = [(1, 3, 1), (37, 65, 81), (70, 130, 47), (9, 601, 40), (1, 301, 45), (3, 40, 17)]


def compile_template(fn):
    torch._dynamo.reset()
    programs: list = []
    backend = fxwrap.Backend("cpu", {"templates": "always", "on_program": programs.append})
    return torch.compile(fn, backend=backend, fullgraph=True), programs


def kernel_sources(programs):
    return [ln.kernel.source for p in programs for ln in p.lines if isinstance(ln, DefineKernel)]


def assert_matches_eager(got, want, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        return
    # bfloat16: the product is summed in float32 in another order than oneDNN's, then rounded
    # once, like eager; an element may land one bfloat16 step away, and only a few do.  Below
    # 1e-3 (GELU's negative tail, x * (1 + erf) cancelling) eager and fxwrap are both off by
    # more than a step from the exact value, differently: those are compared by atol only.
    got, want = got.float(), want.float()
    torch.testing.assert_close(got, want, atol=1e-2, rtol=2 ** -7)
    off = (got != want)[want.abs() >= 1e-3].float().mean().item()
    assert off <= 0.02, f"{off:.1%} of the elements differ from eager"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_activation_epilogue_in_the_template_matches_eager(act, dtype, shape):
    activation, helper = ACTIVATIONS[act]
    m, k, n = shape

    def fn(x, w, b, r):
        return activation(F.linear(x, w, b)) + r

    c, programs = compile_template(fn)
    gen = torch.Generator().manual_seed(m * 1000 + n)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    r = torch.randn(m, n, generator=gen).to(dtype)
    assert_matches_eager(c(x, w, b, r), fn(x, w, b, r), dtype)
    # structure: one launch, the template, with the activation in its epilogue; no extern
    launches = [ln for p in programs for ln in p.lines if isinstance(ln, CallKernel)]
    assert len(launches) == 1 and "_template_" in launches[0].kernel.name
    assert not [ln for p in programs for ln in p.lines if isinstance(ln, CallExtern) and "mm" in str(ln.op)]
    (source,) = kernel_sources(programs)
    epilogue = source[source.index("extern \"C\""):]
    assert helper in epilogue and ("fx_rowdot(" if m <= CppGemv.MAX_ROWS else "fx_gemm_tile") in epilogue


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_bfloat16_epilogue_rounds_once_at_the_store(act):
    """A bfloat16 activation stores its float result converted once (the graph's cast to
    bfloat16 is the store's conversion), and still rounds the product where the graph does."""
    activation, _ = ACTIVATIONS[act]

    def fn(x, w, b):
        return activation(F.linear(x, w, b))

    c, programs = compile_template(fn)
    x, w, b = torch.randn(24, 40, dtype=torch.bfloat16), torch.randn(48, 40, dtype=torch.bfloat16), torch.randn(48)
    b = b.to(torch.bfloat16)
    assert_matches_eager(c(x, w, b), fn(x, w, b), torch.bfloat16)
    (source,) = kernel_sources(programs)
    epilogue = source[source.rindex("#pragma omp simd"):]
    assert epilogue.count("fx_bf16_round(") == 1  # the product's rounding (linear's bf16 output)
    assert "fx_float_to_bf16(fx_bf16_round(" not in epilogue
    assert "out_ptr0[" in epilogue and "= fx_float_to_bf16(tmp" in epilogue


def test_bfloat16_rounding_stored_as_float32_is_kept():
    """A cast to bfloat16 whose value is stored as float32 is a rounding the store does not
    do: it stays (the store converts only to its own dtype)."""
    def fn(x, w, b):
        return F.gelu(F.linear(x, w, b).to(torch.bfloat16).float()) * 3

    c, programs = compile_template(fn)
    x, w, b = torch.randn(19, 33), torch.randn(45, 33), torch.randn(45)
    got, want = c(x, w, b), fn(x, w, b)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-2, rtol=2 ** -7)
    # float64 GELU of the product rounded to bfloat16 (the graph) and not rounded (the bug)
    product = F.linear(x.double(), w.double(), b.double())
    rounded, unrounded = (F.gelu(product.to(torch.bfloat16).double()) * 3, F.gelu(product) * 3)
    near = lambda ref: ((got.double() - ref).abs() <= 1e-5 * ref.abs() + 1e-6).float().mean().item()  # noqa: E731
    assert near(rounded) >= 0.98 and near(unrounded) <= 0.5
    (source,) = kernel_sources(programs)
    assert "fx_bf16_round(" in source[source.index("extern \"C\""):]


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_dynamic_rows_bfloat16(act):
    """One program for every row count (a size symbol in the template's loops)."""
    activation, helper = ACTIVATIONS[act]

    def fn(x, w, b):
        return activation(F.linear(x, w, b))

    torch._dynamo.reset()
    programs: list = []
    backend = fxwrap.Backend("cpu", {"templates": "always", "on_program": programs.append})
    c = torch.compile(fn, backend=backend, dynamic=True)
    w, b = torch.randn(70, 48, dtype=torch.bfloat16) / 7, torch.randn(70, dtype=torch.bfloat16)
    for rows in (3, 29, 64):
        x = torch.randn(rows, 48, dtype=torch.bfloat16)
        assert_matches_eager(c(x, w, b), fn(x, w, b), torch.bfloat16)
    sources = kernel_sources(programs)
    assert len(programs) == 1 and len(sources) == 1 and helper in sources[0]
