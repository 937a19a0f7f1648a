"""C++ pointwise kernels run their loops in memory order: the innermost loop is the one
whose stores are contiguous, whatever the logical order of the dims (channels-last
tensors, transposed outputs)."""
from __future__ import annotations

import re

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import DefineKernel


def _kernel_sources(program) -> list[str]:
    return [line.kernel.source for line in program.lines if isinstance(line, DefineKernel)]


def _loop_order(source: str) -> tuple[list[str], bool]:
    """The variables of the kernel's last loop nest, outermost first (a blocked loop
    ``x1_blk`` counts as ``x1``), and whether the innermost variable's element loop
    carries an ``omp simd`` pragma."""
    lines = source[source.index('extern "C"'):].splitlines()
    nests: list[list[str]] = [[]]
    simd = {}
    for i, ln in enumerate(lines):
        match = re.match(r"\s*for \(\w+ (\w+?)(_blk)? =", ln)
        if match:
            nests[-1].append(match.group(1))
            if not match.group(2):
                simd[match.group(1)] = "#pragma omp simd" in lines[i - 1]
        elif "#pragma" not in ln and nests[-1]:
            nests.append([])
    order = [nest for nest in nests if nest][-1]
    return order, simd.get(order[-1], False)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_channels_last_pointwise_loops_over_channels_innermost(dynamic):
    x = torch.randn(4, 16, 8, 8).to(memory_format=torch.channels_last)
    b = torch.randn(16, 1, 1)
    f = lambda x, b: torch.relu(x * 2 + b)  # noqa: E731
    program = fxwrap.lower(f, x, b, dynamic=dynamic)
    (source,) = _kernel_sources(program)
    assert _loop_order(source) == (["x0", "x2", "x3", "x1"], True)  # x1: the channel dim, stride 1
    x2 = torch.randn(4, 16, 8, 8).to(memory_format=torch.channels_last)
    out = program.run(x2, b)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, f(x2, b))
    assert out.stride() == f(x2, b).stride()


def test_contiguous_output_of_a_transposed_input_keeps_the_store_order():
    x = torch.randn(48, 40)
    program = fxwrap.lower(lambda x: (x.t() + 1).contiguous(), x)
    (source,) = _kernel_sources(program)
    assert _loop_order(source) == (["x0", "x1"], True)
    out = program.run(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, x.t() + 1)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_reshape_round_trip_reads_with_an_affine_index(dynamic):
    """``(B*T, C)`` viewed as ``(B, T, C)`` and back (what every linear layer of a
    transformer does): the kernel's loads are affine in the loop variables, no ``/`` or
    ``%``, and the inner loop vectorizes."""
    x = torch.randn(8 * 16, 48)
    f = lambda x: torch.tanh(x.view(8, -1, x.shape[1]) * 2).view(-1, x.shape[1]) + 1  # noqa: E731
    program = fxwrap.lower(f, x, dynamic=dynamic)
    (source,) = _kernel_sources(program)
    body = source[source.index('extern "C"'):]
    loads = re.findall(r"in_ptr0\[([^\]]*)\]", body)
    assert loads and not any("/" in index or "%" in index for index in loads), loads
    assert _loop_order(source)[1]
    out = program.run(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, f(x))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_column_sum_with_a_per_row_scale_walks_rows_outermost(dynamic):
    """A layer norm's weight gradient, ``(g * xhat * rstd).sum(0)``: the per-row
    ``rstd`` is one scalar per row, so the kernel still reduces column-wise (rows
    outermost, contiguous vector loads across columns) instead of striding down each
    column."""
    g, x, rstd = torch.randn(512, 96), torch.randn(512, 96), torch.rand(512, 1) + 0.5
    f = lambda g, x, r: (g * x * r).sum(0)  # noqa: E731
    program = fxwrap.lower(f, g, x, rstd, dynamic=dynamic)
    (source,) = _kernel_sources(program)
    assert "const int64_t x0 = xbase + xj;" in source
    out = program.run(g, x, rstd)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, f(g, x, rstd), rtol=1e-4, atol=1e-4)
