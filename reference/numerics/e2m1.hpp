// e2m1.hpp -- OCP FP4 E2M1: values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; no NaN, no Inf.
// Packing (the seed's w13 / w2 bytes): two values a byte, the even element in the low nibble.
#pragma once
#include "reference/numerics/hd.hpp"

namespace k4 {

// value * 2 as an exact integer in [-12, 12]: the block-exact dots' operand.
K4_HD int32_t e2m1_to_int_x2(uint8_t nib) {
  const uint32_t e = (nib >> 1) & 3u, m = nib & 1u;
  const int32_t mag = e == 0u ? int32_t(m) : int32_t((2u + m) << (e - 1u));
  return (nib & 8u) ? -mag : mag;
}
// The value with its sign: code 0b1000 is -0 (the integer form above has no -0).
K4_HD float e2m1_to_f32(uint8_t nib) {
  const float mag = float(e2m1_to_int_x2(nib & 7u)) * 0.5f;
  return (nib & 8u) ? -mag : mag;
}

K4_HD uint8_t fp4_lo(uint8_t byte) { return uint8_t(byte & 0xFu); }  // element 2i
K4_HD uint8_t fp4_hi(uint8_t byte) { return uint8_t(byte >> 4); }    // element 2i + 1
K4_HD uint8_t fp4_pack2(uint8_t even, uint8_t odd) { return uint8_t((even & 0xFu) | ((odd & 0xFu) << 4)); }

// f32 -> E2M1, round to nearest even, saturating at +-6; NaN -> +6 is not defined by OCP:
// the loader rejects NaN weights before it gets here. Used by the OCP MXFP4 quantizer only.
K4_HD uint8_t e2m1_bits_rne_sat(float x) {
  const uint8_t s = (f32_bits(x) >> 28) & 8u;
  const float a = x < 0 ? -x : x;
  // Midpoints between the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; a tie goes to the even code.
  uint8_t c;
  if (a <= 0.25f) c = 0;        // tie 0.25 -> 0 (even)
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;   // tie 0.75 -> 2 (even), 1.25 -> 2
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;    // 1.75 -> 4, 2.5 -> 4
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;    // 3.5 -> 6, 5 -> 6
  else c = 7;
  return uint8_t(s | c);
}

}  // namespace k4
