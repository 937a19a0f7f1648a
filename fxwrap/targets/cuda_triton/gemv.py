"""The Triton GEMV template: one-row matrix products (batch-1 decoding) at the bandwidth
limit, with the scheduler's epilogue and, for int8 weight-only layers, the dequantization
fused.

A decode step multiplies one activation row by every weight of a layer: ``x[1, K] @ w.T``
with ``w`` an ``nn.Linear`` weight ``[N, K]`` (row-major: each output's ``K`` weights
contiguous).  Each weight is read once and used once, so the time is the weight's bytes
over the memory bandwidth; a tiled ``tl.dot`` kernel pads the one row to 16 and a
library GEMM pays a separate launch for the bias and the activation.  This kernel gives
each program ``NBLOCK`` outputs, walks ``K`` in ``KBLOCK`` steps with wide loads along the
weight's contiguous axis, keeps a float32 ``[NBLOCK, KBLOCK]`` partial sum (one FMA per
weight element, no cross-thread traffic in the loop), reduces it once, and runs the
epilogue on the ``[1, NBLOCK]`` result.  An int8 weight (``_weight_int8pack_mm``, the
rewrite of ``linear(x, w_int8.to(x.dtype)) * scale``: ``fxwrap.core.patterns``) is
widened to float32 in registers (exact) and its per-channel scale is the epilogue's
first multiply: the weight is read as int8, half the bytes of a bfloat16 copy.

``F.silu(F.linear(x, w, b))`` with ``x`` ``(1, 4096)``, ``w`` ``(11008, 4096)`` bfloat16
(``addmm(b, x, permute(w))``) renders as::

    @triton.jit
    def fxwrap_template_0(in_ptr0, in_ptr1, in_ptr2, out_ptr0, MBLOCK: tl.constexpr,
                          NBLOCK: tl.constexpr, KBLOCK: tl.constexpr, EVEN_K: tl.constexpr):
        M = 1
        N = 11008
        K = 4096
        pid = tl.program_id(0)
        ntiles = (N + NBLOCK - 1) // NBLOCK
        ntile = pid % ntiles
        rn = ntile * NBLOCK + tl.arange(0, NBLOCK)
        rk = tl.arange(0, KBLOCK)
        rbn = rn % N
        a_ptrs = in_ptr0 + (0 * (4096) + rk[None, :] * (1))
        b_ptrs = in_ptr1 + (rk[None, :] * (1) + rbn[:, None] * (4096))
        partial = tl.zeros([NBLOCK, KBLOCK], dtype=tl.float32)
        for kstep in range(0, (K + KBLOCK - 1) // KBLOCK):
            if EVEN_K:
                a = tl.load(a_ptrs, eviction_policy="evict_last")      # x: [1, KBLOCK], kept in L2
                b = tl.load(b_ptrs, eviction_policy="evict_first")
            else:
                kleft = K - kstep * KBLOCK
                a = tl.load(a_ptrs, mask=rk[None, :] < kleft, other=0.0, eviction_policy="evict_last")
                b = tl.load(b_ptrs, mask=rk[None, :] < kleft, other=0.0, eviction_policy="evict_first")
            partial += b.to(tl.float32) * a.to(tl.float32)
            a_ptrs += KBLOCK * (1)
            b_ptrs += KBLOCK * (1)
        acc = tl.sum(partial, axis=1)[None, :]
        ...                      # mindex/nindex, then the epilogue (bias, silu, bf16 cast, store)

Columns past ``N`` are read at ``rn % N`` (in bounds, never stored); only the ``K`` tail is
masked, where ``K`` is not a multiple of the config's ``KBLOCK`` (``EVEN_K``).  A
batched one-row product (``bmm`` of ``(B, 1, K)``) runs ``B * ceil(N / NBLOCK)`` programs.
The tilings (``gemv_configs``) are timed by the emitter on the GPU; the fastest is timed
against the ATen call (cuBLAS, or ATen's ``_weight_int8pack_mm``) + the epilogue kernel by
the template choice, in the default mode too (``in_default_mode``: a handful of small
kernels to compile, and a one-row product is where a generated kernel can beat cuBLAS).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from fxwrap.core import patterns
from fxwrap.core.patterns import INT8_MM
from fxwrap.core.templates import Template, TemplateCall
from fxwrap.ir.loops import ScheduledKernel
from fxwrap.targets.cuda_triton.codegen import CodegenError
from fxwrap.targets.cuda_triton.gemm import GEMM_DTYPES, ProductKernel, template_source
from fxwrap.targets.cuda_triton.tiling import next_pow2

aten = torch.ops.aten


@dataclass(frozen=True)
class GemvConfig:
    """One tiling: ``block_n`` outputs per program, ``block_k`` weights of each per step."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 1

    def launch_config(self, k_static: int | None) -> tuple:
        even_k = int(k_static is not None and k_static % self.block_k == 0)
        return (("MBLOCK", 1), ("NBLOCK", self.block_n), ("KBLOCK", self.block_k), ("EVEN_K", even_k),
                ("num_stages", self.num_stages), ("num_warps", self.num_warps))


# (outputs per program, weight bytes of each per step, warps, stages) for a weight read
# along K (an nn.Linear weight): 4-16 KiB of weights per program and step, from one output
# per program (many programs: small N) to 32 (few programs, long rows); a few pipelined.
_ALONG_K = (
    (1, 4096, 4, 1), (2, 4096, 4, 1), (4, 2048, 4, 1), (8, 1024, 4, 1), (16, 512, 4, 1),
    (2, 8192, 8, 1), (4, 4096, 8, 1), (8, 2048, 8, 1), (16, 1024, 8, 1), (32, 512, 8, 1),
    (4, 2048, 4, 3), (8, 1024, 4, 3),
)
# a weight read along N (``x @ w`` with ``w`` a row-major ``[K, N]``): wide along N, short K steps
_ALONG_N = (
    (1024, 16, 4, 1), (512, 32, 4, 1), (2048, 16, 8, 1), (1024, 32, 8, 1), (512, 64, 8, 1), (256, 64, 4, 1),
)


def reads_along_n(call: TemplateCall) -> bool:
    """Whether the weight ``b`` (``(K, N)``) is contiguous along N rather than along K."""
    b = call.operands[1]
    return sympy.sympify(b.stride[-1]) == 1 and sympy.sympify(b.stride[-2]) != 1


def gemv_configs(call: TemplateCall, interpret: bool) -> list[GemvConfig]:
    """The candidate tilings at ``call``'s size hints: the table for the weight's layout,
    each block capped at the problem (next power of two), deduplicated, in table order.
    Under the interpreter one small tiling (its cost is per program and per op)."""
    n, k = (max(1, call.hint(d)) for d in ("n", "k"))
    cap_n, cap_k = next_pow2(n), next_pow2(k)
    if interpret:
        return [GemvConfig(min(8, cap_n), min(32, cap_k), 1)]
    itemsize = call.operands[1].dtype.itemsize
    out: list[GemvConfig] = []
    if reads_along_n(call):
        rows = [(nbytes // itemsize, bk, warps, stages) for nbytes, bk, warps, stages in _ALONG_N]
    else:
        rows = [(bn, kbytes // itemsize, warps, stages) for bn, kbytes, warps, stages in _ALONG_K]
    for bn, bk, warps, stages in rows:
        bn, bk = min(bn, cap_n), min(bk, cap_k)
        warps = max(1, min(warps, bn * bk // 256))  # at least 256 elements of the tile per warp
        warps = 1 << (warps.bit_length() - 1)
        cfg = GemvConfig(bn, bk, warps, stages)
        if cfg not in out:
            out.append(cfg)
    return out


class GemvWriter:
    """``GemvWriter(kernel, target_name).write() -> body lines`` of a one-row template
    kernel: the ``K`` loop over a ``[NBLOCK, KBLOCK]`` float32 partial sum, its reduction
    to ``acc`` ``[1, NBLOCK]``, then the kernel's stores (the epilogue) with
    ``template_out`` bound to ``acc`` (``ProductKernel.epilogue``, as ``GemmWriter``'s)."""

    def __init__(self, kernel: ScheduledKernel, target_name: str = "triton", intrinsics: tuple = ()):
        self.product = ProductKernel(kernel, target_name, intrinsics)

    def write(self) -> list[str]:
        p = self.product
        body = p.sizes()
        body.append("ntiles = (N + NBLOCK - 1) // NBLOCK")
        if p.batched:
            body.append("zindex = pid // ntiles")
        body += ["ntile = pid % ntiles",
                 "rn = ntile * NBLOCK + tl.arange(0, NBLOCK)",
                 "rk = tl.arange(0, KBLOCK)",
                 f"rbn = {p.wrapped('rn', 'N', p.b, -1)}",
                 f"a_ptrs = {p.operand(p.a, '0', 'rk[None, :]')}",
                 f"b_ptrs = {p.operand(p.b, 'rk[None, :]', 'rbn[:, None]')}",
                 "partial = tl.zeros([NBLOCK, KBLOCK], dtype=tl.float32)",
                 "for kstep in range(0, (K + KBLOCK - 1) // KBLOCK):",
                 "    if EVEN_K:",
                 '        a = tl.load(a_ptrs, eviction_policy="evict_last")',
                 '        b = tl.load(b_ptrs, eviction_policy="evict_first")',
                 "    else:",
                 "        kleft = K - kstep * KBLOCK",
                 '        a = tl.load(a_ptrs, mask=rk[None, :] < kleft, other=0.0, eviction_policy="evict_last")',
                 '        b = tl.load(b_ptrs, mask=rk[None, :] < kleft, other=0.0, eviction_policy="evict_first")',
                 "    partial += b.to(tl.float32) * a.to(tl.float32)",
                 f"    a_ptrs += KBLOCK * ({p.idx(p.a.stride[-1])})",
                 f"    b_ptrs += KBLOCK * ({p.idx(p.b.stride[-2])})",
                 "acc = tl.sum(partial, axis=1)[None, :]",
                 "rm = tl.arange(0, MBLOCK)",
                 "mindex = rm[:, None]", "mmask = mindex < M", "nindex = rn[None, :]", "nmask = nindex < N"]
        return p.epilogue(body)


def one_row(call: TemplateCall) -> bool:
    """Whether ``call`` has exactly one row (``m`` is 1 whatever the program's sizes)."""
    return sympy.sympify(call.size("m")) == 1


class TritonGemv(Template):
    """One-row ``mm``/``addmm``/``bmm`` (``M == 1``, any batch) of float32, bfloat16 or
    float16 operands, and ``_weight_int8pack_mm`` with one activation row (int8 weights
    widened in registers, the scale in the epilogue), on the Triton targets, the
    scheduler's epilogue fused: ``render(kernel, emitter)`` is a ``KernelSource`` of one
    ``@triton.jit`` function with the kernel's usual signature (module docstring).

    Listed before ``triton_gemm``: under ``templates="always"`` a one-row product is this
    kernel's.  In the default mode it is timed against the ATen call (cuBLAS) and kept
    only where it is faster."""

    name = "triton_gemv"
    ops = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, INT8_MM})
    in_default_mode = True
    pattern_guarantee = True  # pattern_refusal below accepts only what refusal accepts

    def refusal(self, call: TemplateCall) -> str | None:
        a, b = call.operands[:2]
        if a.dtype not in GEMM_DTYPES:
            return f"{a.dtype} activations ({self.name} computes float32, bfloat16 and float16)"
        if call.op == INT8_MM:
            if b.dtype != torch.int8:
                return f"a {b.dtype} weight ({INT8_MM} takes int8)"
        elif b.dtype != a.dtype:
            return f"operands {a.dtype} x {b.dtype}"
        if call.acc_dtype != torch.float32:
            return f"a {call.acc_dtype} accumulator"
        if not one_row(call):
            return f"{call.size('m')} rows ({self.name} computes one-row products; triton_gemm and cuBLAS the rest)"
        if any(int(h) == 0 for _, h in call.hints):
            return "an empty product"
        return None

    def extern_refusal(self, call: TemplateCall) -> str | None:
        if call.op != INT8_MM:
            return None
        x = call.operands[0]
        contiguous = sympy.sympify(x.stride[-1]) == 1 or sympy.sympify(x.size[-1]) == 1
        return patterns.aten_int8_mm_refusal(call.dtype, call.size("k"), call.output.device.type, contiguous)

    def pattern_refusal(self, op, args: tuple) -> str | None:
        x, w = args[:2]
        rows = x.shape[0]
        if isinstance(rows, torch.SymInt) or rows != 1:
            return (f"activations of {rows} rows: {self.name} computes one-row products, the dequantizing "
                    "kernel and the library GEMM the others")
        if x.dtype not in GEMM_DTYPES or w.dtype != torch.int8 or any(isinstance(d, int) and d == 0
                                                                      for d in (*x.shape, *w.shape)):
            return f"{x.dtype} activations and a {w.dtype} weight of {tuple(w.shape)}"
        return None

    def render(self, kernel: ScheduledKernel, emitter):
        call = kernel.template
        if call is None:
            raise CodegenError(f"kernel {kernel.name} has no template call (template {self.name})")
        gw = GemvWriter(kernel, emitter.target_name, intrinsics=emitter.intrinsics)
        k = sympy.sympify(call.size("k"))
        configs = [c.launch_config(int(k) if k.is_Integer else None)
                   for c in gemv_configs(call, emitter.interpret)]
        along = "N" if reads_along_n(call) else "K"
        batch = "batch x " if gw.product.batched else ""
        return template_source(emitter, kernel, self.name, gw, ("MBLOCK", "NBLOCK", "KBLOCK", "EVEN_K"), configs,
                               f"{batch}NBLOCK outputs per program, the weight read along {along}")
