"""Attention of the C++/OpenMP target: ATen's CPU flash attention replaced by one C++ kernel.

At the sizes a CPU runs (sequences of a few hundred, head sizes of 32-64) ATen's
``_scaled_dot_product_flash_attention_for_cpu`` spends its time in small ``gemm`` calls per
block; a causal call also computes the blocks above the diagonal.  This Wrapper-IR pass (``"cpu
attention"``, which the ``cpu`` target's plugin puts before ``"memory plan"`` through the public
``fxwrap_pipeline`` hook) replaces the extern, where the call is float32, without dropout, of
static sizes, causal or of head size <= 32 (with or without an additive float mask: T5's
position bias), by a kernel that per (batch, head) and block of 8 query rows computes the scores against the keys
the row sees (register-blocked, the keys transposed once per head), their softmax, and the
weighted sum of values, and writes the output and the log-sum-exp where the extern would.
Grouped key/value heads (``H`` query heads, ``KH`` key/value heads, ``KH`` dividing ``H``: what
HF's grouped-query attention passes) read each key/value head for its ``H / KH`` query heads.
The 1-thread causal llama attention ``(8, 6, 128, 32)``: ATen 1.8 ms, the kernel 1.2 ms.

A causal call of the hand-written Llama (q a view of the RoPE output)::

    tuple18 = aten._scaled_dot_product_flash_attention_for_cpu.default(buf13, buf15, buf17, 0.0, True)
    buf19 = tuple18[0]
    buf20 = tuple18[1]

becomes (the memory plan then frees and reuses as for any kernel)::

    buf19 = empty_strided((8, 6, 128, 32), (24576, 32, 192, 1), dtype=torch.float32, device='cpu')
    buf20 = empty_strided((8, 6, 128), (768, 1, 6), dtype=torch.float32, device='cpu')
    # kernel fxwrap_attention_0 (cpu): q:input, k:input, v:input, out:output, lse:output
    fxwrap_attention_0(buf13, buf15, buf17, buf19, buf20)

The output and log-sum-exp keep the extern's layouts (the lines after read them as before),
so training's backward (``_scaled_dot_product_flash_attention_for_cpu_backward``) reads them
as it reads the extern's.  The numbers differ from ATen's by the order of the sums (within
float32 rounding: the tests compare with eager at 1e-5).  Any other call stays the extern.
"""
from __future__ import annotations

import math

import sympy
import torch

from fxwrap.core.passes import LinesPass
from fxwrap.ir.lines import Allocate, Buffer, CallExtern, CallKernel, DefineKernel, GetItem
from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.runtime.launch import CppLaunch
from fxwrap.targets.cpu_cpp.prelude import PRELUDE
from fxwrap.targets.host.loader import kernel_loader

aten = torch.ops.aten

#: The op this pass replaces.
FLASH_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default

#: Query rows per block (the score tile is ROWS x 16 keys in registers).
ROWS = 8
#: Longest key sequence the kernel takes (it holds a block's scores over every key; causal
#: (1, 16, 1024, 64) at one thread: ATen 42 ms, the kernel 38).
MAX_KEYS = 1024
#: Largest head the kernel takes (a block's output rows are held in registers: at 128 they spill,
#: causal (2, 8, 128, 128) 1.87 ms against ATen's 1.83).
MAX_HEAD = 64


def _ints(values) -> tuple[int, ...] | None:
    """``values`` (sympy expressions) as ints, or None when one is not a constant."""
    out = []
    for v in values:
        v = sympy.sympify(v)
        if not v.is_Integer:
            return None
        out.append(int(v))
    return tuple(out)


def _bound(line: CallExtern) -> dict:
    """The op's arguments by name (its schema's defaults filled in)."""
    schema = FLASH_CPU._schema
    values = dict(zip((a.name for a in schema.arguments), line.args))
    values.update(dict(line.kwargs))
    for a in schema.arguments:
        if a.name not in values:
            values[a.name] = a.default_value if a.has_default_value() else None
    return values


def attention_refusal(line: CallExtern) -> str | None:
    """Why the kernel does not compute this ``_scaled_dot_product_flash_attention_for_cpu``
    call (the extern stays), or None."""
    a = _bound(line)
    q, k, v = a["query"], a["key"], a["value"]
    if not all(isinstance(t, Buffer) for t in (q, k, v)):
        return "query, key or value not a buffer"
    if any(t.dtype != torch.float32 for t in (q, k, v)):
        return "not float32"
    if a["dropout_p"] not in (0, 0.0):
        return "dropout"
    sizes = [_ints(t.size) for t in (q, k, v)]
    strides = [_ints(t.stride) for t in (q, k, v)]
    if any(s is None or len(s) != 4 for s in sizes) or any(s is None for s in strides):
        return "sizes or strides not static, or not 4-D"
    (b, h, t, d), (kb, kh, s, kd), (vb, vh, vs, vd) = sizes
    if (kb, kd) != (b, d) or (vb, vh, vs, vd) != (b, kh, s, d) or kh < 1 or h % kh:
        return "key or value of other sizes than the query (another value size, heads not grouped)"
    if any(st[3] != 1 for st in strides):
        return "a head dim not contiguous"
    if t < 16 or s > MAX_KEYS or d > MAX_HEAD or s < 1 or b * h == 0:
        return f"sizes out of the kernel's range (queries {t}, keys {s}, head {d})"
    if not a["is_causal"] and d > 32:
        return "not causal, head size over 32 (ATen's kernel is as fast there)"
    if a["attn_mask"] is not None and _mask_strides(a["attn_mask"], (b, h, t, s)) is None:
        return "a mask not float32 of static sizes that broadcast to (batch, heads, queries, keys)"
    return None


def _mask_strides(mask, shape) -> tuple[int, ...] | None:
    """The strides (0 along a broadcast dim) through which ``mask`` (2-D to 4-D, float32) is read
    at ``(b, h, i, j)`` of the attention's ``shape``, or None where it cannot be."""
    if not isinstance(mask, Buffer) or mask.dtype != torch.float32 or not 2 <= len(mask.size) <= 4:
        return None
    sizes, strides = _ints(mask.size), _ints(mask.stride)
    if sizes is None or strides is None:
        return None
    pad = 4 - len(sizes)
    sizes, strides = (1,) * pad + sizes, (0,) * pad + strides
    if any(n not in (1, want) for n, want in zip(sizes, shape)):
        return None
    return tuple(0 if n == 1 else st for n, st in zip(sizes, strides))


def _mask_add(ms) -> str:
    """The C++ adding the mask (read through strides ``ms``) to a score tile's rows inside the
    query rows and keys of the block: nothing without a mask."""
    if ms is None:
        return ""
    return f"""
          const float* mrow = mask + b * {ms[0]} + h * {ms[1]} + i0 * {ms[2]} + j0 * {ms[3]};
          const int64_t jl = std::min<int64_t>(NV, nk - j0);
          for (int64_t r = 0; r < mb; ++r)
            for (int64_t l = 0; l < jl; ++l) sc[r * SP + j0 + l] += mrow[r * {ms[2]} + l * {ms[3]}];"""


def attention_source(name: str, line: CallExtern, out, lse) -> str:
    """The C++ kernel ``name(q, k, v, [mask,] out, lse)`` for the call ``line`` (sizes, strides, scale and
    causality baked in) writing ``out`` (``(B, H, T, D)``) and ``lse`` (``(B, H, T)``) through their
    own strides."""
    a = _bound(line)
    q, k, v = a["query"], a["key"], a["value"]
    b, h, t, d = _ints(q.size)
    kh, s = _ints(k.size)[1:3]
    qs, ks, vs = _ints(q.stride), _ints(k.stride), _ints(v.stride)
    os_, ls = _ints(out.stride), _ints(lse.stride)
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(d)
    ms = _mask_strides(a["attn_mask"], (b, h, t, s)) if a["attn_mask"] is not None else None
    mask_arg = "const float* mask, " if ms else ""
    causal = 1 if a["is_causal"] else 0
    sp = -(-s // 16) * 16
    return f"""// fxwrap kernel {name}: attention of q {tuple(q.size)}, k/v {tuple(k.size)}, causal {bool(causal)}
{PRELUDE}
#include <algorithm>
extern "C" void {name}(const float* q, const float* k, const float* v, {mask_arg}float* out, float* lse)
{{
  // G query heads share one key/value head (grouped-query attention: H = G * KH)
  constexpr int64_t B = {b}, H = {h}, G = {h // kh}, T = {t}, S = {s}, D = {d}, SP = {sp}, MB = {ROWS}, NV = 16;
  constexpr bool causal = {causal};
  const float scale = {float(scale)!r}f;
  #pragma omp parallel
  {{
    float* kt = new float[D * SP];
    float* sc = new float[MB * SP];
    #pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {{
      const int64_t b = bh / H, h = bh % H;
      const float* qp = q + b * {qs[0]} + h * {qs[1]};
      const float* kp = k + b * {ks[0]} + (h / G) * {ks[1]};
      const float* vp = v + b * {vs[0]} + (h / G) * {vs[1]};
      float* op = out + b * {os_[0]} + h * {os_[1]};
      float* lp = lse + b * {ls[0]} + h * {ls[1]};
      // the keys transposed (the score tile loads 16 keys of one dim at once), zero-padded to SP
      for (int64_t j = 0; j < S; ++j)
        for (int64_t e = 0; e < D; ++e) kt[e * SP + j] = kp[j * {ks[2]} + e];
      for (int64_t j = S; j < SP; ++j)
        for (int64_t e = 0; e < D; ++e) kt[e * SP + j] = 0.f;
      for (int64_t i0 = 0; i0 < T; i0 += MB) {{
        const int64_t mb = std::min<int64_t>(MB, T - i0);
        // keys this block sees: a causal row i sees keys 0..i (the top-left diagonal, as eager)
        const int64_t nk = causal ? std::min<int64_t>(i0 + mb, S) : S;
        const int64_t nkp = (nk + NV - 1) / NV * NV;
        float qb[MB][D];
        for (int64_t r = 0; r < MB; ++r)
          for (int64_t e = 0; e < D; ++e) qb[r][e] = r < mb ? qp[(i0 + r) * {qs[2]} + e] * scale : 0.f;
        for (int64_t j0 = 0; j0 < nkp; j0 += NV) {{
          float acc[MB][NV] = {{}};
          for (int64_t e = 0; e < D; ++e) {{
            const float* kr = kt + e * SP + j0;
            for (int64_t r = 0; r < MB; ++r) {{
              const float qv = qb[r][e];
              #pragma omp simd
              for (int64_t l = 0; l < NV; ++l) acc[r][l] = fx_fmaf(qv, kr[l], acc[r][l]);
            }}
          }}
          for (int64_t r = 0; r < MB; ++r)
            for (int64_t l = 0; l < NV; ++l) sc[r * SP + j0 + l] = acc[r][l];{_mask_add(ms)}
        }}
        float inv[MB];
        for (int64_t r = 0; r < mb; ++r) {{
          float* srow = sc + r * SP;
          const int64_t lim = causal ? std::min<int64_t>(i0 + r + 1, S) : S;
          float m = -INFINITY;
          #pragma omp simd reduction(max:m)
          for (int64_t j = 0; j < lim; ++j) m = m > srow[j] ? m : srow[j];
          if (m == -INFINITY) {{  // every key masked out: zeros, as ATen's kernel
            for (int64_t j = 0; j < nkp; ++j) srow[j] = 0.f;
            inv[r] = 0.f;
            lp[(i0 + r) * {ls[2]}] = 0.f;
            continue;
          }}
          float sum = 0.f;
          #pragma omp simd reduction(+:sum)
          for (int64_t j = 0; j < lim; ++j) {{ const float x = fx_expf(srow[j] - m); srow[j] = x; sum += x; }}
          for (int64_t j = lim; j < nkp; ++j) srow[j] = 0.f;
          inv[r] = 1.f / sum;
          lp[(i0 + r) * {ls[2]}] = m + std::log(sum);
        }}
        for (int64_t r = mb; r < MB; ++r)
          for (int64_t j = 0; j < nkp; ++j) sc[r * SP + j] = 0.f;
        float o[MB][D] = {{}};
        for (int64_t j = 0; j < nk; ++j) {{
          const float* vr = vp + j * {vs[2]};
          for (int64_t r = 0; r < MB; ++r) {{
            const float p = sc[r * SP + j];
            #pragma omp simd
            for (int64_t e = 0; e < D; ++e) o[r][e] = fx_fmaf(p, vr[e], o[r][e]);
          }}
        }}
        for (int64_t r = 0; r < mb; ++r)
          for (int64_t e = 0; e < D; ++e) op[(i0 + r) * {os_[2]} + e] = o[r][e] * inv[r];
      }}
    }}
    delete[] kt;
    delete[] sc;
  }}
}}
"""


#: The pass's name in the Wrapper-IR pass list (``Pipeline.wrapper``).
PASS_NAME = "cpu attention"


def attention_pass() -> LinesPass:
    """The ``"cpu attention"`` Wrapper-IR pass (runs before ``"memory plan"``)."""
    return LinesPass(PASS_NAME, lambda lines, program: attention_kernels(lines))


def attention_kernels(lines: list) -> list:
    """Each ``_scaled_dot_product_flash_attention_for_cpu`` extern of ``lines`` that
    ``attention_refusal`` accepts, with its ``GetItem`` lines, as the ``Allocate`` lines of its
    two results, a ``DefineKernel`` and a ``CallKernel`` (see the module docstring); lines
    without ``Free`` / ``Reuse`` yet (the memory plan comes after)."""
    items: dict[str, dict[int, GetItem]] = {}
    for line in lines:
        if isinstance(line, GetItem):
            items.setdefault(line.src, {})[line.index] = line
    out: list = []
    replaced: set[str] = set()
    for line in lines:
        if isinstance(line, GetItem) and line.src in replaced:
            continue
        made = None
        if isinstance(line, CallExtern) and line.op is FLASH_CPU and isinstance(line.out, str):
            made = _kernel_lines(line, items.get(line.out, {}), f"fxwrap_attention_{len(replaced)}")
        if made is None:
            out.append(line)
        else:
            out += made
            replaced.add(line.out)
    return out


def _kernel_lines(line: CallExtern, items: dict, name: str) -> list | None:
    """The lines computing the extern ``line`` (whose results ``items`` reads: index -> ``GetItem``)
    with the kernel ``name``, or None where the extern stays."""
    result, lse = items.get(0), items.get(1)
    if result is None or not isinstance(result.buf, Buffer) or attention_refusal(line) is not None:
        return None
    a = _bound(line)
    if lse is None:  # nothing reads it: the kernel writes it into a buffer of its own
        b, h, t, _ = _ints(a["query"].size)
        lse_buf = Buffer(f"{line.out}_lse", tuple(map(sympy.Integer, (b, h, t))),
                         tuple(map(sympy.Integer, (h * t, t, 1))), torch.float32, result.buf.device)
    elif isinstance(lse.buf, Buffer):
        lse_buf = lse.buf
    else:
        return None
    out_buf = result.buf
    out_strides, lse_strides = _ints(out_buf.stride), _ints(lse_buf.stride)
    if out_strides is None or lse_strides is None or len(out_strides) != 4 or out_strides[3] != 1:
        return None
    out_buf, lse_buf = _at_zero(out_buf), _at_zero(lse_buf)
    inputs = tuple(x for x in (a["query"], a["key"], a["value"], a["attn_mask"]) if x is not None)
    signature = (*(KernelArg(n, "input") for n in ("q", "k", "v", "mask")[:len(inputs)]),
                 KernelArg("out", "output"), KernelArg("lse", "output"))
    launch = CppLaunch(symbol=name, language="c++", pointers=len(signature), size_symbols=(), parallel="openmp")
    kernel = Kernel(name, attention_source(name, line, out_buf, lse_buf), "cpu", signature, launch,
                    loader=kernel_loader)
    return [Allocate(out_buf), Allocate(lse_buf), DefineKernel(kernel),
            CallKernel(kernel, (*inputs, out_buf, lse_buf), origins=line.origins)]


def _at_zero(buf):
    """``buf`` as a new allocation holds it: storage offset 0."""
    return buf if buf.offset == 0 else Buffer(buf.name, buf.size, buf.stride, buf.dtype, buf.device)
