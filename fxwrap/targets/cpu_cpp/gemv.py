"""The CPU target's few-row GEMM template: ``mm`` / ``addmm`` (``linear``) with one to
``MAX_ROWS`` rows of activations, float32 or bfloat16, the weight read in place.

A decode step's projections are ``[1, K] @ w.T`` with ``w`` an ``nn.Linear`` weight ``[N, K]``:
the ATen graph's ``b`` operand is ``permute(w)``, a ``(K, N)`` view of stride ``(1, K)``.
``cpp_gemm`` packs a panel of ``b`` for every call (a transpose of every weight element, then
a product that uses each packed element once); here the weight is read once, along its rows,
as it lies in memory (``rowdot_source.fx_rowdot``: 16 ``k`` lanes of fp32 FMA per output,
the lanes added at the end).  The product is memory bound: reading the weight is the work.

The template's accumulator (``template_out``) is the fp32 sum; the epilogue (bias, activation,
residual, the rounding to bfloat16) runs on each output element.  Rendered for
``silu(linear(x, w))`` (float32, after the library code)::

    extern "C" void fxwrap_template_0(const float* __restrict__ in_ptr0,   // x [1, 256]
                                      const float* __restrict__ in_ptr1,   // w.T (256, 704) stride (1, 256)
                                      float* __restrict__ out_ptr0)
    {
      fx_rowdot(in_ptr0, 256, in_ptr1, 256, 1, 704, 256,
                [&](const int64_t x0, const int64_t x1, const float acc) {
        const float tmp0 = ...acc...;
        out_ptr0[x1 + 704*x0] = tmp0;
      });
    }
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.core.templates import Template, TemplateCall
from fxwrap.targets.base import KernelSource
from fxwrap.targets.cpu_cpp.row_call import render_row_call
from fxwrap.targets.cpu_cpp.int8_gemm import REQUIRED_CPU_FLAGS, cpu_flags
from fxwrap.targets.cpu_cpp.rowdot_source import ROWDOT_SOURCE

aten = torch.ops.aten


class CppGemv(Template):
    """``mm`` / ``addmm`` of at most ``MAX_ROWS`` rows (by the size hints) on float32 or
    bfloat16 CPU tensors whose ``a`` rows and ``b`` columns are contiguous in ``k`` (``x @ w.T``
    with ``w`` an ``[N, K]`` row-major weight); AVX-512 CPUs.

    ``CppGemv().render(kernel, emitter)`` -> a ``KernelSource`` of one ``extern "C"`` function
    with the kernel's usual signature (``a``, ``b``, then the epilogue's inputs) calling
    ``fx_rowdot`` with the epilogue as a lambda (module docstring).
    """

    name = "cpp_gemv"
    ops = frozenset({aten.mm.default, aten.addmm.default})
    #: rows of ``a`` (size hint) up to which the row-dot kernel is a candidate: each block of
    #: weight rows is read once per 4 rows of ``a``, so past a few rows cpp_gemm's packed
    #: panels, reused by every row, do better
    MAX_ROWS = 4

    def refusal(self, call: TemplateCall) -> str | None:
        a, b = call.operands[:2]
        if call.dtype not in (torch.float32, torch.bfloat16) or b.dtype != call.dtype:
            return f"{call.dtype} operands (cpp_gemv computes float32 and bfloat16)"
        if call.output.device.type != "cpu":
            return f"operands on {call.output.device}"
        if call.hint("m") > self.MAX_ROWS:
            return f"{call.hint('m')} rows (cpp_gemv reads the weight once per 4 rows: at most {self.MAX_ROWS})"
        missing = [f for f in REQUIRED_CPU_FLAGS if f not in cpu_flags()]
        if missing:
            return f"the CPU lacks {', '.join(missing)}"
        if sympy.sympify(a.stride[1]) != 1 and sympy.sympify(a.size[1]) != 1:
            return f"activations with a k stride of {a.stride[1]} (cpp_gemv reads rows of a)"
        if sympy.sympify(b.stride[0]) != 1 and sympy.sympify(b.size[0]) != 1:
            return f"b with a k stride of {b.stride[0]} (cpp_gemv reads b as [N, K] rows: x @ w.T)"
        return None

    def render(self, kernel, emitter) -> KernelSource:
        return render_row_call(self.name, kernel, emitter, "fx_rowdot", ROWDOT_SOURCE)
