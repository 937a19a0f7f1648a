"""The C++ of the CPU target's row-dot products: ``sum_k x[m, k] * w[n, k]`` where both
operands are read along their rows (``k`` contiguous), the weight in an ``nn.Linear``'s own
``[N, K]`` layout: nothing is packed, each weight byte is read once per block of ``x`` rows.
It is the kernel of few-row products (a decode step's ``[1, K] @ w.T``: memory bound, the
weights stream from memory once) for the one-row GEMM template (``gemv.CppGemv``: float32
and bfloat16 weights) and the int8 weight-only template's FMA path (``int8_gemm_source``).

``ROWDOT_SOURCE`` defines one entry point, a function template over the epilogue::

    template <typename T, typename W, typename Epilogue>  // T, W: float, uint16_t (bf16), W: int8_t
    void fx_rowdot(const T* x, int64_t ldx, const W* w, int64_t ldw,
                   int64_t M, int64_t N, int64_t K, Epilogue&& ep);

which calls ``ep(m, n, sum)`` once for each output element, ``sum`` the float32 ``sum_k x[m, k]
* w[n, k]``: 16 lanes along ``k`` (fp32 FMA: each bf16 or int8 operand is exact in fp32), the
lanes added at the end (``_mm512_reduce_add_ps``); a tail of ``k`` under a mask.

The micro-kernel keeps ``MB x NB`` accumulators (``MB`` rows of ``x``, ``NB`` rows of ``w``);
OpenMP splits the output channels into blocks of ``NB`` (static schedule).  Each output's sum
is the same whatever the thread count.  AVX-512 F + BW (the templates refuse other CPUs).
"""

ROWDOT_SOURCE = r"""
#include <immintrin.h>

namespace fx_rowdot_impl {

// 16 values along k as fp32 (bf16 and int8 exactly), unmasked and under a mask
static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
static inline __m512 bf16_lanes(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m512 load16(const uint16_t* p) { return bf16_lanes(_mm256_loadu_si256((const __m256i*)p)); }
static inline __m512 load16(const uint16_t* p, __mmask16 m) { return bf16_lanes(_mm256_maskz_loadu_epi16(m, p)); }
static inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
static inline __m512 load16(const int8_t* p, __mmask16 m) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

// out[i][j] = sum_k x[i, k] * w[j, k]: MB rows of x, NB rows of w, fp32 FMA in 16 lanes
template <int MB, int NB, typename T, typename W>
static inline void dot(const T* x, int64_t ldx, const W* w, int64_t ldw, int64_t K, float (&out)[MB][NB]) {
  __m512 acc[MB][NB];
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) wv[j] = load16(w + j * ldw + k);
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) {
      const __m512 xv = load16(x + i * ldx + k);
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    const __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
    __m512 wv[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) wv[j] = load16(w + j * ldw + k, m);
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) {
      const __m512 xv = load16(x + i * ldx + k, m);
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

// the MB x nb block at (m0, n0) through the epilogue
template <int MB, int NB, typename Epilogue>
static inline void emit_block(const float (&acc)[MB][NB], int64_t m0, int64_t n0, int64_t nb, Epilogue& ep) {
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < nb; ++j) ep(m0 + i, n0 + j, acc[i][j]);
}

// rows [n0, n0 + nb) of w, nb <= NB (a short last block goes one row at a time), every row of x
template <int NB, typename T, typename W, typename Epilogue>
static inline void channels(const T* x, int64_t ldx, const W* w, int64_t ldw, int64_t M, int64_t K,
                            int64_t n0, int64_t nb, Epilogue& ep) {
  if constexpr (NB > 1) {
    if (nb != NB) {
      for (int64_t j = 0; j < nb; ++j) channels<1>(x, ldx, w, ldw, M, K, n0 + j, 1, ep);
      return;
    }
  }
  constexpr int MB = NB >= 8 ? 2 : 4;
  const W* wb = w + n0 * ldw;
  int64_t m = 0;
  for (; m + MB <= M; m += MB) {
    float acc[MB][NB];
    dot<MB, NB>(x + m * ldx, ldx, wb, ldw, K, acc);
    emit_block<MB, NB>(acc, m, n0, NB, ep);
  }
  for (; m < M; ++m) {
    float acc[1][NB];
    dot<1, NB>(x + m * ldx, ldx, wb, ldw, K, acc);
    emit_block<1, NB>(acc, m, n0, NB, ep);
  }
}

}  // namespace fx_rowdot_impl

template <typename T, typename W, typename Epilogue>
static void fx_rowdot(const T* x, int64_t ldx, const W* w, int64_t ldw, int64_t M, int64_t N, int64_t K,
                      Epilogue&& ep) {
  using namespace fx_rowdot_impl;
  if (M <= 0 || N <= 0) return;
  constexpr int NB = 8;
  const int64_t blocks = (N + NB - 1) / NB;
  const bool parallel = blocks > 1 && M * N * K >= (int64_t)1 << 16;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n0 = b * NB;
    const int64_t nb = N - n0 < NB ? N - n0 : NB;
    channels<NB>(x, ldx, w, ldw, M, K, n0, nb, ep);
  }
}
"""
