"""The CPU few-row GEMM template (``cpp_gemv``, targets/cpu_cpp/gemv.py): a decode step's
``linear(x [1, K], w [N, K])`` reads the weight once along its rows (``fx_rowdot``), where
``cpp_gemm`` packs (transposes) a panel of it on every call.

Numbers against eager on random inputs (float32, bfloat16; bias, activation and residual
epilogues; sizes off the 16 k lanes and the 8-row weight blocks; a dynamic batch run with more
rows than its hint), and structure: which template ``"always"`` picks, what the kernel calls,
and which products it refuses (more rows than ``MAX_ROWS``, ``x @ w`` with ``w`` not read along
its rows, strided activations).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel, DefineKernel, TemplateChoice
from fxwrap.targets.cpu_cpp.gemv import CppGemv
from fxwrap.targets.cpu_cpp.int8_gemm import REQUIRED_CPU_FLAGS, cpu_flags

pytestmark = pytest.mark.skipif(not set(REQUIRED_CPU_FLAGS) <= cpu_flags(),
                                reason=f"cpp_gemv needs a CPU with {', '.join(REQUIRED_CPU_FLAGS)}")

PRODUCTS = ("mm", "addmm", "bmm")


def compiled(fn, templates="always", dynamic=False):
    torch._dynamo.reset()
    programs: list = []
    backend = fxwrap.Backend("cpu", {"templates": templates, "on_program": programs.append})
    return torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True), programs


def chosen(programs):
    return [ln.chosen for p in programs for ln in p.lines if isinstance(ln, TemplateChoice)]


def template_sources(programs):
    return [ln.kernel.source for p in programs for ln in p.lines
            if isinstance(ln, DefineKernel) and "_template_" in ln.kernel.name]


def product_externs(programs):
    return [ln for p in programs for ln in p.lines
            if isinstance(ln, CallExtern) and str(ln.op).split(".")[1] in PRODUCTS]


def tolerance(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2 ** -7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,k,n", [(1, 256, 704), (1, 301, 45), (2, 17, 9), (4, 64, 33), (1, 1, 1), (3, 15, 8)])
def test_linear_epilogue_matches_eager(dtype, m, k, n):
    """``silu(linear(x, w, b)) + r``: one template kernel, the row-dot product, no packing,
    eager's numbers."""
    def fn(x, w, b, r):
        return F.silu(F.linear(x, w, b)) + r

    c, programs = compiled(fn)
    gen = torch.Generator().manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    b, r = torch.randn(n, generator=gen).to(dtype), torch.randn(m, n, generator=gen).to(dtype)
    torch.testing.assert_close(c(x, w, b, r).float(), fn(x, w, b, r).float(), **tolerance(dtype))
    assert chosen(programs) == ["cpp_gemv"]
    (source,) = template_sources(programs)
    body = source[source.index('extern "C"'):]
    assert "fx_rowdot(" in body and "fx_gemm_pack" not in body and "fx_sigmoid(" in body
    assert not product_externs(programs)
    assert sum(isinstance(ln, CallKernel) for p in programs for ln in p.lines) == 1


def test_decode_projection_is_the_row_dot_kernel():
    """A decode step's projections (batch 1, one token, ``nn.Linear`` without bias, a 3-D
    activation viewed as one row): every product runs as ``cpp_gemv``."""
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(96, 160, bias=False), torch.nn.Linear(160, 96, bias=False)])

    def fn(x):
        h = F.silu(layers[0](x))
        return layers[1](h) + x

    c, programs = compiled(fn)
    x = torch.randn(1, 1, 96)
    with torch.no_grad():
        torch.testing.assert_close(c(x), fn(x), atol=1e-5, rtol=1e-5)
    assert chosen(programs) == ["cpp_gemv", "cpp_gemv"]
    assert all("fx_rowdot(" in s for s in template_sources(programs))


def test_dynamic_rows_beyond_the_hint():
    """Compiled with ``dynamic=True`` for 2 rows, run on 2, 3 and 9 rows: the kernel takes the row
    count as a size argument and computes every row (the hint only chose the template)."""
    torch.manual_seed(1)
    w, b = torch.randn(37, 50), torch.randn(37)

    def fn(x):
        return torch.relu(F.linear(x, w, b))

    c, programs = compiled(fn, dynamic=True)
    for m in (2, 3, 9):
        x = torch.randn(m, 50)
        torch.testing.assert_close(c(x), fn(x), atol=1e-5, rtol=1e-5)
    assert set(chosen(programs)) == {"cpp_gemv"}


@pytest.mark.parametrize("case", ["rows", "kn_weight", "strided_x"])
def test_refusals_leave_it_to_cpp_gemm(case):
    """More rows than ``MAX_ROWS``, a ``b`` not read along ``k`` (``x @ w`` with ``w`` ``[K, N]``)
    and activations strided in ``k``: ``cpp_gemv`` refuses, ``cpp_gemm`` computes them."""
    torch.manual_seed(2)
    m = CppGemv.MAX_ROWS + 1 if case == "rows" else 1
    x = torch.randn(m, 40) if case != "strided_x" else torch.randn(m, 80)[:, ::2]
    w = torch.randn(40, 24) if case == "kn_weight" else torch.randn(24, 40).t()

    def fn(x, w):
        return x @ w

    c, programs = compiled(fn)
    torch.testing.assert_close(c(x, w), fn(x, w), atol=1e-5, rtol=1e-5)
    assert chosen(programs) == ["cpp_gemm"]
