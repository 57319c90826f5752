// mx.hpp -- MX block quantization as the seed does it (mx8_scale / mx8_q), and the OCP
// MXFP4 rule the checkpoint loader uses for BF16 weights.
//
// MXFP8 ("RoundUp", aiter's rule, seed mx8_scale):
//   amax = max over the 32-block of max(v, -v)            (fmax_ieee: NaN wins)
//   bits = f32_bits(amax * f32(1/448)); e = bits[30:23] + (bits[22:0] != 0), clamped [1, 254]
//   inv  = rcp(2^(e - 127))                                (e << 23 as f32 bits)
//   q    = E4M3(max(min(v * inv, 448), -448))              (clamped first; NaN -> 0x7F)
// NaN amax gives e = 254; an all-zero block gives e = 1 and zeros.
#pragma once
#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/policy.hpp"

namespace k4 {

K4_HD float mx8_amax_step(float amax, float v) { return fmax_ieee(amax, fmax_ieee(v, -v)); }
K4_HD float mx8_block_amax(const float* v, int n) {
  float amax = fmax_ieee(v[0], -v[0]);
  for (int i = 1; i < n; ++i) amax = mx8_amax_step(amax, v[i]);
  return amax;
}

struct Mx8Scale {
  uint8_t e;   // the E8M0 byte, 1..254
  float inv;   // rcp(2^(e-127))
};

K4_HD Mx8Scale mx8_scale_of_amax(float amax) {
  const uint32_t bits = f32_bits(amax * kInvFp8Max);
  int32_t e = int32_t((bits >> 23) & 0xFFu);
  e += (bits & 0x7FFFFFu) != 0u ? 1 : 0;
  e = e > 254 ? 254 : (e < 1 ? 1 : e);
  return Mx8Scale{uint8_t(e), rcp_approx(f32_from_bits(uint32_t(e) << 23))};
}

K4_HD float mx8_q(float v, float inv) { return fmax_ieee(fmin_ieee(v * inv, kFp8Max), -kFp8Max); }
K4_HD uint8_t mx8_quant(float v, float inv) { return e4m3_bits(mx8_q(v, inv), Fp8Overflow::Saturate); }

// One 32-block -> 32 E4M3 codes and its scale byte.
K4_HD uint8_t mx8_quantize_block(const float* v, uint8_t* q32) {
  const Mx8Scale s = mx8_scale_of_amax(mx8_block_amax(v, 32));
  for (int i = 0; i < 32; ++i) q32[i] = mx8_quant(v[i], s.inv);
  return s.e;
}

// OCP MXFP4 (spec v1.0 section 6.3): shared exponent floor(log2(amax)) - 2 (E2M1's emax),
// elements v / 2^x rounded to nearest even and saturated at +-6; an all-zero block takes the
// smallest scale. Used when a checkpoint's experts come as BF16.
K4_HD uint8_t mxfp4_quantize_block(const float* v, uint8_t* nib32) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = fmax_ieee(amax, fabs_f32(v[i]));
  int x = -127;
  if (amax > 0.0f && !is_nan(amax)) {
    const uint32_t b = f32_bits(amax);
    const int ex = int(b >> 23);
    int fl = ex == 0 ? -127 : ex - 127;  // floor(log2) for normals; subnormals clamp below
    if (ex == 0) { uint32_t m = b & 0x7FFFFFu; fl = -127; while (m < 0x400000u) { m <<= 1; --fl; } }
    x = fl - 2;
  }
  x = x < -127 ? -127 : (x > 127 ? 127 : x);
  const double inv = pow2_f64(-x);
  for (int i = 0; i < 32; ++i) nib32[i] = e2m1_bits_rne_sat(float(double(v[i]) * inv));
  return uint8_t(x + 127);
}

}  // namespace k4
