"""The C++ helper prelude every CPU kernel starts with.

Kept as a Python string (not a ``.h`` file) so the rendered source is self-contained:
the cache key covers it, and ``fxwrap show`` prints exactly what was compiled.  Each
helper gives PyTorch's eager semantics for one op of the loop IR (``fx_floordiv`` is
``torch.div(rounding_mode="floor")``, ``fx_max`` propagates NaN, ...).
"""

from fxwrap.targets.c_helpers import render_helpers


class CPP:
    """The C++ dialect's helper spellings (``CppEmitter``'s attributes of the same names:
    tests/null/test_c_dialects.py checks they agree)."""
    prefix, overload, generic, out_arg, index_type = "fx_", "{f}", "{f}<{t}>", "{x}", "int64_t"
    out_param, helper_inline, math, helper_cast = "{t}& {x}", "static inline", "std::", "({t}){x}"


PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

// ---- 16-bit floating storage: loaded to float, computed in float, stored rounded ----
typedef uint16_t fx_bf16;
static inline float fx_bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t fx_float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static inline float fx_bf16_to_float(fx_bf16 b) { return fx_bits_to_float((uint32_t)b << 16); }
// float -> bf16 rounds to nearest, ties to even, on the float's bits (eager's conversion:
// subnormals kept, +-inf kept, a finite value past the largest bf16 becomes inf).  Both
// helpers work in 32-bit lanes with one float NaN test and one select of 32-bit values:
// `#pragma omp simd` loops then vectorize them with float-sized masks (a select of 16-bit
// values, or of a NaN constant, made gcc merge masks into 16-bit lanes and copy the code
// that follows into both arms of the select).  No vcvtneps2bf16 (AVX512_BF16): it flushes
// subnormal inputs to zero where eager keeps them, and gcc 12 does not vectorize it.
static inline fx_bf16 fx_float_to_bf16(float f) {
  // every NaN becomes the quiet NaN 0x7FC0
  const uint32_t u = fx_float_to_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (fx_bf16)(f != f ? 0x7FC0u : rounded);
}
// f rounded to bf16, held in a float (its low 16 bits zero); a NaN stays a NaN whose high
// half is one (quieted: its payload's top bit set), so fx_bf16_bits of the result is exact
static inline float fx_bf16_round(float f) {
  const uint32_t u = fx_float_to_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  return fx_bits_to_float(f != f ? (u | 0x00400000u) : rounded);
}
// the bf16 bits of a float that holds a bf16 value (a load, fx_bf16_round's result, a
// maximum/neg/where of them): its high half, no rounding
static inline fx_bf16 fx_bf16_bits(float f) { return (fx_bf16)(fx_float_to_bits(f) >> 16); }

#if defined(__FLT16_MAX__) && !defined(FX_SOFT_HALF)
typedef _Float16 fx_half;
static inline float fx_half_to_float(fx_half h) { return (float)h; }
static inline fx_half fx_float_to_half(float f) { return (fx_half)f; }
#else
typedef uint16_t fx_half;
static inline float fx_half_to_float(fx_half h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1Fu) return fx_bits_to_float(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return fx_bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
  // zero or subnormal: man * 2^-24, exact in float
  const float mag = (float)man * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}
static inline fx_half fx_float_to_half(float f) {
  const uint32_t u = fx_float_to_bits(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7FFFFFFFu;
  if (au > 0x7F800000u) return (fx_half)(sign | 0x7E00u);          // NaN
  if (au >= 0x477FF000u) return (fx_half)(sign | 0x7C00u);         // rounds to >= 65520: inf
  if (au < 0x38800000u) {                                           // below 2^-14: subnormal half
    // a float add rounds to nearest-even at the half's subnormal quantum 2^-24
    const float a = fx_bits_to_float(au) + 0.5f;                    // 0.5 = 2^23 * 2^-24
    return (fx_half)(sign | (uint16_t)(fx_float_to_bits(a) - 0x3F000000u));
  }
  const uint32_t odd = (au >> 13) & 1u;
  const uint32_t r = au + 0xFFFu + odd;                             // round away the low 13 bits
  return (fx_half)(sign | (uint16_t)((r - 0x38000000u) >> 13));     // rebias 127 -> 15
}
#endif
static inline float fx_half_round(float f) { return fx_half_to_float(fx_float_to_half(f)); }

// ---- integer index helpers (python semantics for negative operands) ----
""" + render_helpers(CPP, ('ifloordiv', 'imod', 'imax', 'imin', 'ipow_index')) + r"""
// A kernel whose vectorized loop stores interleaved lanes (CppEmitter.unrolled_lanes: RoPE's
// x1 * cos - x2 * sin, x1 * sin + x2 * cos side by side) opts out of SLP: gcc 12's SLP
// pattern for alternating sub/add lanes fuses the products into vfmaddsub even under
// -ffp-contract=off (1 ulp off eager; later releases test the flag).  The loop still
// vectorizes, through interleaved loads and stores.
// A kernel with masked loads (a read only where a condition holds: cat, padding) opts out of
// gcc's loop if-conversion: gcc 12.2 at -O3 for AVX-512 (-march=skylake-avx512 and newer)
// computed some lanes as 0 (cat([sin(x), 2 * sin(x)], 1) over (1, 3, 2): fuzz seed 701246).
// So does a kernel with unrolled lanes and a select: gcc 12.2 and 13.3 with AVX2 or AVX-512
// masked moves mixed up the lanes of ``o[3*i+j] = c ? 0 : b[3*i+j]`` over three interleaved
// lanes (relu's backward over a last dimension of 3: fuzz seed 920798).
#if defined(__GNUC__) && !defined(__clang__)
#define FX_NO_SLP __attribute__((optimize("no-tree-slp-vectorize")))
#define FX_NO_IFCVT __attribute__((optimize("no-tree-loop-if-convert")))
#define FX_NO_SLP_NO_IFCVT __attribute__((optimize("no-tree-slp-vectorize", "no-tree-loop-if-convert")))
#else
#define FX_NO_SLP
#define FX_NO_IFCVT
#define FX_NO_SLP_NO_IFCVT
#endif

// ---- value helpers: one per loop-IR op whose C spelling is not a plain operator ----
template <typename T> static inline constexpr bool fx_is_float() { return std::is_floating_point<T>::value; }
template <typename T> static inline bool fx_isnan(T x) {
  if constexpr (fx_is_float<T>()) return std::isnan(x); else return false;
}
template <typename T> static inline bool fx_isinf(T x) {
  if constexpr (fx_is_float<T>()) return std::isinf(x); else return false;
}
template <typename T> static inline bool fx_signbit(T x) {
  if constexpr (fx_is_float<T>()) return std::signbit(x);
  else if constexpr (std::is_signed<T>::value) return x < 0;
  else return false;
}
template <typename T> static inline T fx_abs(T x) {
  if constexpr (fx_is_float<T>()) return std::fabs(x);
  else if constexpr (std::is_signed<T>::value) return (T)(x < 0 ? -x : x);
  else return x;
}
template <typename T> static inline T fx_floor(T x) { if constexpr (fx_is_float<T>()) return std::floor(x); else return x; }
template <typename T> static inline T fx_ceil(T x) { if constexpr (fx_is_float<T>()) return std::ceil(x); else return x; }
template <typename T> static inline T fx_trunc(T x) { if constexpr (fx_is_float<T>()) return std::trunc(x); else return x; }
// half to even under the default rounding mode
template <typename T> static inline T fx_round(T x) { if constexpr (fx_is_float<T>()) return std::nearbyint(x); else return x; }
template <typename T> static inline T fx_sign(T x) { return (T)((T(0) < x) - (x < T(0))); }
template <typename T> static inline T fx_reciprocal(T x) { return T(1) / x; }
template <typename T> static inline T fx_rsqrt(T x) { return T(1) / std::sqrt(x); }
// a * b + c rounded once where the CPU has FMA (one instruction, and never less accurate
// than the two roundings of a * b + c, the form used without it): the Horner steps of the
// polynomials below.  -ffp-contract=off keeps the compiler from fusing anything else.
static inline float fx_fmaf(float a, float b, float c) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
// Clamps and range tests on a float's bits: an integer min or compare vectorizes to one
// instruction, where gcc turns a float compare-and-select (IEEE semantics, no -ffast-math)
// into a chain of mask operations that costs the polynomials below as much again.  As
// unsigned, a non-negative float's bits grow with its value (a NaN's above +inf's), a
// negative float's with its magnitude; as signed, every negative float is below every
// non-negative one.
static inline uint32_t fx_u32min(uint32_t a, uint32_t b) { return a < b ? a : b; }
static inline int32_t fx_i32min(int32_t a, int32_t b) { return a < b ? a : b; }
// the bits of x clamped to [lo, hi] for floats lo < 0 < hi (lo_bits, hi_bits their bits);
// a NaN becomes lo or hi (by its sign)
static inline uint32_t fx_clamp_bits(uint32_t x_bits, uint32_t lo_bits, uint32_t hi_bits) {
  return (uint32_t)fx_i32min((int32_t)fx_u32min(x_bits, lo_bits), (int32_t)hi_bits);
}
// e^x in float32, branch-free and inline so that `#pragma omp simd` loops vectorize it
// (std::exp is a libm call that gcc vectorizes only under -ffast-math).  Error under
// 1 ulp; overflow gives inf, underflow 0 (through the subnormals), NaN stays NaN.
static inline float fx_expf(float x) {
  // x clamped to [-104, 89] (NaN to either end: restored at the return) through fx_clamp_bits
  const float xs = fx_bits_to_float(fx_clamp_bits(fx_float_to_bits(x), __builtin_bit_cast(uint32_t, -104.0f),
                                                  __builtin_bit_cast(uint32_t, 89.0f)));
  // n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer (ties to even)
  const float n = (xs * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  // r = x - n * ln2 in two steps (Cody-Waite): n * 0.693359375f is exact
  float r = xs - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  // e^r on [-ln2/2, ln2/2]: 1 + r + r^2 * P(r), minimax coefficients; P(r) = P_lo(r) +
  // r^3 * P_hi(r), two chains of two steps instead of one of five (a shorter dependency
  // chain; P_hi's part is under 0.001 of P: the error stays under 1 ulp)
  const float r2 = r * r;
  float p_hi = 1.9875691500e-4f;
  p_hi = fx_fmaf(p_hi, r, 1.3981999507e-3f);
  p_hi = fx_fmaf(p_hi, r, 8.3334519073e-3f);
  float p_lo = 4.1665795894e-2f;
  p_lo = fx_fmaf(p_lo, r, 1.6666665459e-1f);
  p_lo = fx_fmaf(p_lo, r, 5.0000001201e-1f);
  float p = fx_fmaf(p_hi, r2 * r, p_lo);
  p = fx_fmaf(p, r2, r);
  p = p + 1.0f;
  // times 2^n as two normal powers of two (n in [-150, 128])
  const int32_t ni = (int32_t)n;
  const int32_t n1 = ni >> 1;
  const int32_t n2 = ni - n1;
  const float s1 = __builtin_bit_cast(float, (uint32_t)(n1 + 127) << 23);
  const float s2 = __builtin_bit_cast(float, (uint32_t)(n2 + 127) << 23);
  const float res = (p * s1) * s2;
  return x != x ? x : res;
}
template <typename T> static inline T fx_exp(T x) {
  if constexpr (std::is_same<T, float>::value) return fx_expf(x); else return std::exp(x);
}
template <typename T> static inline T fx_sigmoid(T x) { return T(1) / (T(1) + fx_exp(-x)); }
// tanh in float32, branch-free through fx_expf (vectorizes; std::tanh is a libm call):
// x + x^3 * P(x^2) for |x| < 0.55 (least-squares fit of the relative error, 3e-9 before
// rounding), 1 - 2 / (e^(2|x|) + 1) with x's sign beyond, |x| clamped at 10 (the float32
// result is +-1 from 9.011 on), NaN stays NaN
static inline float fx_tanhf(float x) {
  const uint32_t abs_bits = fx_float_to_bits(x) & 0x7FFFFFFFu;
  const float u = x * x;
  float p = -6.3564959e-03f;
  p = fx_fmaf(p, u, 2.1127241e-02f);
  p = fx_fmaf(p, u, -5.3865079e-02f);
  p = fx_fmaf(p, u, 1.3332699e-01f);
  p = fx_fmaf(p, u, -3.3333319e-01f);
  const float small = x * (1.0f + u * p);  // keeps the sign of -0
  const float e = fx_expf(2.0f * fx_bits_to_float(fx_u32min(abs_bits, __builtin_bit_cast(uint32_t, 10.0f))));
  const float big = std::copysign(1.0f - 2.0f / (e + 1.0f), x);
  // big for 0.55 <= |x| <= inf (one unsigned compare); small (NaN for a NaN x) otherwise
  constexpr uint32_t big_from = __builtin_bit_cast(uint32_t, 0.55f), inf_bits = 0x7F800000u;
  return abs_bits - big_from <= inf_bits - big_from ? big : small;
}
template <typename T> static inline T fx_tanh(T x) {
  if constexpr (std::is_same<T, float>::value) return fx_tanhf(x); else return std::tanh(x);
}
// erf in float32, branch-free (vectorizes): x * P(x^2) for |x| <= 1, a polynomial in
// |x| - 2.46 up to 3.92, +-1 beyond; least-squares fits, error under 2e-7 (eager's
// vectorized erf is itself an approximation of that order).  The degree-12 polynomial is
// two Horner chains of 6 and 7 terms joined by one v^6 product, not one chain of 13: the
// longest dependency chain in the loop halves (a vectorized loop of erf waits on it); the
// high part is at most 0.021 of q, so its rounding adds little: the worst error over the
// float line stays 1.47 ulp, as with one chain
static inline float fx_erff(float x) {
  const uint32_t abs_bits = fx_float_to_bits(x) & 0x7FFFFFFFu;
  constexpr uint32_t one_bits = __builtin_bit_cast(uint32_t, 1.0f), top_bits = __builtin_bit_cast(uint32_t, 3.92f);
  // |x| <= 1: x * P(x^2)
  const float u = x * x;
  float p = 7.847259e-05f;
  p = fx_fmaf(p, u, -8.008189e-04f);
  p = fx_fmaf(p, u, 5.188099e-03f);
  p = fx_fmaf(p, u, -2.6853692e-02f);
  p = fx_fmaf(p, u, 1.12835824e-01f);
  p = fx_fmaf(p, u, -3.7612626e-01f);
  p = fx_fmaf(p, u, 1.1283791e+00f);
  const float small = x * p;
  // 1 < |x| < 3.92: Q(|x| - 2.46) = Q_lo(v) + v^6 * Q_hi(v); beyond, erf(x) rounds to +-1
  const float v = fx_bits_to_float(fx_u32min(abs_bits, top_bits)) - 2.46f;
  const float v3 = v * v * v;
  const float v6 = v3 * v3;
  float q_hi = -9.166921e-06f;
  q_hi = fx_fmaf(q_hi, v, 2.5363142e-05f);
  q_hi = fx_fmaf(q_hi, v, 5.1896404e-05f);
  q_hi = fx_fmaf(q_hi, v, -3.0136696e-04f);
  q_hi = fx_fmaf(q_hi, v, 3.9067873e-04f);
  q_hi = fx_fmaf(q_hi, v, 4.615697e-04f);
  q_hi = fx_fmaf(q_hi, v, -2.963120e-03f);
  float q_lo = 6.7981537e-03f;
  q_lo = fx_fmaf(q_lo, v, -9.904965e-03f);
  q_lo = fx_fmaf(q_lo, v, 9.832828e-03f);
  q_lo = fx_fmaf(q_lo, v, -6.5357485e-03f);
  q_lo = fx_fmaf(q_lo, v, 2.6562088e-03f);
  q_lo = fx_fmaf(q_lo, v, 9.994967e-01f);
  const float q = fx_fmaf(q_hi, v6, q_lo);
  // q at most 1 (q > 0 where it is used), exactly 1 past 3.92
  const float q1 = fx_bits_to_float(abs_bits < top_bits ? fx_u32min(fx_float_to_bits(q), one_bits) : one_bits);
  const float big = std::copysign(q1, x);
  // big for 1 < |x| <= inf (one unsigned compare); small (NaN for a NaN x) otherwise
  constexpr uint32_t inf_bits = 0x7F800000u;
  return abs_bits - (one_bits + 1) <= inf_bits - (one_bits + 1) ? big : small;
}
template <typename T> static inline T fx_erf(T x) {
  if constexpr (std::is_same<T, float>::value) return fx_erff(x); else return std::erf(x);
}

// maximum/minimum and max/min reductions: NaN wins; otherwise std::max/std::min.
// One select (a NaN `a` fails `a < b` and stays): vectorizes to compare, compare, blend.
template <typename T> static inline T fx_max(T a, T b) { return (a < b || fx_isnan(b)) ? b : a; }
template <typename T> static inline T fx_min(T a, T b) { return (b < a || fx_isnan(b)) ? b : a; }

// division family. Integer division by zero gives 0 instead of trapping (eager raises).
template <typename T> static inline T fx_truncdiv(T a, T b) {
  if constexpr (fx_is_float<T>()) return std::trunc(a / b);
  else {
    if (b == 0) return 0;
    if constexpr (std::is_signed<T>::value) { if (b == T(-1)) return (T)(T(0) - a); }
    return (T)(a / b);
  }
}
template <typename T> static inline T fx_floordiv(T a, T b) {
  if constexpr (fx_is_float<T>()) {
    if (b == 0) return a / b;
    const T m = std::fmod(a, b);
    T d = (a - m) / b;                       // exact multiple of b, up to rounding
    if (m != 0 && ((b < 0) != (m < 0))) d -= T(1);
    if (d == 0) return std::copysign(T(0), a / b);
    T f = std::floor(d);
    if (d - f > T(0.5)) f += T(1);
    return f;
  } else {
    if (b == 0) return 0;
    if constexpr (std::is_signed<T>::value) {
      if (b == T(-1)) return (T)(T(0) - a);
      const T q = (T)(a / b);
      return (a % b != 0 && ((a < 0) != (b < 0))) ? (T)(q - 1) : q;
    } else {
      return (T)(a / b);
    }
  }
}
// bf16/fp16 floor division as eager's vectorized kernel does it: the float algorithm
// with every intermediate rounded to the 16-bit type (RND)
template <float (*RND)(float)> static inline float fx_floordiv16(float a, float b) {
  if (b == 0) return RND(a / b);
  const float m = std::fmod(a, b);           // exact, representable
  float d = RND(RND(a - m) / b);
  if (m != 0 && ((b < 0) != (m < 0))) d = RND(d - 1.0f);
  if (d == 0) return std::copysign(0.0f, RND(a / b));
  float f = std::floor(d);
  if (RND(d - f) > 0.5f) f = RND(f + 1.0f);
  return f;
}
template <typename T> static inline T fx_fmod(T a, T b) {
  if constexpr (fx_is_float<T>()) return std::fmod(a, b);
  else {
    if (b == 0) return 0;
    if constexpr (std::is_signed<T>::value) { if (b == T(-1)) return 0; }
    return (T)(a % b);
  }
}
// torch.remainder: the result takes the sign of the divisor
template <typename T> static inline T fx_mod(T a, T b) {
  if constexpr (fx_is_float<T>()) {
    T m = std::fmod(a, b);
    if (m != 0 && ((b < 0) != (m < 0))) m += b;
    return m;
  } else {
    if (b == 0) return 0;
    if constexpr (std::is_signed<T>::value) {
      if (b == T(-1)) return 0;
      const T r = (T)(a % b);
      return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
    } else {
      return (T)(a % b);
    }
  }
}
template <typename T> static inline T fx_pow(T base, T e) {
  if constexpr (fx_is_float<T>()) return std::pow(base, e);
  else if constexpr (std::is_same<T, bool>::value) return base || !e;
  else {
    if constexpr (std::is_signed<T>::value) {
      if (e < 0) {
        if (base == 1) return 1;
        if (base == -1) return (e & 1) ? (T)-1 : (T)1;
        return 0;
      }
    }
    T r = 1;
    while (e != 0) {
      if (e & 1) r = (T)(r * base);
      e = (T)(e >> 1);
      base = (T)(base * base);
    }
    return r;
  }
}
// shifts: an amount outside [0, bits) shifts everything out (sign fill for >>)
template <typename T> static inline T fx_lshift(T a, T b) {
  constexpr int64_t bits = sizeof(T) * 8;
  if ((int64_t)b < 0 || (int64_t)b >= bits) return 0;
  return (T)((typename std::make_unsigned<T>::type)a << b);
}
template <typename T> static inline T fx_rshift(T a, T b) {
  constexpr int64_t bits = sizeof(T) * 8;
  if ((int64_t)b < 0 || (int64_t)b >= bits) {
    if constexpr (std::is_signed<T>::value) return (T)(a < 0 ? -1 : 0); else return 0;
  }
  return (T)(a >> b);
}

// erfinv: an initial guess good to ~2e-3 (Winitzki's closed form), then Halley steps on
// erf(x) = y in double; near |y| = 1 the residual uses erfc so 1 - |y| stays exact.
""" + render_helpers(CPP, ('erfinv_d', 'erfinv')) + r"""
// ---- reductions: update with one value, combine two partial states ----
template <typename T> static inline T fx_lowest() {
  if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::lowest();
}
template <typename T> static inline T fx_highest() {
  if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::max();
}
""" + render_helpers(CPP, ('sum_upd', 'prod_upd', 'max_upd', 'min_upd')) + r"""// any/all into a bool state or a byte lane (0 or 1: the row reductions' lane arrays, which
// g++ 12 vectorizes beside float math only as bytes); | and & rather than || and &&: no branch
template <typename T, typename A> static inline void fx_any_upd(A& a, T v) { a = (A)(a | (A)(v != 0)); }
template <typename T, typename A> static inline void fx_all_upd(A& a, T v) { a = (A)(a & (A)(v != 0)); }
// argmax/argmin: does (vb, ib) beat (va, ia)?  The extreme wins, NaN is the most extreme,
// ties go to the lower index, an empty state (index < 0) always loses.
template <bool IsMax, typename T>
static inline bool fx_arg_better(T va, int64_t ia, T vb, int64_t ib) {
  if (ib < 0) return false;
  if (ia < 0) return true;
  const bool na = fx_isnan(va), nb = fx_isnan(vb);
  if (na || nb) return (na && nb) ? ib < ia : nb;
  if (IsMax ? (va < vb) : (vb < va)) return true;
  return va == vb && ib < ia;
}
template <typename T> static inline void fx_argmax_upd(T& va, int64_t& ia, T v, int64_t i) {
  if (fx_arg_better<true>(va, ia, v, i)) { va = v; ia = i; }
}
template <typename T> static inline void fx_argmin_upd(T& va, int64_t& ia, T v, int64_t i) {
  if (fx_arg_better<false>(va, ia, v, i)) { va = v; ia = i; }
}
// ---- scans: the running state after one more element (eager's CPU kernels' rules) ----
// logcumsumexp: log(exp(a) + exp(v)); NaN propagates, -inf/-inf and inf/inf stay as they are
""" + render_helpers(CPP, ('logcumsumexp_upd',)) + r"""// cummax/cummin: a NaN always takes over, ties go to the later index
""" + render_helpers(CPP, ('cummax_upd', 'cummin_upd')) + r"""// cummax/cummin of two parts of a row in either order (a split scan's lanes): the state
// after both is a NaN if either has one, else the extreme; a tie (NaN or value) takes the
// later index, as one pass over the row would
template <bool IsMax, typename T>
static inline void fx_cumextreme_merge(T& va, int64_t& ia, T vb, int64_t ib) {
  const bool na = fx_isnan(va), nb = fx_isnan(vb);
  const bool b_wins = (na || nb) ? (nb && (!na || ib > ia))
                                 : ((IsMax ? va < vb : vb < va) || (va == vb && ib > ia));
  if (b_wins) { va = vb; ia = ib; }
}
""" + render_helpers(CPP, ('welford_upd', 'welford_cmb'))
