"""The CPU target's GEMM template: ``mm`` / ``addmm`` / ``bmm`` (and ``linear``, which is
``addmm`` over a transposed weight view) in float32 and bfloat16, with the scheduler's
epilogue applied to each register tile before it is stored.

The kernel (``CppGemm.render``), for ``C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]``:

* **cache blocking**: the ``n`` range is cut into ``NC``-wide column blocks and ``k``
  into ``KC``-deep slices; for each (block, slice) the ``B`` panel is *packed* into a
  contiguous buffer on the task's stack (``NR`` columns side by side per ``k``; for
  bfloat16 two ``k`` interleaved per column, the layout ``_mm512_dpbf16_ps`` reads),
  whatever ``B``'s strides (a transposed weight is packed like a row-major one);
* **micro-kernel**: an ``MR x NR`` register tile (float32 accumulators, ``NR / 16`` AVX-512
  vectors per row through GCC vector extensions; the AVX-512-BF16 dot product for
  bfloat16 where the compiler targets it, ``-march=native``), ``A`` read in place (one
  broadcast per row and ``k``) through its strides;
* **OpenMP** over (batch, column block, row tile) tasks, one task per thread chunk, a
  static schedule: results never depend on the thread count (each output element is
  one ordered sum over ``k``);
* **epilogue**: once a tile's sum over ``k`` is complete, the fused stores run over it
  (``CStyleEmitter.template_epilogue``: bias, activation, residual add, casts to
  bfloat16), reading ``template_out`` from the tile, then the tile is gone.

The bfloat16 path converts nothing before the product: ``A`` and ``B`` are bfloat16,
products and sums float32 (as oneDNN's), the epilogue rounds once where the graph does.
"""
from __future__ import annotations

import os

import torch

from fxwrap.core.errors import EmitError
from fxwrap.core.templates import Template, TemplateCall
from fxwrap.targets.base import KernelSource
from fxwrap.targets.cstyle import LocalNames, Scope, append_block

aten = torch.ops.aten

GEMM_HELPERS = r"""
// ---- cpp_gemm: packed-panel GEMM micro-kernels (fxwrap.targets.cpu_cpp.gemm) ----
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
typedef float fx_v16f __attribute__((vector_size(64)));
typedef float fx_v16f_u __attribute__((vector_size(64), aligned(4)));
static inline float fx_gemm_float(float v) { return v; }
static inline float fx_gemm_float(fx_bf16 v) { return fx_bf16_to_float(v); }

#if defined(__AVX512F__)
// dst[u * dst_ld + r] = src[r * src_ld + u] for 16 rows r and 16 32-bit units u (src_ld in bytes):
// a 16 x 16 transpose in registers (unpack 32, unpack 64, two 128-bit lane shuffles)
static inline void fx_gemm_transpose16(const char* __restrict__ src, int64_t src_ld, uint32_t* __restrict__ dst,
                                       int64_t dst_ld) {
  __m512i r[16], t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512((const void*)(src + i * src_ld));
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {  // r[4g + j]: lane L holds unit 4L + j of rows 4g .. 4g + 3
    r[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i u0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44), u1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
    const __m512i v0 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
    _mm512_storeu_si512((void*)(dst + (0 + j) * dst_ld), _mm512_shuffle_i32x4(u0, v0, 0x88));
    _mm512_storeu_si512((void*)(dst + (4 + j) * dst_ld), _mm512_shuffle_i32x4(u0, v0, 0xDD));
    _mm512_storeu_si512((void*)(dst + (8 + j) * dst_ld), _mm512_shuffle_i32x4(u1, v1, 0x88));
    _mm512_storeu_si512((void*)(dst + (12 + j) * dst_ld), _mm512_shuffle_i32x4(u1, v1, 0xDD));
  }
}
#define FX_GEMM_TRANSPOSE 1
#endif

// Bp[k][NV*16] <- B[k0 + k, n0 + n] (zero past nc): one float panel, whatever B's strides
template <int NV, typename TB>
static inline void fx_gemm_pack_f32(const TB* __restrict__ B, int64_t sbk, int64_t sbn, int64_t kc, int64_t nc,
                                    float* __restrict__ Bp) {
  constexpr int NR = NV * 16;
#if defined(FX_GEMM_TRANSPOSE)
  if (std::is_same<TB, float>::value && sbk == 1 && nc == NR && kc >= 16) {  // a transposed weight
    const int64_t full = kc / 16 * 16;
    for (int64_t k = 0; k < full; k += 16)
#pragma GCC unroll 4
      for (int s = 0; s < NV; ++s)
        fx_gemm_transpose16((const char*)(B + s * 16 * sbn + k), sbn * 4, (uint32_t*)Bp + k * NR + s * 16, NR);
    for (int64_t n = 0; n < NR; ++n)
      for (int64_t k = full; k < kc; ++k) Bp[k * NR + n] = fx_gemm_float(B[k + n * sbn]);
    return;
  }
#endif
  if (sbn == 1 && nc == NR) {
    for (int64_t k = 0; k < kc; ++k)
      for (int n = 0; n < NR; ++n) Bp[k * NR + n] = fx_gemm_float(B[k * sbk + n]);
    return;
  }
  for (int64_t n = 0; n < NR; ++n) {
    if (n < nc) {
      for (int64_t k = 0; k < kc; ++k) Bp[k * NR + n] = fx_gemm_float(B[k * sbk + n * sbn]);
    } else {
      for (int64_t k = 0; k < kc; ++k) Bp[k * NR + n] = 0.0f;
    }
  }
}

// C[MR][NV*16] (+)= A[MR rows, kc] * Bp: float32 products and sums, in k order
template <int MR, int NV, bool AK1, typename TA>
static inline void fx_gemm_tile_f32(const TA* __restrict__ A, int64_t sam, int64_t sak, const float* __restrict__ Bp,
                                    int64_t kc, int mc, bool accumulate, float* __restrict__ C) {
  if (AK1) sak = 1;
  constexpr int NR = NV * 16;
  fx_v16f acc[MR][NV];
  const TA* rows[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    rows[i] = A + (i < mc ? i : mc - 1) * sam;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      acc[i][v] = accumulate ? *(const fx_v16f*)(C + i * NR + v * 16) : (fx_v16f){};
  }
  for (int64_t k = 0; k < kc; ++k) {
    fx_v16f b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = *(const fx_v16f*)(Bp + k * NR + v * 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const float a = fx_gemm_float(rows[i][k * sak]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] += b[v] * a;
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) *(fx_v16f*)(C + i * NR + v * 16) = acc[i][v];
}

#if defined(__AVX512BF16__)
#define FX_GEMM_BF16_DOT 1
// Bp[p][n][2] <- (B[k0 + 2p, n0 + n], B[k0 + 2p + 1, n0 + n]) (zero past nc and past kc):
// the pair layout _mm512_dpbf16_ps reads
template <int NV>
static inline void fx_gemm_pack_bf16(const fx_bf16* __restrict__ B, int64_t sbk, int64_t sbn, int64_t kc,
                                     int64_t nc, fx_bf16* __restrict__ Bp) {
  constexpr int NR = NV * 16;
  const int64_t pairs = (kc + 1) / 2;
#if defined(FX_GEMM_TRANSPOSE)
  if (sbk == 1 && nc == NR && kc >= 32) {  // a transposed weight: k pairs are 32-bit units of its rows
    const int64_t full = kc / 32 * 16;   // pairs in whole 16-pair blocks
    for (int64_t p = 0; p < full; p += 16)
#pragma GCC unroll 4
      for (int s = 0; s < NV; ++s)
        fx_gemm_transpose16((const char*)(B + s * 16 * sbn + 2 * p), sbn * 2, (uint32_t*)Bp + p * NR + s * 16, NR);
    for (int64_t n = 0; n < NR; ++n)
      for (int64_t p = full; p < pairs; ++p) {
        const int64_t k = 2 * p;
        Bp[(p * NR + n) * 2] = B[k + n * sbn];
        Bp[(p * NR + n) * 2 + 1] = k + 1 < kc ? B[k + 1 + n * sbn] : (fx_bf16)0;
      }
    return;
  }
#endif
  for (int64_t n = 0; n < NR; ++n) {
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t k = 2 * p;
      const bool in = n < nc;
      Bp[(p * NR + n) * 2] = in ? B[k * sbk + n * sbn] : (fx_bf16)0;
      Bp[(p * NR + n) * 2 + 1] = (in && k + 1 < kc) ? B[(k + 1) * sbk + n * sbn] : (fx_bf16)0;
    }
  }
}

template <int MR, int NV, bool AK1>
static inline void fx_gemm_tile_bf16(const fx_bf16* __restrict__ A, int64_t sam, int64_t sak,
                                     const fx_bf16* __restrict__ Bp, int64_t kc, int mc, bool accumulate,
                                     float* __restrict__ C) {
  if (AK1) sak = 1;
  constexpr int NR = NV * 16;
  __m512 acc[MR][NV];
  const fx_bf16* rows[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    rows[i] = A + (i < mc ? i : mc - 1) * sam;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = accumulate ? _mm512_loadu_ps(C + i * NR + v * 16) : _mm512_setzero_ps();
  }
  const int64_t pairs = kc / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512((const void*)(Bp + (p * NR + v * 16) * 2));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      uint32_t pair;
      if (AK1) std::memcpy(&pair, rows[i] + 2 * p, 4);  // the two k of one row: one 32-bit load
      else pair = (uint32_t)rows[i][2 * p * sak] | ((uint32_t)rows[i][(2 * p + 1) * sak] << 16);
      const __m512bh a = (__m512bh)_mm512_set1_epi32((int)pair);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
    }
  }
  if (kc & 1) {  // the last k alone: its pair's second half is zero in A and in Bp
    __m512bh b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512((const void*)(Bp + (pairs * NR + v * 16) * 2));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32((int)(uint32_t)rows[i][(kc - 1) * sak]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + i * NR + v * 16, acc[i][v]);
}
#endif
"""


class CppGemm(Template):
    """``mm``/``addmm``/``bmm`` on float32 or bfloat16 CPU tensors, any strides.

    ``CppGemm().render(kernel, emitter)`` -> a ``KernelSource`` of one ``extern "C"``
    function with the kernel's usual signature (the call's operands first)::

        extern "C" void fxwrap_template_0(const float* __restrict__ in_ptr0,   // A
                                          const float* __restrict__ in_ptr1,   // B
                                          const float* __restrict__ in_ptr2,   // bias
                                          float* __restrict__ out_ptr0)
        ...  pack B panel; for each MR x NR tile: acc = sum_k A*B; epilogue(acc) -> out_ptr0
    """

    name = "cpp_gemm"
    ops = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default})
    MR = int(os.environ.get("FXWRAP_GEMM_MR", 8))     # rows of a register tile
    NR = int(os.environ.get("FXWRAP_GEMM_NR", 32))    # columns of a register tile and of a packed B panel
    MC = int(os.environ.get("FXWRAP_GEMM_MC", 256))   # rows of a task (its tiles share one packed panel)
    KC = int(os.environ.get("FXWRAP_GEMM_KC", 512))   # depth of a packed panel (KC * NR * 4 bytes on the stack)

    def refusal(self, call: TemplateCall) -> str | None:
        if call.dtype not in (torch.float32, torch.bfloat16):
            return f"{call.dtype} operands (cpp_gemm computes float32 and bfloat16)"
        if call.output.device.type != "cpu":
            return f"operands on {call.output.device}"
        if any(h == 0 for _, h in call.hints):
            return "an empty product"
        return None

    # ------------------------------------------------------------------ render
    def render(self, kernel, emitter) -> KernelSource:
        call = kernel.template
        if call is None:
            raise EmitError(f"kernel {kernel.name} has no template call (template {self.name})")
        names = LocalNames()
        fn = Scope(emitter, names, None, kernel=kernel)
        a, b = call.operands
        it = emitter.index_type
        bf16 = call.dtype == torch.bfloat16
        idx = emitter.render_index
        batched = len(call.index) == 3
        a_stride = [idx(s) for s in a.stride]
        b_stride = [idx(s) for s in b.stride]
        if not batched:
            a_stride = ["0", *a_stride]
            b_stride = ["0", *b_stride]
        sizes = {k: idx(v) for k, v in call.sizes}
        vars_ = [v.name for v in call.index]
        mvar, nvar = vars_[-2], vars_[-1]
        bvar = vars_[0] if batched else None

        tile = Scope(emitter, names, fn, declares=[bvar] if bvar else [], kernel=kernel)
        epilogue = emitter.template_epilogue(kernel, tile, "Cpart[i * NR + j]")
        MR, NV, MC, KC = self.MR, self.NR // 16, self.MC, self.KC
        stype = "fx_bf16" if bf16 else "float"
        body = [
            f"constexpr int MR = {MR}, NV = {NV}, NR = {NV * 16}, MC = {MC}, KC = {KC};",
            f"const {it} M = {sizes['m']};", f"const {it} N = {sizes['n']};", f"const {it} K = {sizes['k']};",
            f"const {it} NB = {sizes['batch']};",
            f"const {it} sab = {a_stride[0]}, sam = {a_stride[1]}, sak = {a_stride[2]};",
            f"const {it} sbb = {b_stride[0]}, sbk = {b_stride[1]}, sbn = {b_stride[2]};",
            f"const {it} npanels = (N + NR - 1) / NR;",
            f"const {it} mgroups = (M + MC - 1) / MC;",
            f"const {it} tasks = NB * npanels * mgroups;",
        ]
        task = [f"const {it} mg = task % mgroups;",
                f"const {it} np = (task / mgroups) % npanels;",
                f"const {it} bi = task / (mgroups * npanels);",
                f"const {it} m_start = mg * MC;",
                f"const {it} mrows = fx_imin(MC, M - m_start);",
                f"const {it} n0 = np * NR;",
                f"const {it} nc = fx_imin(NR, N - n0);",
                "alignas(64) float Cpart[MC * NR];  // the task's sums: MC * NR * 4 bytes on its stack",
                "if (K == 0) for (int q = 0; q < MC * NR; ++q) Cpart[q] = 0.0f;",
                f"const {stype}* const Ab = in_ptr0 + bi * sab + m_start * sam;",
                f"const {stype}* const Bb = in_ptr1 + bi * sbb + n0 * sbn;"]
        if bvar:
            task.append(f"const {it} {bvar} = bi;")

        def kloop(pack_type: str, pack: str, tile_fn: str) -> list[str]:
            lines = [f"alignas(64) {pack_type} Bp[KC * NR];"]
            inner = [f"const {it} kc = fx_imin((int64_t)KC, K - kc0);",
                     f"{pack}(Bb + kc0 * sbk, sbk, sbn, kc, nc, Bp);",
                     f"for ({it} mt = 0; mt < mrows; mt += MR) {{",
                     "  const int mc = (int)fx_imin(MR, mrows - mt);",
                     f"  if (sak == 1) {tile_fn}, true>(Ab + mt * sam + kc0, sam, 1, Bp, kc, mc, kc0 > 0, Cpart + mt * NR);",
                     f"  else {tile_fn}, false>(Ab + mt * sam + kc0 * sak, sam, sak, Bp, kc, mc, kc0 > 0, "
                     "Cpart + mt * NR);",
                     "}"]
            append_block(lines, f"for ({it} kc0 = 0; kc0 < K; kc0 += KC)", inner)
            return lines

        f32 = kloop("float", "fx_gemm_pack_f32<NV>", "fx_gemm_tile_f32<MR, NV")
        if bf16:
            task.append("#if defined(FX_GEMM_BF16_DOT)")
            task += kloop("fx_bf16", "fx_gemm_pack_bf16<NV>", "fx_gemm_tile_bf16<MR, NV")
            task.append("#else")
            task += f32
            task.append("#endif")
        else:
            task += f32
        tile.flush_into(task)
        ep = [f"const {it} {mvar} = m_start + i;", f"const {it} {nvar} = n0 + j;", *epilogue]
        ep_loop: list[str] = ["#pragma omp simd"]
        append_block(ep_loop, f"for ({it} j = 0; j < nc; ++j)", ep)
        append_block(task, f"for ({it} i = 0; i < mrows; ++i)", ep_loop)
        body.append("#pragma omp parallel for schedule(static) if (tasks > 1 && M * N * K >= 262144)")
        append_block(body, f"for ({it} task = 0; task < tasks; ++task)", task)
        return emitter.template_source(kernel, fn.lines + body, GEMM_HELPERS)
