// hd.hpp -- the one switch that makes reference/numerics/ compile for host and device.
//
// Every function in reference/numerics/ is K4_HD: plain C++ on the host, __host__ __device__
// under nvcc or hipcc. Nothing here may use the C++ library beyond <cstdint>, so that the
// model and the kernel compile the very same source (one source of truth for every rounding).
#pragma once
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define K4_HD __host__ __device__ inline
#define K4_DEVICE_COMPILE 1
#else
#define K4_HD inline
#endif

namespace k4 {

K4_HD uint32_t f32_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
K4_HD float f32_from_bits(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
K4_HD double f64_from_bits(uint64_t u) {
  double d;
  __builtin_memcpy(&d, &u, 8);
  return d;
}
K4_HD bool is_nan(float f) { return (f32_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }

// 2^n as a double, exact for -1022 <= n <= 1023 (built from its bits: no libm on device).
K4_HD double pow2_f64(int n) { return f64_from_bits(uint64_t(n + 1023) << 52); }

// The canonical NaN every stage stores (see policy.hpp: canon_nan).
constexpr uint32_t kCanonicalNan = 0x7FC00000u;

}  // namespace k4
