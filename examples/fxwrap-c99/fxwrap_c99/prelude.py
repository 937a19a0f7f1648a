"""The C99 prelude: every helper fxwrap's C-family engine calls (``fxwrap.targets.cstyle.HELPERS``),
as ``c99_<name>`` for the index helpers and ``c99_<name>_<type>`` once per C type (C has no
overloading), with eager PyTorch's semantics (NaN propagates, Python's floor division)."""

C99_PRELUDE = r"""
#include <stdbool.h>
#include <stdint.h>
#include <tgmath.h>
static inline int64_t c99_imin(int64_t a, int64_t b) { return b < a ? b : a; }
static inline int64_t c99_imax(int64_t a, int64_t b) { return a < b ? b : a; }
static inline int64_t c99_ifloordiv(int64_t a, int64_t b) {
  const int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t c99_imod(int64_t a, int64_t b) {
  const int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline int64_t c99_ipow_index(int64_t b, int64_t e) {
  int64_t r = 1; for (; e > 0; e >>= 1, b *= b) if (e & 1) r *= b; return r; }
/* erfinv: Winitzki's closed form, then Halley steps on erf(x) = y (erfc near |y| = 1) */
static inline double c99_erfinv_d(double y) {
  const double a = fabs(y), k = 0.147, pi = 3.14159265358979323846;
  if (!(a < 1.0)) return a == 1.0 ? copysign(INFINITY, y) : NAN;
  if (a == 0.0) return y;
  const double l = log((1.0 - a) * (1.0 + a)), t = 2.0 / (pi * k) + 0.5 * l;
  double x = sqrt(sqrt(t * t - l / k) - t);
  for (int i = 0; i < 3; ++i) {
    const double f = a < 0.5 ? erf(x) - a : (1.0 - a) - erfc(x);
    const double step = f / (1.12837916709551257390 * exp(-x * x));
    x -= step / (1.0 + x * step);
  }
  return copysign(x, y);
}
/* float types: libm through <tgmath.h> */
#define C99_FLOAT(T) \
static inline bool c99_isnan_##T(T x) { return isnan(x); } \
static inline bool c99_isinf_##T(T x) { return isinf(x); } \
static inline bool c99_signbit_##T(T x) { return signbit(x); } \
static inline T c99_abs_##T(T x) { return fabs(x); } \
static inline T c99_floor_##T(T x) { return floor(x); } \
static inline T c99_ceil_##T(T x) { return ceil(x); } \
static inline T c99_trunc_##T(T x) { return trunc(x); } \
static inline T c99_round_##T(T x) { return nearbyint(x); } \
static inline T c99_sigmoid_##T(T x) { return (T)1 / ((T)1 + exp(-x)); } \
static inline T c99_rsqrt_##T(T x) { return (T)1 / sqrt(x); } \
static inline T c99_reciprocal_##T(T x) { return (T)1 / x; } \
static inline T c99_erfinv_##T(T y) { return (T)c99_erfinv_d((double)y); } \
static inline T c99_truncdiv_##T(T a, T b) { return trunc(a / b); } \
static inline T c99_fmod_##T(T a, T b) { return fmod(a, b); } \
static inline T c99_pow_##T(T a, T b) { return pow(a, b); } \
static inline T c99_mod_##T(T a, T b) { T m = fmod(a, b); if (m != 0 && ((b < 0) != (m < 0))) m += b; return m; } \
static inline T c99_floordiv_##T(T a, T b) { \
  if (b == 0) return a / b; \
  const T m = fmod(a, b); \
  T d = (a - m) / b; \
  if (m != 0 && ((b < 0) != (m < 0))) d -= (T)1; \
  if (d == 0) return copysign((T)0, a / b); \
  T f = floor(d); \
  return d - f > (T)0.5 ? f + (T)1 : f; } \
static inline void c99_welford_upd_##T(T *mean, T *m2, int64_t *n, T v) { \
  *n += 1; const T d = v - *mean; *mean += d / (T)*n; *m2 += d * (v - *mean); } \
static inline void c99_welford_cmb_##T(T *mean, T *m2, int64_t *n, T mean_b, T m2_b, int64_t n_b) { \
  if (n_b == 0) return; \
  if (*n == 0) { *mean = mean_b; *m2 = m2_b; *n = n_b; return; } \
  const int64_t nn = *n + n_b; const T d = mean_b - *mean, wb = (T)n_b / (T)nn; \
  *mean = *mean + d * wb; *m2 = *m2 + m2_b + d * d * (T)*n * wb; *n = nn; } \
static inline void c99_logcumsumexp_upd_##T(T *a, T v) { \
  const T mn = isnan(v) ? v : (*a < v ? *a : v), mx = isnan(v) ? v : (*a < v ? v : *a); \
  if (mn != mx || isfinite(mn)) *a = log1p(exp(mn - mx)) + mx; }
/* integer types (and bool): division by 0 gives 0, shifts past the width shift everything out */
#define C99_SIGNED(T) ((T)-1 < 0)
#define C99_INT(T) \
static inline bool c99_isnan_##T(T x) { (void)x; return false; } \
static inline bool c99_isinf_##T(T x) { (void)x; return false; } \
static inline bool c99_signbit_##T(T x) { return C99_SIGNED(T) && x < 0; } \
static inline T c99_abs_##T(T x) { return C99_SIGNED(T) && x < 0 ? (T)-x : x; } \
static inline T c99_floor_##T(T x) { return x; } \
static inline T c99_ceil_##T(T x) { return x; } \
static inline T c99_trunc_##T(T x) { return x; } \
static inline T c99_round_##T(T x) { return x; } \
static inline bool c99_by_m1_##T(T b) { return C99_SIGNED(T) && b == (T)-1; } \
static inline T c99_truncdiv_##T(T a, T b) { return b == 0 ? 0 : c99_by_m1_##T(b) ? (T)(0 - a) : (T)(a / b); } \
static inline T c99_fmod_##T(T a, T b) { return b == 0 || c99_by_m1_##T(b) ? 0 : (T)(a % b); } \
static inline T c99_floordiv_##T(T a, T b) { \
  if (b == 0) return 0; \
  if (c99_by_m1_##T(b)) return (T)(0 - a); \
  const T q = (T)(a / b); return (a % b != 0 && ((a < 0) != (b < 0))) ? (T)(q - 1) : q; } \
static inline T c99_mod_##T(T a, T b) { \
  if (b == 0 || c99_by_m1_##T(b)) return 0; \
  const T r = (T)(a % b); return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r; } \
static inline T c99_pow_##T(T b, T e) { \
  if (C99_SIGNED(T) && e < 0) return b == 1 ? 1 : c99_by_m1_##T(b) ? ((e & 1) ? b : 1) : 0; \
  T r = 1; for (; e != 0; e = (T)(e >> 1), b = (T)(b * b)) if (e & 1) r = (T)(r * b); return r; } \
static inline T c99_lshift_##T(T a, T b) { \
  return (int64_t)b < 0 || (int64_t)b >= (int64_t)(8 * sizeof(T)) ? 0 : (T)((uint64_t)a << b); } \
static inline T c99_rshift_##T(T a, T b) { \
  if ((int64_t)b < 0 || (int64_t)b >= (int64_t)(8 * sizeof(T))) return (T)(C99_SIGNED(T) && a < 0 ? -1 : 0); \
  return (T)(a >> b); }
/* every type: maximum/minimum (NaN wins), sign, and the reduction and scan accumulators */
#define C99_ANY(T, LOWEST, HIGHEST) \
static inline T c99_max_##T(T a, T b) { return (a < b || c99_isnan_##T(b)) ? b : a; } \
static inline T c99_min_##T(T a, T b) { return (b < a || c99_isnan_##T(b)) ? b : a; } \
static inline T c99_sign_##T(T x) { return (T)((0 < x) - (x < 0)); } \
static inline T c99_lowest_##T(void) { return LOWEST; } \
static inline T c99_highest_##T(void) { return HIGHEST; } \
static inline void c99_sum_upd_##T(T *a, T v) { *a = *a + v; } \
static inline void c99_prod_upd_##T(T *a, T v) { *a = *a * v; } \
static inline void c99_max_upd_##T(T *a, T v) { *a = c99_max_##T(*a, v); } \
static inline void c99_min_upd_##T(T *a, T v) { *a = c99_min_##T(*a, v); } \
static inline void c99_any_upd_##T(bool *a, T v) { *a = *a || (v != 0); } \
static inline void c99_all_upd_##T(bool *a, T v) { *a = *a && (v != 0); } \
/* argmax/argmin: the extreme wins, NaN is the most extreme, ties take the lower index */ \
static inline bool c99_arg_better_##T(bool is_max, T va, int64_t ia, T vb, int64_t ib) { \
  if (ib < 0) return false; \
  if (ia < 0) return true; \
  const bool na = c99_isnan_##T(va), nb = c99_isnan_##T(vb); \
  if (na || nb) return (na && nb) ? ib < ia : nb; \
  return (is_max ? va < vb : vb < va) || (va == vb && ib < ia); } \
static inline void c99_argmax_upd_##T(T *va, int64_t *ia, T v, int64_t i) { \
  if (c99_arg_better_##T(true, *va, *ia, v, i)) { *va = v; *ia = i; } } \
static inline void c99_argmin_upd_##T(T *va, int64_t *ia, T v, int64_t i) { \
  if (c99_arg_better_##T(false, *va, *ia, v, i)) { *va = v; *ia = i; } } \
/* cummax/cummin: a NaN always takes over, ties take the later index */ \
static inline void c99_cummax_upd_##T(T *va, int64_t *ia, T v, int64_t i) { \
  if (c99_isnan_##T(v) || (!c99_isnan_##T(*va) && v >= *va)) { *va = v; *ia = i; } } \
static inline void c99_cummin_upd_##T(T *va, int64_t *ia, T v, int64_t i) { \
  if (c99_isnan_##T(v) || (!c99_isnan_##T(*va) && v <= *va)) { *va = v; *ia = i; } }
C99_FLOAT(float) C99_ANY(float, -INFINITY, INFINITY)
C99_FLOAT(double) C99_ANY(double, -INFINITY, INFINITY)
C99_INT(int64_t) C99_ANY(int64_t, INT64_MIN, INT64_MAX)
C99_INT(int32_t) C99_ANY(int32_t, INT32_MIN, INT32_MAX)
C99_INT(int16_t) C99_ANY(int16_t, INT16_MIN, INT16_MAX)
C99_INT(int8_t) C99_ANY(int8_t, INT8_MIN, INT8_MAX)
C99_INT(uint8_t) C99_ANY(uint8_t, 0, UINT8_MAX)
C99_INT(uint16_t) C99_ANY(uint16_t, 0, UINT16_MAX)
C99_INT(uint32_t) C99_ANY(uint32_t, 0, UINT32_MAX)
C99_INT(uint64_t) C99_ANY(uint64_t, 0, UINT64_MAX)
C99_INT(bool) C99_ANY(bool, false, true)
"""
