// fxwrap Metal shim: compiles Metal Shading Language kernels as C++17 (g++ -fopenmp)
// and executes every thread of the grid on the CPU.  A test vehicle for emitted
// Metal source; it makes no claim about Metal's speed.
//
// * address spaces: `device`, `thread` map away, `constant` is `const`; `threadgroup`
//   is `static`: one threadgroup runs at a time, so a function-scope static array is
//   exactly the memory its team of threads shares;
// * attributes (`[[buffer(0)]]`, `[[thread_position_in_grid]]`) are ignored by C++
//   (compile with -Wno-attributes); the driver passes the position arguments;
// * each threadgroup runs as a team of OpenMP threads (`fx_shim_dispatch` mode 1):
//   `threadgroup_barrier` is a real `#pragma omp barrier`; SIMD-group functions are
//   emulated over the 32 consecutive threads of a SIMD group through a shared,
//   double-buffered scratch and one barrier each (every thread of the team must
//   call them, as in fxwrap's emitted code);
// * `half` is `_Float16`; `bfloat` a struct rounding to nearest-even from float;
// * `metal::` math maps to `std::` (correctly rounded where Metal is within ulps).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
#include <sys/types.h>
#include <vector>

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;

struct bfloat {
  uint16_t bits;
  bfloat() = default;
  bfloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits = std::isnan(f) ? (uint16_t)0x7FC0 : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
  operator float() const {
    const uint32_t u = (uint32_t)bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct uint3 { uint x, y, z; };

namespace metal {
using std::acos; using std::acosh; using std::asin; using std::asinh; using std::atan;
using std::atan2; using std::atanh; using std::ceil; using std::copysign; using std::cos;
using std::cosh; using std::exp; using std::exp2; using std::fabs; using std::floor;
using std::fmod; using std::log; using std::log10; using std::log2; using std::pow;
using std::sin; using std::sinh; using std::sqrt; using std::tan; using std::tanh;
using std::trunc; using std::fmax; using std::fmin;
inline float rint(float x) { return std::nearbyint(x); }
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline bool isnan(float x) { return std::isnan(x); }
inline bool isinf(float x) { return std::isinf(x); }
inline bool signbit(float x) { return std::signbit(x); }

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline void threadgroup_barrier(mem_flags) {
#pragma omp barrier
}

// ---- SIMD-group emulation over the current team ----
struct fx_shim_team {
  int tid = 0;            // thread_position_in_threadgroup
  int size = 1;           // threads_per_threadgroup
  unsigned char* scratch = nullptr;  // 2 * size * 8 bytes, shared by the team
  unsigned phase = 0;     // which half of the scratch the next SIMD call uses
};
inline fx_shim_team& fx_team() { static thread_local fx_shim_team t; return t; }
constexpr int fx_simd_width = 32;

// publish v, wait for the team, return this thread's view of the SIMD group's values
template <typename T> inline const T* fx_simd_publish(T v, int* lane, int* width) {
  fx_shim_team& t = fx_team();
  static_assert(sizeof(T) <= 8, "SIMD values of up to 8 bytes");
  T* buf = reinterpret_cast<T*>(t.scratch + (size_t)(t.phase & 1u) * (size_t)t.size * 8);
  t.phase += 1;
  buf[t.tid] = v;
#pragma omp barrier
  *lane = t.tid % fx_simd_width;
  const int base = t.tid - *lane;
  *width = std::min(fx_simd_width, t.size - base);
  return buf + base;
}
template <typename T> inline T simd_shuffle_down(T v, ushort delta) {
  int lane, width;
  const T* g = fx_simd_publish(v, &lane, &width);
  return lane + (int)delta < width ? g[lane + delta] : v;
}
template <typename T> inline T simd_broadcast(T v, ushort from) {
  int lane, width;
  const T* g = fx_simd_publish(v, &lane, &width);
  return g[from];
}
// fold the SIMD group's values in lane order (deterministic)
template <typename T, typename F> inline T fx_simd_fold(T v, F f) {
  int lane, width;
  const T* g = fx_simd_publish(v, &lane, &width);
  T s = g[0];
  for (int i = 1; i < width; ++i) s = f(s, g[i]);
  return s;
}
template <typename T> inline T simd_sum(T v) { return fx_simd_fold(v, [](T a, T b) { return T(a + b); }); }
template <typename T> inline T simd_product(T v) { return fx_simd_fold(v, [](T a, T b) { return T(a * b); }); }
template <typename T> inline T simd_max(T v) { return fx_simd_fold(v, [](T a, T b) { return std::max(a, b); }); }
template <typename T> inline T simd_min(T v) { return fx_simd_fold(v, [](T a, T b) { return std::min(a, b); }); }
inline bool simd_any(bool v) { return fx_simd_fold(v, [](bool a, bool b) { return a || b; }); }
inline bool simd_all(bool v) { return fx_simd_fold(v, [](bool a, bool b) { return a && b; }); }
}  // namespace metal

// ---- the driver: one call runs the whole grid ----
// mode 0: threads are independent (no threadgroup memory, barriers or SIMD calls):
//         a parallel loop over threadgroups, each thread of a group in turn.
// mode 1: each threadgroup is a team of `tg` OpenMP threads, one group after another.
// mode 2: each thread of a group runs to completion before the next starts; barriers
//         mean nothing (only to show that a kernel needs mode 1).
// Returns the team size that ran (mode 1), 1 otherwise; -1 if OpenMP gave a smaller team.
template <typename F>
inline int fx_shim_dispatch(int64_t groups, int64_t tg, int mode, F&& body) {
  if (groups <= 0 || tg <= 0) return 0;
  if (mode == 0) {
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t t = 0; t < tg; ++t) body(g, t);
    return 1;
  }
  std::vector<unsigned char> scratch((size_t)(2 * tg * 8));
  if (mode == 2) {
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t t = 0; t < tg; ++t) {
        metal::fx_shim_team& team = metal::fx_team();
        team.tid = (int)t; team.size = (int)tg; team.scratch = scratch.data(); team.phase = 0;
        body(g, t);
      }
    return 1;
  }
  omp_set_dynamic(0);
  int ran = (int)tg;
  // one team for the whole launch; a barrier between threadgroups (their `threadgroup`
  // statics and the SIMD scratch are reused by the next group)
#pragma omp parallel num_threads((int)tg)
  {
    if (omp_get_num_threads() != (int)tg) {
#pragma omp single
      ran = -1;
    } else {
      metal::fx_shim_team& team = metal::fx_team();
      team.tid = omp_get_thread_num(); team.size = (int)tg;
      team.scratch = scratch.data(); team.phase = 0;
      for (int64_t g = 0; g < groups; ++g) {
        body(g, (int64_t)team.tid);
#pragma omp barrier
      }
    }
  }
  return ran;
}

// converts to whatever pointer type the kernel parameter has
struct fx_any_ptr {
  void* p;
  template <typename T> operator T*() const { return static_cast<T*>(p); }
};

// Metal's address spaces and qualifiers, after every standard header
#define kernel
#define device
#define constant const
#define thread
#define threadgroup static
