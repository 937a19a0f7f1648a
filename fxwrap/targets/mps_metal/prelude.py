"""The Metal helper prelude every emitted kernel starts with.

Written in the subset of the Metal Shading Language that is also C++17 once
``shim/fxwrap_metal_shim.h`` maps the Metal names away, so the same text runs on
an Apple GPU (``torch.mps.compile_shader``) and on the CPU through the shim.  No
``if constexpr``, no function pointers, no ``metal::numeric_limits``: integer and
float variants are overloads, and type facts are small traits.  Each ``fx_*``
helper gives PyTorch's eager semantics for one loop-IR op (``fx_max`` propagates
NaN, ``fx_floordiv`` is ``torch.div(rounding_mode="floor")``, ...).  Metal has no
``erf``/``erfc``/``erfinv``/``expm1``/``log1p``: they are written out here.
"""

from fxwrap.targets.c_helpers import render_helpers


class METAL:
    """The Metal dialect's helper spellings (``MetalEmitter``'s attributes of the same names:
    tests/null/test_c_dialects.py checks they agree)."""
    prefix, overload, generic, out_arg, index_type = "fx_", "{f}", "{f}<{t}>", "{x}", "long"
    out_param, helper_inline, math, helper_cast = "thread {t}& {x}", "inline", "metal::", "{t}({x})"


PRELUDE = r"""
#include <metal_stdlib>
using namespace metal;

// ---- type facts -------------------------------------------------------------
template <typename T> struct fx_unsigned { enum { value = 0 }; };
template <> struct fx_unsigned<uchar> { enum { value = 1 }; };
template <> struct fx_unsigned<bool> { enum { value = 1 }; };

// ---- 16-bit floats: computed in float, rounded to their precision -----------
inline float fx_half_round(float x) { return float(half(x)); }
inline float fx_bf16_round(float x) { return float(bfloat(x)); }
inline float fx_round16(float x, int is_bf16) { return is_bf16 ? fx_bf16_round(x) : fx_half_round(x); }

// ---- integer index helpers (python semantics for negative operands) ----------
""" + render_helpers(METAL, ('ifloordiv', 'imod', 'imax', 'imin', 'ipow_index')) + r"""
// ---- classification ----------------------------------------------------------
template <typename T> inline bool fx_isnan(T x) { return false; }
inline bool fx_isnan(float x) { return metal::isnan(x); }
template <typename T> inline bool fx_isinf(T x) { return false; }
inline bool fx_isinf(float x) { return metal::isinf(x); }
template <typename T> inline bool fx_signbit(T x) { return !fx_unsigned<T>::value && x < T(0); }
inline bool fx_signbit(float x) { return metal::signbit(x); }

// ---- unary -------------------------------------------------------------------
template <typename T> inline T fx_abs(T x) { return (!fx_unsigned<T>::value && x < T(0)) ? T(T(0) - x) : x; }
inline float fx_abs(float x) { return metal::fabs(x); }
template <typename T> inline T fx_floor(T x) { return x; }
inline float fx_floor(float x) { return metal::floor(x); }
template <typename T> inline T fx_ceil(T x) { return x; }
inline float fx_ceil(float x) { return metal::ceil(x); }
template <typename T> inline T fx_trunc(T x) { return x; }
inline float fx_trunc(float x) { return metal::trunc(x); }
// torch.round is half to even: metal::rint, not metal::round (half away from zero)
template <typename T> inline T fx_round(T x) { return x; }
inline float fx_round(float x) { return metal::rint(x); }
template <typename T> inline T fx_sign(T x) { return T((T(0) < x) - (x < T(0))); }
inline float fx_reciprocal(float x) { return 1.0f / x; }
inline float fx_rsqrt(float x) { return 1.0f / metal::sqrt(x); }
inline float fx_sigmoid(float x) { return 1.0f / (1.0f + metal::exp(-x)); }
inline float fx_expm1(float x) {
  const float u = metal::exp(x);
  if (u == 1.0f) return x;
  const float um1 = u - 1.0f;
  if (um1 == -1.0f) return -1.0f;
  if (metal::isinf(u)) return u;
  return um1 * x / metal::log(u);
}
inline float fx_log1p(float x) {
  const float u = 1.0f + x;
  if (u == 1.0f) return x;
  if (metal::isinf(u)) return u;
  return metal::log(u) * x / (u - 1.0f);
}
// erfc(|x|) by a Chebyshev-fitted exponential (fractional error below 1.2e-7)
inline float fx_erfc_pos(float z) {
  const float t = 1.0f / (1.0f + 0.5f * z);
  const float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f +
                  t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f +
                  t * (-0.82215223f + t * 0.17087277f))))))));
  return t * metal::exp(-z * z + p);
}
inline float fx_erf(float x) {
  const float a = metal::fabs(x);
  if (a < 0.5f) {  // Maclaurin series: no cancellation near zero
    const float x2 = x * x;
    const float s = 1.0f - x2 * (1.0f / 3.0f - x2 * (0.1f - x2 * (1.0f / 42.0f - x2 * (1.0f / 216.0f - x2 / 1320.0f))));
    return 1.12837916709551257f * x * s;
  }
  const float r = 1.0f - fx_erfc_pos(a);
  return x < 0.0f ? -r : r;
}
inline float fx_erfc(float x) {
  if (metal::fabs(x) < 0.5f) return 1.0f - fx_erf(x);
  return x < 0.0f ? 2.0f - fx_erfc_pos(-x) : fx_erfc_pos(x);
}
// erfinv: a single-precision polynomial in w = -log(1 - y^2), then one Newton step
inline float fx_erfinv(float y) {
  const float a = metal::fabs(y);
  if (!(a < 1.0f)) return a == 1.0f ? metal::copysign(INFINITY, y) : NAN;
  if (a == 0.0f) return y;
  float w = -metal::log((1.0f - y) * (1.0f + y));
  float p;
  if (w < 5.0f) {
    w = w - 2.5f;
    p = 2.81022636e-08f;
    p = 3.43273939e-07f + p * w; p = -3.5233877e-06f + p * w; p = -4.39150654e-06f + p * w;
    p = 0.00021858087f + p * w; p = -0.00125372503f + p * w; p = -0.00417768164f + p * w;
    p = 0.246640727f + p * w; p = 1.50140941f + p * w;
  } else {
    w = metal::sqrt(w) - 3.0f;
    p = -0.000200214257f;
    p = 0.000100950558f + p * w; p = 0.00134934322f + p * w; p = -0.00367342844f + p * w;
    p = 0.00573950773f + p * w; p = -0.0076224613f + p * w; p = 0.00943887047f + p * w;
    p = 1.00167406f + p * w; p = 2.83297682f + p * w;
  }
  float x = p * y;
  const float e = fx_erf(x) - y;
  return x - e / (1.12837916709551257f * metal::exp(-x * x));
}

// ---- binary ------------------------------------------------------------------
// maximum/minimum and max/min reductions: NaN wins
template <typename T> inline T fx_max(T a, T b) {
  return fx_isnan(a) ? a : (fx_isnan(b) ? b : (a < b ? b : a));
}
template <typename T> inline T fx_min(T a, T b) {
  return fx_isnan(a) ? a : (fx_isnan(b) ? b : (b < a ? b : a));
}
// integer division by zero gives 0 (eager raises); x / -1 never traps
template <typename T> inline T fx_truncdiv(T a, T b) {
  if (b == T(0)) return T(0);
  if (!fx_unsigned<T>::value && b == T(-1)) return T(T(0) - a);
  return T(a / b);
}
inline float fx_truncdiv(float a, float b) { return metal::trunc(a / b); }
template <typename T> inline T fx_floordiv(T a, T b) {
  if (b == T(0)) return T(0);
  if (!fx_unsigned<T>::value && b == T(-1)) return T(T(0) - a);
  const T q = T(a / b);
  return (!fx_unsigned<T>::value && a % b != T(0) && ((a < T(0)) != (b < T(0)))) ? T(q - T(1)) : q;
}
inline float fx_floordiv(float a, float b) {
  if (b == 0.0f) return a / b;
  const float m = metal::fmod(a, b);
  float d = (a - m) / b;
  if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) d -= 1.0f;
  if (d == 0.0f) return metal::copysign(0.0f, a / b);
  float f = metal::floor(d);
  if (d - f > 0.5f) f += 1.0f;
  return f;
}
// bf16/fp16 floor division with every intermediate rounded to the 16-bit type
inline float fx_floordiv16(float a, float b, int is_bf16) {
  if (b == 0.0f) return fx_round16(a / b, is_bf16);
  const float m = metal::fmod(a, b);
  float d = fx_round16(fx_round16(a - m, is_bf16) / b, is_bf16);
  if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) d = fx_round16(d - 1.0f, is_bf16);
  if (d == 0.0f) return metal::copysign(0.0f, fx_round16(a / b, is_bf16));
  float f = metal::floor(d);
  if (fx_round16(d - f, is_bf16) > 0.5f) f = fx_round16(f + 1.0f, is_bf16);
  return f;
}
template <typename T> inline T fx_fmod(T a, T b) {
  if (b == T(0)) return T(0);
  if (!fx_unsigned<T>::value && b == T(-1)) return T(0);
  return T(a % b);
}
inline float fx_fmod(float a, float b) { return metal::fmod(a, b); }
// torch.remainder: the result takes the sign of the divisor
template <typename T> inline T fx_mod(T a, T b) {
  if (b == T(0)) return T(0);
  if (!fx_unsigned<T>::value && b == T(-1)) return T(0);
  const T r = T(a % b);
  return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? T(r + b) : r;
}
inline float fx_mod(float a, float b) {
  float m = metal::fmod(a, b);
  if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) m += b;
  return m;
}
template <typename T> inline T fx_pow(T base, T e) {
  if (!fx_unsigned<T>::value && e < T(0)) {
    if (base == T(1)) return T(1);
    if (base == T(-1)) return (e & T(1)) ? T(-1) : T(1);
    return T(0);
  }
  T r = T(1);
  while (e != T(0)) {
    if (e & T(1)) r = T(r * base);
    e = T(e >> 1);
    base = T(base * base);
  }
  return r;
}
inline bool fx_pow(bool base, bool e) { return base || !e; }
inline float fx_pow(float base, float e) { return metal::pow(base, e); }
// shifts: an amount outside [0, bits) shifts everything out (sign fill for >>)
template <typename T> inline T fx_lshift(T a, T b) {
  if (long(b) < 0 || long(b) >= long(sizeof(T) * 8)) return T(0);
  return T(ulong(long(a)) << ulong(b));
}
template <typename T> inline T fx_rshift(T a, T b) {
  if (long(b) < 0 || long(b) >= long(sizeof(T) * 8)) return (!fx_unsigned<T>::value && a < T(0)) ? T(-1) : T(0);
  return T(a >> b);
}

// ---- reductions: identities, update with one value, combine two states -------
template <typename T> inline T fx_lowest() { return T(0); }
template <> inline float fx_lowest<float>() { return -INFINITY; }
template <> inline long fx_lowest<long>() { return -9223372036854775807L - 1; }
template <> inline int fx_lowest<int>() { return -2147483647 - 1; }
template <> inline short fx_lowest<short>() { return -32768; }
template <> inline char fx_lowest<char>() { return -128; }
template <typename T> inline T fx_highest() { return T(1); }
template <> inline float fx_highest<float>() { return INFINITY; }
template <> inline long fx_highest<long>() { return 9223372036854775807L; }
template <> inline int fx_highest<int>() { return 2147483647; }
template <> inline short fx_highest<short>() { return 32767; }
template <> inline char fx_highest<char>() { return 127; }
template <> inline uchar fx_highest<uchar>() { return 255; }
""" + render_helpers(METAL, ('sum_upd', 'prod_upd', 'max_upd', 'min_upd')) + r"""template <typename T> inline void fx_any_upd(thread bool& a, T v) { a = a || (v != T(0)); }
template <typename T> inline void fx_all_upd(thread bool& a, T v) { a = a && (v != T(0)); }
// argmax/argmin: does (vb, ib) beat (va, ia)?  The extreme wins, NaN is the most
// extreme, ties go to the lower index, an empty state (index < 0) always loses.
""" + render_helpers(METAL, ('arg_better', 'argmax_upd', 'argmin_upd')) + r"""// ---- scans: the running state after one more element (eager's CPU kernels' rules) ----
template <typename T> inline void fx_logcumsumexp_upd(thread T& a, T v) {
  const T mn = fx_isnan(v) ? v : (a < v ? a : v);
  const T mx = fx_isnan(v) ? v : (a < v ? v : a);
  if (mn != mx || !metal::isinf(mn)) a = fx_log1p(metal::exp(mn - mx)) + mx;  // equal: not NaN
}
""" + render_helpers(METAL, ('cummax_upd', 'cummin_upd')) + render_helpers(METAL, ('welford_upd',)) + r"""// the parallel (Chan et al.) combination of two partial Welford states
""" + render_helpers(METAL, ('welford_cmb',))
