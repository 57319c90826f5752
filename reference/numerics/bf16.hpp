// bf16.hpp -- bfloat16: 1 sign, 8 exponent, 7 mantissa bits; the upper half of an f32.
//
// Contract (docs/numerics.md, "bf16"):
//  - f32 -> bf16 rounds to nearest, ties to even (the seed's bf16_round / bf16_pair / the
//    vector .to(BFloat16) stores); overflow rounds to +-Inf as IEEE does.
//  - NaN of any payload or sign becomes the canonical 0x7FC0 (NaN payloads differ between
//    CPUs and GPUs; the contract keeps them out of every stored bit).
//  - A bf16 pair packs the low (even) element in bits 0..15 (the seed's bf16 pair words).
#pragma once
#include "reference/numerics/hd.hpp"

namespace k4 {

K4_HD uint16_t bf16_bits_rne(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;  // canonical NaN
  u += 0x7FFFu + ((u >> 16) & 1u);                      // RNE on the 16 dropped bits
  return uint16_t(u >> 16);
}
K4_HD float bf16_to_f32(uint16_t b) { return f32_from_bits(uint32_t(b) << 16); }
// The seed's bf16_round: the f32 value of the nearest bf16.
K4_HD float bf16_round(float f) { return bf16_to_f32(bf16_bits_rne(f)); }

// The seed's bf16_pair: two f32 -> one word, the low element in the low half.
K4_HD uint32_t bf16_pair(float lo, float hi) {
  return uint32_t(bf16_bits_rne(lo)) | (uint32_t(bf16_bits_rne(hi)) << 16);
}
K4_HD float bf16_pair_lo(uint32_t w) { return bf16_to_f32(uint16_t(w & 0xFFFFu)); }
K4_HD float bf16_pair_hi(uint32_t w) { return bf16_to_f32(uint16_t(w >> 16)); }

}  // namespace k4
