// e8m0.hpp -- OCP E8M0 block scale: the value 2^(bits - 127); 0xFF is NaN; no sign, no zero.
#pragma once
#include "reference/numerics/hd.hpp"

namespace k4 {

K4_HD bool e8m0_is_nan(uint8_t b) { return b == 0xFFu; }

// 2^(b-127) as f32: b = 0 is the f32 subnormal 2^-127; 0xFF is NaN.
K4_HD float e8m0_to_f32(uint8_t b) {
  if (b == 0xFFu) return f32_from_bits(kCanonicalNan);
  if (b == 0u) return f32_from_bits(0x00400000u);
  return f32_from_bits(uint32_t(b) << 23);
}

}  // namespace k4
