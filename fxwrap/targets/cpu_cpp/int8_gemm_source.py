"""The C++ of the CPU target's int8 weight-only GEMM (``aten._weight_int8pack_mm``).

``out[m, n] = (sum_k x[m, k] * w[n, k]) * scales[n]`` with ``x`` ``[M, K]`` bf16 or fp32,
``w`` ``[N, K]`` int8 (row-major: each output channel's weights contiguous in ``k``, the
layout the ATen op takes, read as it is: no packed copy) and ``scales`` ``[N]`` of
``x``'s dtype.  The sum is in fp32; the int8 weights are dequantized in registers.

``INT8_GEMM_SOURCE`` defines one entry point, a function template over the epilogue::

    template <typename T, typename Epilogue>   // T: float, or uint16_t holding bf16
    void fx_int8mm(const T* x, int64_t ldx, const int8_t* w, int64_t ldw,
                   int64_t M, int64_t N, int64_t K, Epilogue&& ep);

which calls ``ep(m, n, sum)`` once for each output element, ``sum`` the fp32
``sum_k x[m, k] * w[n, k]`` (the template's accumulator, ``template_out``); the rendered
kernel's ``ep`` is the epilogue: the scale (``* scales[n]``, a load of the epilogue, as
every other fused op), the rounding to the output dtype, the ops fused after it, the store.

Two micro-kernels (both AVX-512; the template refuses a CPU without avx512f/bw):

* ``fma``: the row-dot products of ``rowdot_source`` (``fx_rowdot``, shared with the few-row
  float GEMM): ``x`` rows times ``w`` rows along ``k``, 16 lanes at a time: 16 int8 ->
  int32 -> fp32 (``vpmovsxbd`` + ``vcvtdq2ps``), one fp32 FMA per (row of x, row of w);
  ``MB x NB`` accumulators, reduced across lanes at the end.  Used for fp32 ``x``, and for
  bf16 ``x`` at small batch (memory bound: each weight byte is read once and converted
  once per block of ``MB`` rows of ``x``).
* ``bf16 dot`` (CPUs with avx512_bf16): a thread converts the ``NB`` weight rows of its
  block of output channels to bf16 once (exact: every int8 is a bf16) into a panel on
  its stack, then ``vdpbf16ps`` (32 products per instruction, exact in fp32, summed in
  fp32) over all rows of ``x``: batch 32 is compute bound and the conversion is paid
  once per weight instead of once per block of ``x`` rows.  ``vdpbf16ps`` treats bf16
  subnormal inputs (|x| < 1.2e-38) as zero; their products are below fp32's normal range.

OpenMP splits the output channels into blocks of ``NB`` (static schedule, one weight
block per task: the weights stream from memory once, whatever the batch).  Results do
not depend on the thread count.
"""

from fxwrap.targets.cpu_cpp.rowdot_source import ROWDOT_SOURCE

INT8_GEMM_SOURCE = ROWDOT_SOURCE + r"""
namespace fx_int8mm_impl {

using fx_rowdot_impl::emit_block;

#if defined(__AVX512BF16__)
// 32 int8 -> 32 bf16 (exact), in k order
static inline __m512i w32_bf16(const int8_t* p) {
  const __m256i b = _mm256_loadu_si256((const __m256i*)p);
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// acc[i][j] = sum_k x[i, k] * panel[j, k]: bf16 x, bf16 weights (a converted panel,
// rows of kp elements, kp a multiple of 32 and zero past K), vdpbf16ps
template <int MB, int NB>
static inline void dot_bf16(const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t kp,
                            int64_t K, float (&out)[MB][NB]) {
  __m512 acc[MB][NB];
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512i wv[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_load_si512((const void*)(panel + j * kp + k));
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) {
      const __m512i xv = _mm512_loadu_si512((const void*)(x + i * ldx + k));
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j)
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv, (__m512bh)wv[j]);
    }
  }
  if (k < K) {
    const __mmask32 m = (__mmask32)((1ull << (K - k)) - 1ull);
    __m512i wv[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_load_si512((const void*)(panel + j * kp + k));
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) {
      const __m512i xv = _mm512_maskz_loadu_epi16(m, x + i * ldx + k);
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j)
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv, (__m512bh)wv[j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}
#endif

#if defined(__AVX512BF16__)
constexpr int PANEL_NB = 4;            // weight rows per panel
constexpr int64_t PANEL_KMAX = 16384;  // panel row capacity (bf16 elements): 128 KiB of stack

template <typename Epilogue>
static inline void channels_bf16(const uint16_t* x, int64_t ldx, const int8_t* w, int64_t ldw,
                                 int64_t M, int64_t K, int64_t n0, int64_t nb,
                                 Epilogue& ep) {
  alignas(64) uint16_t panel[PANEL_NB * PANEL_KMAX];
  const int64_t kp = (K + 31) / 32 * 32;
  for (int j = 0; j < PANEL_NB; ++j) {
    uint16_t* row = panel + j * kp;
    if (j >= nb) { std::memset(row, 0, kp * 2); continue; }
    const int8_t* src = w + (n0 + j) * ldw;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) _mm512_store_si512((void*)(row + k), w32_bf16(src + k));
    for (; k < kp; ++k) {
      const float f = k < K ? (float)src[k] : 0.0f;
      uint32_t u; __builtin_memcpy(&u, &f, 4);
      row[k] = (uint16_t)(u >> 16);  // small integers: exact, no rounding
    }
  }
  constexpr int MB = 6;
  int64_t m = 0;
  for (; m + MB <= M; m += MB) {
    float acc[MB][PANEL_NB];
    dot_bf16<MB, PANEL_NB>(x + m * ldx, ldx, panel, kp, K, acc);
    emit_block<MB, PANEL_NB>(acc, m, n0, nb, ep);
  }
  for (; m + 2 <= M; m += 2) {
    float acc[2][PANEL_NB];
    dot_bf16<2, PANEL_NB>(x + m * ldx, ldx, panel, kp, K, acc);
    emit_block<2, PANEL_NB>(acc, m, n0, nb, ep);
  }
  for (; m < M; ++m) {
    float acc[1][PANEL_NB];
    dot_bf16<1, PANEL_NB>(x + m * ldx, ldx, panel, kp, K, acc);
    emit_block<1, PANEL_NB>(acc, m, n0, nb, ep);
  }
}
#endif

constexpr int64_t BF16_DOT_MIN_M = 4;  // below: memory bound, the fma kernel converts less

}  // namespace fx_int8mm_impl

template <typename T, typename Epilogue>
static void fx_int8mm(const T* x, int64_t ldx, const int8_t* w, int64_t ldw, int64_t M, int64_t N, int64_t K, Epilogue&& ep) {
  using namespace fx_int8mm_impl;
  if (M <= 0 || N <= 0) return;
#if defined(__AVX512BF16__)
  if constexpr (std::is_same<T, uint16_t>::value) {
    if (M >= BF16_DOT_MIN_M && K <= PANEL_KMAX) {
      const int64_t blocks = (N + PANEL_NB - 1) / PANEL_NB;
#pragma omp parallel for schedule(static) if (blocks > 1)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n0 = b * PANEL_NB;
        const int64_t nb = N - n0 < PANEL_NB ? N - n0 : PANEL_NB;
        channels_bf16(x, ldx, w, ldw, M, K, n0, nb, ep);
      }
      return;
    }
  }
#endif
  fx_rowdot(x, ldx, w, ldw, M, N, K, ep);
}
"""
