// fast_dot.hpp -- the model's fast decodes of the block-exact dots' operands.
//
// The block dots themselves are reference/numerics/mma.hpp's block_dot_ints, which the
// kernels call too; these decode whole rows of E2M1 / E4M3 codes to its integer operands
// without branches, so that the compiler vectorizes them. Host-only;
// tests/cpu/test_fast_dot.cpp checks them against the formats' decodes for every code and
// the dots on them against mma.hpp's byte forms.
#pragma once
#include <cstdint>

#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"

namespace k4 {

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

}  // namespace k4
