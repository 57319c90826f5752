// e4m3.hpp -- OCP FP8 E4M3 ("e4m3fn"): bias 7, no infinities, S.1111.111 is NaN, max 448.
//
// Contract (docs/numerics.md, "E4M3"): f32 -> E4M3 rounds to nearest, ties to even, in two
// rules that differ only past the range:
//  - Saturate (the call sites that clamp first, mx8_q; H200's cvt.rn.satfinite): |x| > 464
//    and +-Inf become +-448.
//  - NoSaturate (the seed's fp8_pack4 where nothing clamps: q -> E4M3, the merge quant, P):
//    |x| > 464 and +-Inf become the NaN code of x's sign (0x7F / 0xFF).
// 464 is the tie between 448 and the NaN code and goes to even (448) in both. NaN of either
// sign becomes 0x7F in both rules. Subnormals are kept (min 2^-9; 2^-10 ties to 0).
#pragma once
#include "reference/numerics/hd.hpp"

namespace k4 {

enum class Fp8Overflow { Saturate, NoSaturate };

constexpr float kFp8Max = 448.0f;
constexpr float kInvFp8Max = float(1.0 / 448.0);  // the seed's fx.Float32(1.0 / FP8_MAX)

K4_HD bool e4m3_is_nan(uint8_t b) { return (b & 0x7Fu) == 0x7Fu; }

K4_HD float e4m3_to_f32(uint8_t b) {
  const uint32_t s = uint32_t(b >> 7) << 31;
  const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  if (e == 15u && m == 7u) return f32_from_bits(kCanonicalNan);
  if (e == 0u) {  // subnormal: m * 2^-9, exact in f32
    const float v = float(m) * (1.0f / 512.0f);
    return f32_from_bits(f32_bits(v) | s);
  }
  return f32_from_bits(s | ((e + 120u) << 23) | (m << 20));
}

// x * 2^9 as an exact integer (|v| <= 229376): the block-exact dots' operand. NaN -> 0
// (callers test e4m3_is_nan first).
K4_HD int32_t e4m3_to_int_x512(uint8_t b) {
  const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  int32_t mag = (e == 0u) ? int32_t(m) : int32_t((8u + m) << (e - 1u));
  if (e4m3_is_nan(b)) mag = 0;
  return (b & 0x80u) ? -mag : mag;
}

// Step by step, as ml_dtypes' converter: non-finite, range, exponent, RNE, assemble.
K4_HD uint8_t e4m3_bits(float x, Fp8Overflow rule) {
  const uint32_t u = f32_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  // 1. NaN: one code for every NaN.
  if (a > 0x7F800000u) return 0x7Fu;
  // 2. Past the tie at 464 (0x43E80000), and Inf.
  if (a > 0x43E80000u) return rule == Fp8Overflow::Saturate ? uint8_t(sign | 0x7Eu) : uint8_t(sign | 0x7Fu);
  if (a == 0u) return sign;
  // 3. Exponent: the f32 significand and the E4M3 quantum 2^(te - 3), te >= -6.
  int ea = int(a >> 23) - 127;
  uint32_t sig = a & 0x7FFFFFu;
  if (ea == -127) ea = -126;  // f32 subnormal: no implicit bit
  else sig |= 0x800000u;
  const int te = ea < -6 ? -6 : ea;
  const int sh = te - ea + 20;  // value / quantum = sig >> sh
  // 4. Round to nearest even.
  uint32_t r = 0;
  if (sh <= 24) {
    r = sig >> sh;
    const uint32_t rem = sig & ((1u << sh) - 1u), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
  }
  // 5. Assemble: r in [0, 16]; r == 16 carries into the exponent, r >= 8 is normal.
  int ef = te + 7;
  if (r >= 16u) { r >>= 1; ++ef; }
  if (r < 8u) return uint8_t(sign | r);  // subnormal (te == -6) or zero
  return uint8_t(sign | (uint32_t(ef) << 3) | (r - 8u));
}

// The seed's fp8_pack4 (NoSaturate): four f32 -> one word, element 0 in the low byte.
K4_HD uint32_t fp8_pack4(float a, float b, float c, float d, Fp8Overflow rule = Fp8Overflow::NoSaturate) {
  return uint32_t(e4m3_bits(a, rule)) | (uint32_t(e4m3_bits(b, rule)) << 8) |
         (uint32_t(e4m3_bits(c, rule)) << 16) | (uint32_t(e4m3_bits(d, rule)) << 24);
}

}  // namespace k4
