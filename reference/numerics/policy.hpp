// policy.hpp -- the portable arithmetic policy: every hardware approximation the seed uses,
// defined once, deterministic, the same bits on any CPU and GPU (docs/numerics.md, "Policy").
//
//   seed          here            definition                                   error bound
//   hw_exp2       exp2_approx     double polynomial, exact 2^n, one RNE to f32  0.5 + 8.2e-10 ulp (measured)
//   hw_rcp        rcp_approx      IEEE 1.0f / x (correctly rounded)             0.5 ulp
//   hw_rsq        rsq_approx      f32(1.0 / sqrt(double(x)))                    0.5 ulp (measured: correctly rounded)
//   fdot2 (bf16)  fdot2_bf16      fma(a.hi, b.hi, fma(a.lo, b.lo, c))           two IEEE roundings
//   fx.max/min    fmax_ieee/...   IEEE maximum/minimum: NaN wins, -0 < +0
//   `/`           plain `/`       IEEE division (the seed's `/` is a true division)
//
// The bounds are measured exhaustively by tests/cpu/test_policy.cpp over every f32 of the
// domain each is used on (two exp2 results of 2^32 are not correctly rounded). rcp and rsq pass
// a NaN operand's payload through; every f32 a stage stores goes through canon_nan, so NaN payloads
// (x86 keeps the operand's, NVIDIA makes 0x7FFFFFFF) never reach a stored bit.
#pragma once
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/hd.hpp"

namespace k4 {

// log2(e) and the other constants as the seed's Python floats become f32 immediates.
constexpr float kLog2e = 1.4426950408889634f;

K4_HD float canon_nan(float x) { return is_nan(x) ? f32_from_bits(kCanonicalNan) : x; }

K4_HD double fma_f64(double a, double b, double c) {
#if defined(K4_DEVICE_COMPILE) && (defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__))
  return __fma_rn(a, b, c);
#else
  return __builtin_fma(a, b, c);
#endif
}
K4_HD float fma_f32(float a, float b, float c) {
#if defined(K4_DEVICE_COMPILE) && (defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__))
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}
K4_HD double sqrt_f64(double x) {
#if defined(K4_DEVICE_COMPILE) && (defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__))
  return __dsqrt_rn(x);
#else
  return __builtin_sqrt(x);
#endif
}

// hw_exp2. x is split as n + f with n = rint(x), f in [-1/2, 1/2] exact; 2^f by its Taylor
// series in f ln2 to degree 13 (truncation < 2^-60), Horner with fma; 2^n exact from bits;
// one rounding to f32 (which also gives IEEE underflow to subnormals and overflow to Inf).
K4_HD float exp2_approx(float x) {
  if (is_nan(x)) return f32_from_bits(kCanonicalNan);
  double xd = double(x);
  xd = xd > 200.0 ? 200.0 : (xd < -200.0 ? -200.0 : xd);
  const double shifter = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  const double n = (xd + shifter) - shifter;
  const double f = xd - n;
  // c_k = ln(2)^k / k!
  const double c[14] = {1.0,
                        0.69314718055994530942,
                        0.24022650695910071233,
                        0.055504108664821579953,
                        0.0096181291076284771620,
                        0.0013333558146428443423,
                        1.5403530393381609954e-4,
                        1.5252733804059840280e-5,
                        1.3215486790144309488e-6,
                        1.0178086009239699727e-7,
                        7.0549116208011233298e-9,
                        4.4455382718708114975e-10,
                        2.5678435993488202381e-11,
                        1.3691488853904124338e-12};
  double p = c[13];
  for (int k = 12; k >= 0; --k) p = fma_f64(p, f, c[k]);
  return float(p * pow2_f64(int(n)));
}

// hw_rcp: correctly rounded reciprocal.
K4_HD float rcp_approx(float x) { return 1.0f / x; }

// hw_rsq: 1/sqrt(x) through double (both operations correctly rounded), then one rounding.
K4_HD float rsq_approx(float x) { return float(1.0 / sqrt_f64(double(x))); }

// fx.max / fx.min: IEEE 754-2019 maximum / minimum (NaN propagates; -0 orders below +0).
K4_HD float fmax_ieee(float a, float b) {
  if (is_nan(a) || is_nan(b)) return f32_from_bits(kCanonicalNan);
  if (a == b) return (f32_bits(a) & 0x80000000u) ? b : a;
  return a > b ? a : b;
}
K4_HD float fmin_ieee(float a, float b) {
  if (is_nan(a) || is_nan(b)) return f32_from_bits(kCanonicalNan);
  if (a == b) return (f32_bits(a) & 0x80000000u) ? a : b;
  return a < b ? a : b;
}
K4_HD float fabs_f32(float x) { return f32_from_bits(f32_bits(x) & 0x7FFFFFFFu); }

// rocdl.fdot2_f32_bf16(a, b, c, clamp=False): a.lo*b.lo + a.hi*b.hi + c, low pair first.
// Portable definition: two fused multiply-adds (each product exact, one rounding each).
K4_HD float fdot2_bf16(uint32_t a_pair, uint32_t b_pair, float c) {
  const float lo = fma_f32(bf16_pair_lo(a_pair), bf16_pair_lo(b_pair), c);
  return fma_f32(bf16_pair_hi(a_pair), bf16_pair_hi(b_pair), lo);
}

// The seed's sigmoid (router and swiglu): rcp(1 + exp2(x * -log2 e)).
K4_HD float sigmoid_approx(float x) { return rcp_approx(1.0f + exp2_approx(x * -kLog2e)); }

}  // namespace k4
