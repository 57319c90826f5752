// fast_dot.hpp -- the model's fast path for the block-exact dots of numerics/mma.hpp.
//
// Same definition, other arithmetic: every E4M3 x E4M3 product is an integer times 2^-18
// below 2^36 and every E2M1 x E4M3 product an integer times 2^-10, so a 32-block's partial
// sums are integers below 2^53 in those units: exact in double (or int32 for E2M1 x E4M3),
// in any order. The one rounding to f32 is then the same as round_block_sum's. Host-only;
// tests/cpu/test_fast_dot.cpp checks equality with mma.hpp on random and adversarial blocks.
#pragma once
#include <array>
#include <cstdint>

#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/mma.hpp"

namespace k4 {

// E4M3 byte -> exact value as double (NaN stays NaN and poisons the block, as specified).
struct E4m3Doubles {
  std::array<double, 256> v;
  E4m3Doubles() {
    for (int b = 0; b < 256; ++b) v[b] = double(e4m3_to_f32(uint8_t(b)));
  }
};
inline const E4m3Doubles& e4m3_doubles() {
  static const E4m3Doubles t;
  return t;
}

// Sum of 32 exact products in double: four independent chains, exact in any order.
inline float block_dot_f64(const double* a, const double* b) {
  double s[4] = {0, 0, 0, 0};
  for (int i = 0; i < kBlockK; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += a[i + j] * b[i + j];
  return float((s[0] + s[1]) + (s[2] + s[3]));
}

// Branch-free decodes that the compiler vectorizes (same integers as e2m1_to_int_x2 and
// e4m3_to_int_x512; NaN E4M3 codes decode to their bit pattern's magnitude and are flagged
// separately by the callers).
inline int32_t fp4_x2_branchless(uint32_t n) {
  const int32_t e = int32_t((n >> 1) & 3u), m = int32_t(n & 1u), s = int32_t((n >> 3) & 1u);
  const int32_t mag = e ? ((2 + m) << e) >> 1 : m;
  return (mag ^ -s) + s;
}
inline void decode_fp4_row_fast(int32_t* __restrict out, const uint8_t* __restrict packed, int n) {
  for (int i = 0; i < n / 2; ++i) {
    out[2 * i] = fp4_x2_branchless(packed[i] & 15u);
    out[2 * i + 1] = fp4_x2_branchless(uint32_t(packed[i]) >> 4);
  }
}
inline int32_t e4m3_x512_branchless(uint32_t b) {
  const int32_t e = int32_t((b >> 3) & 15u), m = int32_t(b & 7u), s = int32_t((b >> 7) & 1u);
  const int32_t mag = e ? ((8 + m) << e) >> 1 : m;
  return (mag ^ -s) + s;
}
inline void decode_e4m3_row_fast(int32_t* __restrict out, const uint8_t* __restrict x, int n) {
  for (int i = 0; i < n; ++i) out[i] = e4m3_x512_branchless(x[i]);
}
// E4M3 x E4M3 block through int64 (products < 2^36, sum < 2^41).
inline float block_dot_i64(const int32_t* a, const int32_t* b, bool any_nan) {
  int64_t s = 0;
  for (int i = 0; i < kBlockK; ++i) s += int64_t(a[i]) * int64_t(b[i]);
  return any_nan ? f32_from_bits(kCanonicalNan) : round_block_sum(s, 18);
}

// E2M1 x E4M3 through integers: w as value*2 (int8 range), x as value*2^9; |sum| < 2^27.
inline float block_dot_i32(const int32_t* w2x, const int32_t* x512, bool any_nan) {
  int32_t s = 0;
  for (int i = 0; i < kBlockK; ++i) s += w2x[i] * x512[i];
  return any_nan ? f32_from_bits(kCanonicalNan) : round_block_sum(s, 10);
}

}  // namespace k4
