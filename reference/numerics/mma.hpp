// mma.hpp -- the matrix-unit dot products the seed issues, defined block-exact.
//
// Contract (docs/numerics.md, "Matrix-unit dots"): an MFMA over K is a sequence of 32-element
// blocks in the instruction's block order. Each block's sum of products is computed exactly
// (E4M3 x 2^9 and E2M1 x 2 are integers: the sum is an int64), rounded once to f32 (RNE),
// multiplied exactly by the block's two E8M0 scales as one scaling by 2^(sa + sb - 254)
// (IEEE rounding only at the range edges: overflow to Inf, underflow to subnormals), and
// added into the f32 accumulator: acc = acc + block, block 0 first. An exactly zero block is
// +0. A NaN element (E4M3 0x7F / 0xFF) or a NaN scale (0xFF) makes the block NaN.
//
// The seed's instructions (one output element each; a, b hold logical k in order):
//   mfma_f32_16x16x32_fp8_fp8       QK, PV        mma_fp8_k32(c, a, b)            1 block
//   mfma_scale_f32_16x16x128_f8f6f4 o_proj        mma_fp8_k128_unit(c, a, b)      4 blocks, unit scales
//   mfma_scale ... (fp4 A)          up/gate, down mma_f4f8_k128(c, w, sa, x, sb)  4 blocks, E8M0
//   mfma_scale ... (fp8 A)          shared_fp8    mma_f8f8_k128(c, w, sa, x, sb)  4 blocks, E8M0
#pragma once
#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/e8m0.hpp"
#include "reference/numerics/hd.hpp"

namespace k4 {

constexpr int kBlockK = 32;

// An exact integer block sum s * 2^-frac_bits, rounded once to f32. |s| < 2^53 for every
// block these formats can make, so the double is exact and the one rounding is the cast.
K4_HD float round_block_sum(int64_t s, int frac_bits) {
  return float(double(s) * pow2_f64(-frac_bits));
}

// Block value v (already rounded to f32) times 2^(sa-127) * 2^(sb-127), one rounding.
K4_HD float scale_block(float v, uint8_t sa, uint8_t sb) {
  if (e8m0_is_nan(sa) || e8m0_is_nan(sb)) return f32_from_bits(kCanonicalNan);
  return float(double(v) * pow2_f64(int(sa) + int(sb) - 254));
}

// E4M3 x E4M3 block: products are integers times 2^-18.
K4_HD float block_dot_e4m3(const uint8_t* a, const uint8_t* b) {
  int64_t s = 0;
  bool nan = false;
  for (int i = 0; i < kBlockK; ++i) {
    nan = nan || e4m3_is_nan(a[i]) || e4m3_is_nan(b[i]);
    s += int64_t(e4m3_to_int_x512(a[i])) * int64_t(e4m3_to_int_x512(b[i]));
  }
  return nan ? f32_from_bits(kCanonicalNan) : round_block_sum(s, 18);
}

// E2M1 (packed, 16 bytes, even element low) x E4M3 block: integers times 2^-10.
K4_HD float block_dot_e2m1_e4m3(const uint8_t* w16, const uint8_t* x) {
  int64_t s = 0;
  bool nan = false;
  for (int i = 0; i < kBlockK; ++i) {
    const uint8_t nib = (i & 1) ? fp4_hi(w16[i / 2]) : fp4_lo(w16[i / 2]);
    nan = nan || e4m3_is_nan(x[i]);
    s += int64_t(e2m1_to_int_x2(nib)) * int64_t(e4m3_to_int_x512(x[i]));
  }
  return nan ? f32_from_bits(kCanonicalNan) : round_block_sum(s, 10);
}

// The same block sums from operands already decoded to integers (E4M3 x 2^9, E2M1 x 2), as
// the model and the kernels compute them; equal to the byte forms above by construction (same
// exact sum, same one rounding). any_nan: an element of either operand was NaN. Acc: int64_t
// holds every block (E4M3 x E4M3 below 2^41); int32_t holds E2M1 x E4M3 (below 2^27) and
// vectorizes twice as wide on the host.
template <typename Acc = int64_t>
K4_HD float block_dot_ints(const int32_t* a, const int32_t* b, bool any_nan, int frac_bits) {
  Acc s = 0;
  for (int i = 0; i < kBlockK; ++i) s += Acc(a[i]) * Acc(b[i]);
  return any_nan ? f32_from_bits(kCanonicalNan) : round_block_sum(int64_t(s), frac_bits);
}

// mfma_f32_16x16x32_fp8_fp8: one block, unscaled.
K4_HD float mma_fp8_k32(float c, const uint8_t* a32, const uint8_t* b32) {
  return c + block_dot_e4m3(a32, b32);
}

// mfma_scale_f32_16x16x128_f8f6f4 with E4M3 both sides and unit scales (127, 127).
K4_HD float mma_fp8_k128_unit(float c, const uint8_t* a128, const uint8_t* b128) {
  for (int blk = 0; blk < 4; ++blk) c = c + block_dot_e4m3(a128 + 32 * blk, b128 + 32 * blk);
  return c;
}

// mfma_scale_f32_16x16x128_f8f6f4, A = E2M1 (64 packed bytes), B = E4M3, E8M0 per block.
K4_HD float mma_f4f8_k128(float c, const uint8_t* w64, const uint8_t* sa4, const uint8_t* x128,
                          const uint8_t* sb4) {
  for (int blk = 0; blk < 4; ++blk)
    c = c + scale_block(block_dot_e2m1_e4m3(w64 + 16 * blk, x128 + 32 * blk), sa4[blk], sb4[blk]);
  return c;
}

// The same instruction with an E4M3 A (the MXFP8 shared expert variant).
K4_HD float mma_f8f8_k128(float c, const uint8_t* w128, const uint8_t* sa4, const uint8_t* x128,
                          const uint8_t* sb4) {
  for (int blk = 0; blk < 4; ++blk)
    c = c + scale_block(block_dot_e4m3(w128 + 32 * blk, x128 + 32 * blk), sa4[blk], sb4[blk]);
  return c;
}

}  // namespace k4
