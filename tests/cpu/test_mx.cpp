// test_mx.cpp -- MX block quantization (mx.hpp): the E8M0 "RoundUp" scale of the seed's
// mx8_scale over every non-negative f32 amax (suite "exhaustive"), the MXFP8 block quantizer
// and mx8_q, and the OCP MXFP4 quantizer (suite "numerics"), against references by value and
// a float64 round-trip bound.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "reference/numerics/butterfly.hpp"
#include "reference/numerics/mx.hpp"

namespace {

using k4::Fp8Overflow;

uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
std::string hx(uint64_t v, int digits = 8) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llx", digits, (unsigned long long)v);
  return buf;
}
struct Timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double s() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};
struct SplitMix {
  uint64_t s;
  explicit SplitMix(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1p-53; }
  int range(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }
};

// ---- independent references ----
// E4M3 values by the OCP formula; NaN codes flagged.
double e4m3_value(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double mag = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}
bool e4m3_nan(int c) { return (c & 0x7F) == 0x7F; }

// Expected E4M3 code of a value already clamped to [-448, 448] (or NaN): nearest, ties even.
int ref_e4m3_clamped(double x) {
  if (std::isnan(x)) return 0x7F;
  const bool neg = std::signbit(x);
  const double a = std::fabs(x);
  double r = 0.0;
  if (a != 0.0) {
    int ex;
    std::frexp(a, &ex);
    const double q = std::ldexp(1.0, std::max(ex - 1, -6) - 3);
    const double t = a / q, n = std::floor(t), f = t - n;
    r = (f > 0.5 || (f == 0.5 && std::fmod(n, 2.0) != 0.0) ? n + 1 : n) * q;
  }
  for (int c = 0; c < 256; ++c)
    if (!e4m3_nan(c) && e4m3_value(c) == (neg ? -r : r) && ((c >> 7) != 0) == neg) return c;
  return -1;
}

const double kE2M1Mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
double e2m1_value(int nib) { return (nib & 8) ? -kE2M1Mag[nib & 7] : kE2M1Mag[nib & 7]; }
int ref_e2m1(double x) {  // RNE, saturating at 6, sign kept (incl. -0)
  const int s = std::signbit(x) ? 8 : 0;
  const double a = std::fabs(x);
  if (a >= 6.0) return s | 7;
  int k = 0;
  while (k < 7 && kE2M1Mag[k + 1] <= a) ++k;
  const double dlo = a - kE2M1Mag[k], dhi = kE2M1Mag[k + 1] - a;
  if (dlo < dhi) return s | k;
  if (dhi < dlo) return s | (k + 1);
  return s | (k % 2 == 0 ? k : k + 1);
}

// The seed's constant, computed here: fx.Float32(1.0 / 448).
const float kInv448 = float(1.0 / 448.0);

// mx.hpp's rule stated as a search: the smallest e in [1, 254] with 2^(e-127) >= p, where
// p = f32(amax * f32(1/448)); 254 when there is none (p > 2^127, Inf, NaN).
int ref_scale_e(float amax) {
  const float p = amax * kInv448;  // the f32 product is the definition
  if (std::isnan(p) || std::isinf(p)) return 254;
  if (p <= 0.0f) return 1;
  int ex;
  const double f = std::frexp(double(p), &ex);  // p = f * 2^ex, f in [0.5, 1)
  const int k = (f == 0.5) ? ex - 1 : ex;       // smallest k with 2^k >= p
  return std::min(254, std::max(1, k + 127));
}
// The same without the f32 rounding: smallest e with 448 * 2^(e-127) >= amax (exact in double).
int exact_scale_e(float amax) {
  if (std::isnan(amax) || std::isinf(amax)) return 254;
  if (amax == 0.0f) return 1;
  int e = std::max(1, std::ilogb(double(amax)) - 8 + 127 - 2);  // a guess from below
  while (e < 254 && 448.0 * std::ldexp(1.0, e - 127) < double(amax)) ++e;
  return e;
}
bool scale_ok(float amax, k4::Mx8Scale s) {
  const int e = ref_scale_e(amax);
  return s.e == e && bits_of(s.inv) == bits_of(float(std::pow(2.0, 127 - e)));
}

// A block of 32 f32 values around 2^base with a spread of `spread` binades, random signs.
std::array<float, 32> random_block(SplitMix& r, int base, int spread) {
  std::array<float, 32> v;
  for (float& x : v) {
    const double mag = (1.0 + r.uniform()) * std::ldexp(1.0, base - r.range(0, spread));
    x = float((r.next() & 1) ? -mag : mag);
    if (r.next() % 29 == 0) x = 0.0f;
  }
  return v;
}

// |y - deq| within half an E4M3 quantum at |y| (y = x / scale), plus the f32 subnormal
// rounding of v * inv; or the saturation at 448.
bool mx8_roundtrip_ok(float x, int code, int e) {
  if (e4m3_nan(code)) return false;
  const double scale = std::ldexp(1.0, e - 127);
  const double y = double(x) / scale, deq = e4m3_value(code);
  if (std::fabs(y) > 448.0) return deq == (y > 0 ? 448.0 : -448.0);
  if (y == 0.0) return deq == 0.0;
  int ex;
  std::frexp(std::fabs(y), &ex);
  const double half_q = std::ldexp(1.0, std::max(ex - 1, -6) - 4);
  return std::fabs(y - deq) <= half_q + 0x1p-149 && std::signbit(deq) == std::signbit(y);
}

}  // namespace

TEST_SUITE("numerics") {

TEST_CASE("mx8_scale_of_amax: special and boundary amax") {
  CHECK(bits_of(k4::kInvFp8Max) == bits_of(kInv448));
  CHECK(double(k4::kInvFp8Max) > 1.0 / 448.0);  // f32(1/448) rounds up (8/7 = 1.001001..b)
  const struct { float amax; int e; const char* why; } tab[] = {
      {0.0f, 1, "zero block"},
      {-0.0f, 1, "-0"},
      {float_of(0x00000001u), 1, "f32 min subnormal"},
      {448.0f * 0x1p-126f, 1, "448 * 2^-126"},
      {448.0f * 0x1p-125f, 2, "448 * 2^-125"},
      {224.0f, 126, "224: p = 0.5"},
      {448.0f, 127, "448: p = 1 exactly"},
      {std::nextafter(448.0f, 0.0f), 127, "448 - ulp"},
      {std::nextafter(448.0f, 1e9f), 128, "448 + ulp"},
      {1.0f, 119, "1: p = 2^-8.8"},
      {448.0f * 0x1p100f, 227, "448 * 2^100"},
      {FLT_MAX, 247, "FLT_MAX: p = 2^119.2"},
      {INFINITY, 254, "Inf"},
      {float_of(0x7FC00000u), 254, "NaN"},
      {float_of(0x7F800001u), 254, "sNaN"},
      {float_of(0xFFC00000u), 254, "-NaN"},
  };
  for (const auto& t : tab) {
    CAPTURE(t.why);
    const k4::Mx8Scale s = k4::mx8_scale_of_amax(t.amax);
    CHECK(int(s.e) == t.e);
    CHECK(ref_scale_e(t.amax) == t.e);
    CHECK(scale_ok(t.amax, s));
  }
  // 448 * 2^k: exactly e = 127 + k over the whole range (p is then exactly 2^k).
  for (int k = -126; k <= 119; ++k) {
    CAPTURE(k);
    CHECK(int(k4::mx8_scale_of_amax(float(448.0 * std::ldexp(1.0, k))).e) == std::max(1, 127 + k));
  }
}

TEST_CASE("mx8_scale_of_amax: the inverse scale is exact for every reachable e") {
  // A finite amax reaches e <= 247 (FLT_MAX); Inf and NaN give 254; 248..253 are unreachable.
  for (int e = 1; e <= 254; ++e) {
    if (e > 247 && e < 254) continue;
    CAPTURE(e);
    const float amax = e == 254 ? INFINITY : (e == 247 ? FLT_MAX : float(448.0 * std::ldexp(1.0, e - 127)));
    const k4::Mx8Scale s = k4::mx8_scale_of_amax(amax);
    REQUIRE(int(s.e) == e);
    CHECK(double(s.inv) == std::pow(2.0, 127 - e));       // 2^126 .. 2^-127 (subnormal), exact
    CHECK(double(s.inv) * std::ldexp(1.0, e - 127) == 1.0);
  }
}

TEST_CASE("mx8_block_amax, mx8_q, mx8_quant: NaN, -0, clamp") {
  const float a[4] = {-3.0f, 2.0f, -0.0f, 1.0f};
  CHECK(k4::mx8_block_amax(a, 4) == 3.0f);
  const float z[2] = {-0.0f, -0.0f};
  CHECK(bits_of(k4::mx8_block_amax(z, 2)) == 0u);  // max(-0, +0) = +0
  const float n[3] = {1.0f, float_of(0xFFC00001u), 2.0f};
  CHECK(bits_of(k4::mx8_block_amax(n, 3)) == 0x7FC00000u);
  const float inf[2] = {1.0f, -INFINITY};
  CHECK(k4::mx8_block_amax(inf, 2) == INFINITY);
  CHECK(k4::mx8_q(1000.0f, 1.0f) == 448.0f);
  CHECK(k4::mx8_q(-1000.0f, 1.0f) == -448.0f);
  CHECK(k4::mx8_q(INFINITY, 0x1p-127f) == 448.0f);
  CHECK(k4::mx8_q(-INFINITY, 0x1p-127f) == -448.0f);
  CHECK(bits_of(k4::mx8_q(float_of(0xFFC00000u), 1.0f)) == 0x7FC00000u);
  CHECK(bits_of(k4::mx8_q(-0.0f, 4.0f)) == 0x80000000u);
  CHECK(k4::mx8_q(3.0f, 2.0f) == 6.0f);
  CHECK(k4::mx8_q(448.0f, 1.0f) == 448.0f);
  CHECK(k4::mx8_quant(500.0f, 1.0f) == 0x7E);
  CHECK(k4::mx8_quant(-500.0f, 1.0f) == 0xFE);
  CHECK(k4::mx8_quant(float_of(0xFFC00000u), 1.0f) == 0x7F);
  CHECK(k4::mx8_quant(-0.0f, 1.0f) == 0x80);
  CHECK(k4::mx8_quant(1.0625f, 1.0f) == 0x38);  // RNE after the clamp
}

// The fast up/gate quantizes mid a warp a block: each lane's fmax_ieee(x, -x), then a butterfly
// over the 32 lanes (offsets 16 .. 1). IEEE maximum is associative and commutative, so every
// lane must end with mx8_block_amax's bits -- on blocks mixing NaNs (any payload), +-0, +-Inf,
// subnormals and normals; a max that drops a NaN by order (a > b ? a : b) must not.
TEST_CASE("MXFP8 amax by a butterfly over 32 lanes is mx8_block_amax, bit for bit") {
  const uint32_t pool[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x7F800001u,
                           0x00000001u, 0x807FFFFFu, 0x3F800000u, 0xBF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x43E00000u};
  const auto butterfly = [](const float (&x)[32], float (*mx)(float, float)) {
    static const int offsets[] = {16, 8, 4, 2, 1};
    float lane[32];
    for (int i = 0; i < 32; ++i) lane[i] = k4::fmax_ieee(x[i], -x[i]);
    k4::butterfly(lane, 32, offsets, 5, mx);
    for (int i = 1; i < 32; ++i)
      if (bits_of(lane[i]) != bits_of(lane[0])) return 0xDEADBEEFu;  // lanes disagree
    return bits_of(lane[0]);
  };
  const auto order_max = [](float a, float b) { return a > b ? a : b; };  // planted: NaN lost by order
  SplitMix rng(20261203);
  size_t bad = 0, caught = 0, nan_blocks = 0;
  const int blocks = 200000;
  for (int n = 0; n < blocks; ++n) {
    float x[32];
    const int specials = int(rng.next() % 4);  // 0: all random normals
    for (int i = 0; i < 32; ++i)
      x[i] = specials != 0 && rng.next() % (8 / specials) == 0 ? float_of(pool[rng.next() % (sizeof pool / 4)])
                                                               : float_of(uint32_t(rng.next()) & 0xBFFFFFFFu);
    const uint32_t want = bits_of(k4::mx8_block_amax(x, 32));
    bad += butterfly(x, k4::fmax_ieee) != want;
    caught += butterfly(x, +order_max) != want;
    nan_blocks += want == 0x7FC00000u;
  }
  CHECK(bad == 0);
  CHECK(nan_blocks > size_t(blocks) / 20);
  CHECK(caught > 0);
}

TEST_CASE("mx8_quantize_block: zero, -0, NaN and Inf blocks") {
  uint8_t q[32];
  float v[32];
  std::fill(v, v + 32, 0.0f);
  CHECK(k4::mx8_quantize_block(v, q) == 1);
  for (int i = 0; i < 32; ++i) CHECK(q[i] == 0x00);
  std::fill(v, v + 32, -0.0f);
  CHECK(k4::mx8_quantize_block(v, q) == 1);
  for (int i = 0; i < 32; ++i) CHECK(q[i] == 0x80);  // zeros, sign kept
  // A NaN element: amax is NaN -> e = 254 (inv 2^-127); the NaN -> 0x7F, the rest ~0.
  for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u}) {
    CAPTURE(hx(nan));
    for (int i = 0; i < 32; ++i) v[i] = float(i + 1) * (i % 2 ? -1.0f : 1.0f);
    v[5] = float_of(nan);
    CHECK(k4::mx8_quantize_block(v, q) == 254);
    CHECK(q[5] == 0x7F);
    for (int i = 0; i < 32; ++i)
      if (i != 5) CHECK(int(q[i]) == ref_e4m3_clamped(double(v[i] * 0x1p-127f)));
    CHECK(q[0] == 0x00);
    CHECK(q[1] == 0x80);
  }
  // An Inf element: amax Inf -> e = 254; Inf * 2^-127 = Inf, clamped to 448 -> 0x7E.
  for (int i = 0; i < 32; ++i) v[i] = 1.0f;
  v[3] = INFINITY;
  v[4] = -INFINITY;
  CHECK(k4::mx8_quantize_block(v, q) == 254);
  CHECK(q[3] == 0x7E);
  CHECK(q[4] == 0xFE);
  CHECK(q[0] == 0x00);
  // The block maximum lands on 448 exactly when amax = 448 * 2^k.
  for (int i = 0; i < 32; ++i) v[i] = float(i) * 0x1p-30f;
  v[17] = -448.0f * 0x1p-20f;
  CHECK(k4::mx8_quantize_block(v, q) == 127 - 20);
  CHECK(q[17] == 0xFE);
}

TEST_CASE("mx8_quantize_block: random blocks, exact codes and the float64 round-trip bound") {
  SplitMix r(3);
  int bad = 0, n_blocks = 0, n_nonzero = 0, n_sub = 0;
  for (int it = 0; it < 20000; ++it) {
    const int base = r.range(-140, 127), spread = it % 3 == 0 ? 2 : (it % 3 == 1 ? 12 : 40);
    std::array<float, 32> v = random_block(r, base, spread);
    uint8_t q[32];
    const int e = k4::mx8_quantize_block(v.data(), q);
    ++n_blocks;
    double amax = 0;
    for (float x : v) amax = std::max(amax, std::fabs(double(x)));
    if (e != ref_scale_e(float(amax)) && bad++ < 8) FAIL_CHECK("block " << it << ": e " << e << " want " << ref_scale_e(float(amax)));
    const double scale = std::ldexp(1.0, e - 127);
    // float64 check of the scale choice: amax / scale in (224, 448] up to f32 rounding, or e = 1.
    if (amax / scale > 448.0 * (1 + 0x1p-22) || (e > 1 && amax / scale <= 224.0 * (1 - 0x1p-22)))
      if (bad++ < 8) FAIL_CHECK("block " << it << ": amax " << amax << " e " << e << " off the (224, 448] window");
    const float inv = float(std::ldexp(1.0, 127 - e));
    for (int i = 0; i < 32; ++i) {
      const int want = ref_e4m3_clamped(std::max(-448.0, std::min(448.0, double(v[i] * inv))));
      if ((q[i] != want || !mx8_roundtrip_ok(v[i], q[i], e)) && bad++ < 8)
        FAIL_CHECK("block " << it << " elem " << i << ": x " << hx(bits_of(v[i])) << " e " << e << " code "
                            << hx(q[i], 2) << " want " << hx(want, 2));
      if (q[i] & 0x7F) ++n_nonzero;
      if ((q[i] & 0x78) == 0 && (q[i] & 7)) ++n_sub;
    }
  }
  CHECK(bad == 0);
  CHECK(n_nonzero > n_blocks * 16);  // not a test of zeros
  CHECK(n_sub > 100);                // E4M3 subnormal codes are exercised
}

TEST_CASE("mx8 scale: the f32-product rule and the exact rule near 448 * 2^k") {
  // mx.hpp defines e on f32(amax * f32(1/448)). Every f32 amax within 4096 ulps of 448 * 2^k,
  // k in [-130, 119]: the header follows the f32 rule; count where the exact rule
  // (smallest e with 448 * 2^(e-127) >= amax) would differ.
  int bad = 0;
  long differ = 0, n = 0;
  for (int k = -130; k <= 119; ++k) {
    const uint32_t c = bits_of(float(448.0 * std::ldexp(1.0, k)));
    for (int64_t d = -4096; d <= 4096; ++d) {
      const uint32_t u = uint32_t(int64_t(c) + d);
      const float amax = float_of(u);
      ++n;
      const k4::Mx8Scale s = k4::mx8_scale_of_amax(amax);
      if (!scale_ok(amax, s) && bad++ < 8) FAIL_CHECK("amax " << hx(u) << ": e " << int(s.e) << " want " << ref_scale_e(amax));
      if (exact_scale_e(amax) != ref_scale_e(amax)) ++differ;
    }
  }
  CHECK(bad == 0);
  MESSAGE("mx8 scale near 448*2^k: " << n << " amax, " << differ
          << " where the exact-quotient rule would pick another e than the f32-product rule");
}

TEST_CASE("mxfp4_quantize_block: zero block, scale formula, RNE codes, round-trip bound") {
  uint8_t nib[32];
  float v[32];
  std::fill(v, v + 32, 0.0f);
  CHECK(k4::mxfp4_quantize_block(v, nib) == 0);  // smallest scale, 2^-127
  for (int i = 0; i < 32; ++i) CHECK(nib[i] == 0);
  SplitMix r(5);
  int bad = 0, n_sat = 0, n_nonzero = 0;
  for (int it = 0; it < 20000; ++it) {
    const int base = r.range(-149, 127), spread = it % 2 ? 3 : 20;
    std::array<float, 32> b = random_block(r, base, spread);
    if (it % 7 == 0) b[it % 32] = float_of(0x00000001u) * float(1 + it % 5);  // subnormals inside
    const int sb = k4::mxfp4_quantize_block(b.data(), nib);
    double amax = 0;
    for (float x : b) amax = std::max(amax, std::fabs(double(x)));
    // OCP v1.0 6.3: X = floor(log2(amax)) - emax(E2M1) = ilogb(amax) - 2, as an E8M0 byte.
    const int x = amax == 0.0 ? -127 : std::min(127, std::max(-127, std::ilogb(amax) - 2));
    if (sb != x + 127 && bad++ < 8) FAIL_CHECK("block " << it << ": scale byte " << sb << " want " << x + 127);
    for (int i = 0; i < 32; ++i) {
      const double y = double(b[i]) * std::ldexp(1.0, -x);
      const int want = ref_e2m1(y);
      const double deq = e2m1_value(nib[i]);
      const double a = std::fabs(y);
      const double half_q = a < 2 ? 0.25 : (a < 4 ? 0.5 : 1.0);
      const bool bound = a > 6 ? deq == (y > 0 ? 6.0 : -6.0) : std::fabs(y - deq) <= half_q;
      if ((nib[i] != want || !bound) && bad++ < 8)
        FAIL_CHECK("block " << it << " elem " << i << ": x " << hx(bits_of(b[i])) << " nibble " << int(nib[i])
                            << " want " << want);
      if (a > 6) ++n_sat;
      if (nib[i] & 7) ++n_nonzero;
    }
  }
  CHECK(bad == 0);
  CHECK(n_sat > 100);  // amax / 2^X is in [4, 8): the (6, 8) part saturates
  CHECK(n_nonzero > 200000);
  // Edges: subnormal amax clamps X at -127; FLT_MAX gives X = 125; Inf gives X = 126 (the
  // header's choice: OCP leaves non-finite blocks to the implementation).
  std::fill(v, v + 32, 0.0f);
  v[0] = float_of(0x00000003u);
  CHECK(k4::mxfp4_quantize_block(v, nib) == 0);
  v[0] = FLT_MAX;
  CHECK(k4::mxfp4_quantize_block(v, nib) == 125 + 127);
  CHECK(nib[0] == 7);  // FLT_MAX / 2^125 = 8 - : saturates to 6
  v[0] = INFINITY;
  v[1] = -1.0f;
  CHECK(k4::mxfp4_quantize_block(v, nib) == 126 + 127);
  CHECK(nib[0] == 7);
  CHECK(nib[1] == 8);  // -2^-126 -> -0
}

TEST_CASE("mx: planted errors are caught by the comparators") {
  for (float amax : {0.0f, 1.0f, 448.0f, 3e-30f, 7e20f, INFINITY}) {
    CAPTURE(amax);
    k4::Mx8Scale s = k4::mx8_scale_of_amax(amax);
    CHECK(scale_ok(amax, s));
    k4::Mx8Scale up = s, dn = s, inv2 = s;
    up.e = uint8_t(s.e + 1);
    dn.e = uint8_t(s.e - 1);
    inv2.inv = s.inv * 2.0f;
    CHECK_FALSE(scale_ok(amax, up));
    CHECK_FALSE(scale_ok(amax, dn));
    CHECK_FALSE(scale_ok(amax, inv2));
  }
  // A code one step off breaks the round-trip bound (non-tie values); so does a wrong scale.
  for (float x : {1.3f, -100.7f, 0.01f, 447.0f}) {
    CAPTURE(x);
    const int c = ref_e4m3_clamped(double(x));
    CHECK(mx8_roundtrip_ok(x, c, 127));
    CHECK_FALSE(mx8_roundtrip_ok(x, c + 1, 127));
    CHECK_FALSE(mx8_roundtrip_ok(x, c - 1, 127));
    CHECK_FALSE(mx8_roundtrip_ok(x, c, 128));
  }
  CHECK_FALSE(ref_e2m1(2.5) == 5);  // tie -> even (4), not 5
}

}  // TEST_SUITE numerics

TEST_SUITE("exhaustive") {

TEST_CASE("mx8_scale_of_amax: every non-negative f32 amax (incl. Inf, NaN)") {
  Timer tm;
  std::atomic<uint64_t> n_bad{0}, n_differ_exact{0};
  std::mutex mu;
  std::vector<std::array<uint32_t, 3>> first;
  float inv_of[256];
  double top_of[256];  // 448 * 2^(e-127): the largest amax that e covers exactly
  for (int e = 0; e < 256; ++e) {
    inv_of[e] = float(std::pow(2.0, 127 - e));
    top_of[e] = 448.0 * std::pow(2.0, e - 127);
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int chunk = 0; chunk < 256; ++chunk) {
    uint64_t bad_local = 0, differ = 0;
    for (uint32_t m = 0; m < (1u << 23); ++m) {
      const uint32_t u = (uint32_t(chunk) << 23) | m;
      const float amax = float_of(u);
      const k4::Mx8Scale s = k4::mx8_scale_of_amax(amax);
      const int e = ref_scale_e(amax);
      if (s.e != e || bits_of(s.inv) != bits_of(inv_of[e])) {
        if (++bad_local <= 4) {
          std::lock_guard<std::mutex> g(mu);
          first.push_back({u, uint32_t(s.e) << 24 | (bits_of(s.inv) >> 8), uint32_t(e)});
        }
      }
      // The exact rule, in double: 448 * 2^(e-128) < amax <= 448 * 2^(e-127), or a clamp.
      if (std::isfinite(amax) && e > 1 && e < 254)
        if (!(double(amax) <= top_of[e] && double(amax) > top_of[e - 1])) ++differ;
    }
    n_bad += bad_local;
    n_differ_exact += differ;
  }
  std::sort(first.begin(), first.end());
  for (size_t i = 0; i < first.size() && i < 8; ++i)
    FAIL_CHECK("mx8 scale mismatch: amax " << hx(first[i][0]) << " got e " << (first[i][1] >> 24) << " expected e "
                                           << first[i][2]);
  CHECK(n_bad.load() == 0);
  // Negative NaNs (the only negative amax an fmax_ieee chain cannot make, but cheap).
  for (uint32_t u : {0xFFC00000u, 0xFF800001u, 0xFFFFFFFFu}) CHECK(k4::mx8_scale_of_amax(float_of(u)).e == 254);
  MESSAGE("mx8_scale_of_amax exhaustive (2^31 amax): " << tm.s() << " s; amax where the exact-quotient rule "
          << "would differ from the f32-product rule: " << n_differ_exact.load());
}

}  // TEST_SUITE exhaustive
