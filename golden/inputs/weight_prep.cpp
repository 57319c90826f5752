// weight_prep.cpp -- see weight_prep.hpp.
#include "golden/inputs/weight_prep.hpp"

#include <cmath>
#include <stdexcept>

#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/mx.hpp"

namespace k4::prep {

const char* mx_scale_name(MxScale m) { return m == MxScale::Even ? "mxfp4-even" : "mxfp4-floor"; }

MxScale mx_scale_from(const std::string& s) {
  if (s == "even") return MxScale::Even;
  if (s == "floor") return MxScale::Floor;
  throw std::invalid_argument("--mx-scale '" + s + "' is neither even (Quark's rule, the MXFP4 release) nor floor (OCP)");
}

float ptpc_fp8_row(const float* x, int n, uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));  // fmaxf: a NaN element is skipped
  const float scale = std::fmax(amax / 448.0f, f32_from_bits(kPtpcMinScaleBits));
  for (int i = 0; i < n; ++i) {
    const float q = std::fmax(std::fmin(x[i] / scale, 448.0f), -448.0f);  // fminf then fmaxf: NaN -> 448
    codes[i] = e4m3_bits(q, Fp8Overflow::Saturate);
  }
  return scale;
}

namespace {
// Quark's "even" scale: the block max rounded at significand 1.75 to a power of two, minus 2.
uint8_t even_scale(float amax) {
  const uint32_t a = (f32_bits(amax) + 0x200000u) & 0xFF800000u;
  const int ex = int((a >> 23) & 0xFFu);
  int e = ex == 0 ? -127 : (ex == 255 ? 127 : ex - 127 - 2);
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return uint8_t(e + 127);
}
}  // namespace

uint8_t mxfp4_block(const float* v, MxScale rule, uint8_t* nib32) {
  if (rule == MxScale::Floor) return mxfp4_quantize_block(v, nib32);
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(v[i]));
  const uint8_t s = even_scale(amax);
  const double mul = std::ldexp(1.0, 127 - int(s));  // 2^-e: x * 2^-e is exact in double
  for (int i = 0; i < 32; ++i) nib32[i] = e2m1_bits_rne_sat(float(double(v[i]) * mul));
  return s;
}

void mxfp4_row(const float* x, int n, MxScale rule, uint8_t* packed, uint8_t* scales) {
  uint8_t nib[32];
  for (int b = 0; b < n / 32; ++b) {
    scales[b] = mxfp4_block(x + 32 * b, rule, nib);
    for (int i = 0; i < 16; ++i) packed[16 * b + i] = fp4_pack2(nib[2 * i], nib[2 * i + 1]);
  }
}

float mxfp8_value(uint8_t code, uint8_t scale) {
  if (scale == 0xFFu) return std::nanf("");
  return float(std::ldexp(double(e4m3_to_f32(code)), int(scale) - 127));
}

}  // namespace k4::prep
