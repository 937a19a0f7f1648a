"""The CPU target's int8 weight-only GEMM template: ``aten._weight_int8pack_mm``.

``_weight_int8pack_mm(x, w, scales)`` (``x`` ``[M, K]`` bf16 or fp32, ``w`` ``[N, K]`` int8,
``scales`` ``[N]``) is the weight-only quantized linear of LLM inference; the
dequantize-and-linear pattern ``linear(x, w.to(x.dtype)) * scale`` is rewritten to it on
the ATen graph (``fxwrap.core.patterns``).  The kernel (``int8_gemm_source``) reads the
weights in the op's own ``[N, K]`` row-major layout, as the parameter is, so nothing is
packed or cached between calls: each output channel's ``K`` weights are contiguous,
and a block of channels is dequantized in registers (fp32 FMA) or once per block into a
bf16 panel on the thread's stack (AVX-512-BF16 dot products, batches of 4 and more).

The template's accumulator (``template_out``) is the fp32 ``sum_k x[m, k] * w[n, k]``;
the builder's epilogue multiplies it by ``scales[n]`` in fp32 and rounds it to ``x``'s
dtype (eager's order), then the fused pointwise ops follow.  Rendered for
``relu(_weight_int8pack_mm(x, w, s))`` in bf16 (after the library code)::

    extern "C" void fxwrap_template_0(const fx_bf16* __restrict__ in_ptr0,     // x
                                      const int8_t* __restrict__ in_ptr1,      // w
                                      const fx_bf16* __restrict__ in_ptr2,     // scales
                                      fx_bf16* __restrict__ out_ptr0, const int64_t s0)
    {
      const float tmp3 = 0.0f;
      fx_int8mm(in_ptr0, 4096, in_ptr1, 4096, s0, 4096, 4096,
                [&](const int64_t x0, const int64_t x1, const float acc) {
        const float tmp0 = fx_bf16_to_float(in_ptr2[x1]);
        const float tmp1 = acc * tmp0;
        const float tmp2 = fx_bf16_round(tmp1);
        ...
        out_ptr0[x1 + 4096*x0] = fx_float_to_bf16(tmp4);
      });
    }
"""
from __future__ import annotations

import functools

import sympy
import torch

from fxwrap.core.patterns import aten_int8_mm_refusal
from fxwrap.core.templates import Template, TemplateCall
from fxwrap.targets.base import KernelSource
from fxwrap.targets.cpu_cpp.row_call import render_row_call
from fxwrap.targets.cpu_cpp.int8_gemm_source import INT8_GEMM_SOURCE

aten = torch.ops.aten

#: what the kernel's instructions need (AVX-512 F + BW: the byte/word loads and masks)
REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw")


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset:
    """The host CPU's feature flags (``/proc/cpuinfo``; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


class CppInt8Gemm(Template):
    """``aten._weight_int8pack_mm`` on CPU tensors: bf16 or fp32 activations with row-major
    ``K`` (any row stride), a contiguous int8 ``[N, K]`` weight, AVX-512 CPUs.

    ``CppInt8Gemm().render(kernel, emitter)`` -> a ``KernelSource`` of one ``extern "C"``
    function with the kernel's usual signature (the call's operands ``x``, ``w``, ``scales``,
    then the epilogue's other inputs), calling the library's ``fx_int8mm`` with the epilogue as a lambda
    (module docstring).
    """

    name = "cpp_int8_gemm"
    ops = frozenset({aten._weight_int8pack_mm.default})

    def refusal(self, call: TemplateCall) -> str | None:
        x, w = call.operands[:2]  # w: the int8 [N, K] weight seen as (K, N), stride (1, K)
        if x.dtype not in (torch.float32, torch.bfloat16):
            return f"{x.dtype} activations (cpp_int8_gemm computes float32 and bfloat16)"
        if call.output.device.type != "cpu":
            return f"operands on {call.output.device}"
        missing = [f for f in REQUIRED_CPU_FLAGS if f not in cpu_flags()]
        if missing:
            return f"the CPU lacks {', '.join(missing)}"
        if sympy.sympify(x.stride[1]) != 1 and sympy.sympify(x.size[1]) != 1:
            return f"activations with a k stride of {x.stride[1]} (the kernel reads rows of x)"
        if sympy.sympify(w.stride[0]) != 1 and sympy.sympify(w.size[0]) != 1:
            return f"a weight with a k stride of {w.stride[0]} (the kernel reads rows of w)"
        return None

    def extern_refusal(self, call: TemplateCall) -> str | None:
        return aten_int8_mm_refusal(call.dtype, call.size("k"))

    def render(self, kernel, emitter) -> KernelSource:
        return render_row_call(self.name, kernel, emitter, "fx_int8mm", INT8_GEMM_SOURCE)
