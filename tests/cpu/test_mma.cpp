// test_mma.cpp -- the block-exact matrix-unit dots (mma.hpp) against exact arithmetic written
// another way: elements decoded by formula to doubles, each product (exact in double) turned
// into an integer count of 2^-18 (E4M3 x E4M3) or 2^-10 (E2M1 x E4M3) and summed as __int128;
// one RNE rounding to f32 by an integer rounding routine of this file; the E8M0 scaling as a
// second exact-integer rounding of M * 2^(E + sa + sb - 254); f32 accumulation in block order.
// Random blocks, adversarial blocks (extreme scales, subnormal and overflowing results,
// cancellation, NaN elements, extremes), the accumulation order, and planted wrong models.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "reference/numerics/mma.hpp"

namespace {

uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
std::string hx(uint64_t v, int digits = 8) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llx", digits, (unsigned long long)v);
  return buf;
}
struct SplitMix {
  uint64_t s;
  explicit SplitMix(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int range(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }
};

// ---- decode by formula ----
struct E4M3Values {
  double v[256];
  E4M3Values() {
    for (int c = 0; c < 256; ++c) {
      const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
      const double mag = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
      v[c] = s ? -mag : mag;
    }
  }
};
const E4M3Values kE4M3;
double e4m3_value(int c) { return kE4M3.v[c & 0xFF]; }
bool e4m3_nan(int c) { return (c & 0x7F) == 0x7F; }
const double kE2M1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

// value -> integer count of 2^-frac; the product of two of these formats' values is a
// multiple of 2^-18 (E4M3 x E4M3) or 2^-10 (E2M1 x E4M3) well inside double's 53 bits.
__int128 units(double v, int frac) {
  const double t = std::ldexp(v, frac);
  const int64_t n = int64_t(t);
  if (double(n) != t) FAIL("reference: " << v << " is not a multiple of 2^-" << frac);  // cannot happen
  return __int128(n);
}

// m * 2^e rounded once to f32, nearest even, with subnormals and overflow to Inf. m == 0 -> +0.
float round_exact(__int128 m, int e) {
  if (m == 0) return 0.0f;
  const bool neg = m < 0;
  const unsigned __int128 a = neg ? -(unsigned __int128)m : (unsigned __int128)m;
  int len = 0;
  for (unsigned __int128 t = a; t != 0; t >>= 1) ++len;
  const int lead = len - 1 + e;                // a * 2^e in [2^lead, 2^(lead+1))
  const int q = std::max(lead - 23, -149);     // the f32 quantum there
  const int sh = q - e;                        // low bits of a below the quantum
  unsigned __int128 n;
  if (sh <= 0) n = a << (-sh);
  else if (sh > len) n = 0;                    // below half a quantum
  else {
    n = a >> sh;
    const unsigned __int128 rem = a - (n << sh), half = (unsigned __int128)1 << (sh - 1);
    if (rem > half || (rem == half && (n & 1))) ++n;
  }
  const double v = std::ldexp(double(uint64_t(n)), q);  // n <= 2^24: exact
  const float f = v >= 0x1p128 ? INFINITY : float(v);
  return neg ? -f : f;
}

// A block's exact value and its two roundings.
struct RefBlock { bool nan; __int128 s; int frac; };
RefBlock ref_block_e4m3(const uint8_t* a, const uint8_t* b) {
  RefBlock r{false, 0, 18};
  for (int i = 0; i < 32; ++i) {
    if (e4m3_nan(a[i]) || e4m3_nan(b[i])) { r.nan = true; continue; }
    r.s += units(e4m3_value(a[i]) * e4m3_value(b[i]), 18);
  }
  return r;
}
RefBlock ref_block_e2m1(const uint8_t* w16, const uint8_t* x) {
  RefBlock r{false, 0, 10};
  for (int i = 0; i < 32; ++i) {
    const int nib = (i % 2 == 0) ? (w16[i / 2] & 15) : (w16[i / 2] >> 4);  // even element low
    if (e4m3_nan(x[i])) { r.nan = true; continue; }
    r.s += units(kE2M1[nib] * e4m3_value(x[i]), 10);
  }
  return r;
}
float ref_round_block(const RefBlock& b) { return b.nan ? NAN : round_exact(b.s, -b.frac); }
float ref_scale(float v, int sa, int sb) {
  if (sa == 255 || sb == 255 || std::isnan(v)) return NAN;
  if (v == 0.0f) return v;
  int ex;
  const double f = std::frexp(double(v), &ex);  // v = f * 2^ex, f * 2^24 an integer
  return round_exact(__int128(int64_t(std::ldexp(f, 24))), ex - 24 + sa + sb - 254);
}

// The four instructions, written from the contract.
float ref_k32(float c, const uint8_t* a, const uint8_t* b) { return c + ref_round_block(ref_block_e4m3(a, b)); }
float ref_k128_unit(float c, const uint8_t* a, const uint8_t* b) {
  for (int k = 0; k < 4; ++k) c = c + ref_round_block(ref_block_e4m3(a + 32 * k, b + 32 * k));
  return c;
}
float ref_f4f8(float c, const uint8_t* w, const uint8_t* sa, const uint8_t* x, const uint8_t* sb) {
  for (int k = 0; k < 4; ++k) c = c + ref_scale(ref_round_block(ref_block_e2m1(w + 16 * k, x + 32 * k)), sa[k], sb[k]);
  return c;
}
float ref_f8f8(float c, const uint8_t* w, const uint8_t* sa, const uint8_t* x, const uint8_t* sb) {
  for (int k = 0; k < 4; ++k) c = c + ref_scale(ref_round_block(ref_block_e4m3(w + 32 * k, x + 32 * k)), sa[k], sb[k]);
  return c;
}

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b); }

// E4M3 code of an exactly representable value (search the formula table).
uint8_t code_of(double v) {
  for (int c = 0; c < 256; ++c)
    if (!e4m3_nan(c) && e4m3_value(c) == v && std::signbit(e4m3_value(c)) == std::signbit(v)) return uint8_t(c);
  FAIL("no E4M3 code for " << v);
  return 0;
}
uint8_t nib_of(double v) {
  for (int c = 0; c < 16; ++c)
    if (kE2M1[c] == v && std::signbit(kE2M1[c]) == std::signbit(v)) return uint8_t(c);
  FAIL("no E2M1 code for " << v);
  return 0;
}

// One MMA problem: operands of 128 elements, 4 scales a side, the accumulator in.
struct Case {
  std::array<uint8_t, 128> a{}, b{};   // E4M3 (a is also read as 64 packed E2M1 bytes)
  std::array<uint8_t, 4> sa{{127, 127, 127, 127}}, sb{{127, 127, 127, 127}};
  float c = 0.0f;
};

uint8_t rnd_e4m3(SplitMix& r, int style) {
  for (;;) {
    uint8_t c = uint8_t(r.next());
    if (style == 1) c = uint8_t((c & 0x87) | (uint8_t(r.range(6, 9)) << 3));  // |x| in [0.125, 4): cancellations
    if (style == 2 && r.next() % 3) c = 0;                                    // sparse
    if (!e4m3_nan(c)) return c;
  }
}
Case random_case(SplitMix& r, int i) {
  Case k;
  const int style = i % 3;
  for (auto& v : k.a) v = rnd_e4m3(r, style);
  for (auto& v : k.b) v = rnd_e4m3(r, style);
  const int scales = i % 6;  // 0: anywhere; 5: results near the subnormal range; else near 1
  for (int j = 0; j < 4; ++j) {
    k.sa[j] = uint8_t(scales == 0 ? r.range(0, 254) : (scales == 5 ? r.range(30, 60) : r.range(117, 137)));
    k.sb[j] = uint8_t(scales == 0 ? r.range(0, 254) : (scales == 5 ? 100 - k.sa[j] + r.range(-12, 12) : r.range(117, 137)));
  }
  if (scales == 5) { k.c = (i & 1) ? -0.0f : 0.0f; return k; }
  switch (i % 5) {
    case 0: k.c = 0.0f; break;
    case 1: k.c = -0.0f; break;
    case 2: k.c = float(std::ldexp(double(int64_t(r.next() % 2000001) - 1000000), r.range(-40, 10))); break;
    default: k.c = float(std::ldexp(1.0 + double(r.next() >> 12) * 0x1p-52, r.range(-20, 30)) * ((r.next() & 1) ? -1 : 1));
  }
  return k;
}

using Impl = std::function<float(const Case&)>;
const Impl kHeader[4] = {
    [](const Case& k) { return k4::mma_fp8_k32(k.c, k.a.data(), k.b.data()); },
    [](const Case& k) { return k4::mma_fp8_k128_unit(k.c, k.a.data(), k.b.data()); },
    [](const Case& k) { return k4::mma_f4f8_k128(k.c, k.a.data(), k.sa.data(), k.b.data(), k.sb.data()); },
    [](const Case& k) { return k4::mma_f8f8_k128(k.c, k.a.data(), k.sa.data(), k.b.data(), k.sb.data()); },
};
const Impl kRef[4] = {
    [](const Case& k) { return ref_k32(k.c, k.a.data(), k.b.data()); },
    [](const Case& k) { return ref_k128_unit(k.c, k.a.data(), k.b.data()); },
    [](const Case& k) { return ref_f4f8(k.c, k.a.data(), k.sa.data(), k.b.data(), k.sb.data()); },
    [](const Case& k) { return ref_f8f8(k.c, k.a.data(), k.sa.data(), k.b.data(), k.sb.data()); },
};
const char* kName[4] = {"mma_fp8_k32", "mma_fp8_k128_unit", "mma_f4f8_k128", "mma_f8f8_k128"};

// Compare one case on one instruction; print the first few mismatches with bits.
bool check_case(int ins, const Case& k, const char* what, int& bad) {
  const float got = kHeader[ins](k), want = kRef[ins](k);
  if (same(got, want)) return true;
  if (bad++ < 8)
    FAIL_CHECK(kName[ins] << " " << what << ": c " << hx(bits_of(k.c)) << " a[0..3] " << hx(k.a[0], 2) << hx(k.a[1], 2)
                          << hx(k.a[2], 2) << hx(k.a[3], 2) << " sa " << int(k.sa[0]) << " sb " << int(k.sb[0])
                          << ": got " << hx(bits_of(got)) << " expected " << hx(bits_of(want)));
  return false;
}

// A corpus of random cases shared by the tests below and by the planted-model test.
const std::vector<Case>& corpus() {
  static const std::vector<Case> v = [] {
    SplitMix r(42);
    std::vector<Case> out;
    for (int i = 0; i < 60000; ++i) out.push_back(random_case(r, i));
    // Double rounding at the subnormal edge: S = 2^7 + 5 * 2^-18 rounds (24 bits) to
    // 2^7 + 2^-16; times 2^-134 that is 2^-127 + 2^-150, a tie -> even 2^-127, while S * 2^-134
    // rounded once is 2^-127 + 2^-149. In block b of an otherwise zero problem, both signs.
    for (int b = 0; b < 4; ++b)
      for (int sign = 0; sign < 2; ++sign) {
        Case k;
        k.a[32 * b] = 0x58; k.b[32 * b] = uint8_t(sign ? 0xD0 : 0x50);          // 16 * +-8
        k.a[32 * b + 1] = 0x01; k.b[32 * b + 1] = uint8_t(sign ? 0x81 : 0x01);  // +-2^-18
        k.a[32 * b + 2] = 0x01; k.b[32 * b + 2] = uint8_t(sign ? 0x84 : 0x04);  // +-4 * 2^-18
        k.sa[b] = 0;
        k.sb[b] = 120;
        out.push_back(k);
      }
    return out;
  }();
  return v;
}

}  // namespace

TEST_SUITE("numerics") {

TEST_CASE("mma: random blocks against the exact-integer reference") {
  int bad = 0, inexact = 0, nonzero = 0, scaled_sub = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const Case& k = corpus()[i];
    for (int ins = 0; ins < 4; ++ins) check_case(ins, k, "random", bad);
    const RefBlock b = ref_block_e4m3(k.a.data(), k.b.data());
    if (double(round_exact(b.s, -18)) * 262144.0 != double(b.s)) ++inexact;  // the block sum was rounded
    if (b.s != 0) ++nonzero;
    const float r = kRef[3](k);
    if (std::fpclassify(r) == FP_SUBNORMAL) ++scaled_sub;
  }
  CHECK(bad == 0);
  CHECK(inexact > 10000);  // most random block sums need the one rounding
  CHECK(nonzero > 50000);
  CHECK(scaled_sub > 10);  // some scaled results land in the subnormal range
  MESSAGE("mma random: " << corpus().size() << " cases x 4 instructions; block sums rounded: " << inexact
                         << "; subnormal scaled results: " << scaled_sub);
}

TEST_CASE("mma: block_dot_ints equals the byte forms and the reference") {
  SplitMix r(9);
  int bad = 0;
  for (int it = 0; it < 20000; ++it) {
    uint8_t a[32], b[32], w[16];
    int32_t ia[32], ib[32], iw[32];
    bool nan = false, nanx = false;
    for (int i = 0; i < 32; ++i) {
      a[i] = uint8_t(r.next());
      b[i] = uint8_t(r.next());
      if (it % 2 == 0) { if (e4m3_nan(a[i])) a[i] = 0x7E; if (e4m3_nan(b[i])) b[i] = 0xFE; }
      nan |= e4m3_nan(a[i]) || e4m3_nan(b[i]);
      nanx |= e4m3_nan(b[i]);
      ia[i] = e4m3_nan(a[i]) ? 0 : int32_t(e4m3_value(a[i]) * 512.0);  // by formula, not by the header
      ib[i] = e4m3_nan(b[i]) ? 0 : int32_t(e4m3_value(b[i]) * 512.0);
    }
    for (int i = 0; i < 16; ++i) w[i] = uint8_t(r.next());
    for (int i = 0; i < 32; ++i) iw[i] = int32_t(kE2M1[(i % 2 == 0) ? (w[i / 2] & 15) : (w[i / 2] >> 4)] * 2.0);
    const float want8 = ref_round_block(ref_block_e4m3(a, b)), want4 = ref_round_block(ref_block_e2m1(w, b));
    const float g8 = k4::block_dot_ints(ia, ib, nan, 18), g8b = k4::block_dot_e4m3(a, b);
    const float g4 = k4::block_dot_ints(iw, ib, nanx, 10), g4b = k4::block_dot_e2m1_e4m3(w, b);
    if (!(same(g8, want8) && same(g8b, want8) && same(g4, want4) && same(g4b, want4)) && bad++ < 8)
      FAIL_CHECK("block " << it << ": e4m3 " << hx(bits_of(g8)) << "/" << hx(bits_of(g8b)) << " want "
                          << hx(bits_of(want8)) << "; e2m1 " << hx(bits_of(g4)) << "/" << hx(bits_of(g4b)) << " want "
                          << hx(bits_of(want4)));
  }
  CHECK(bad == 0);
}

TEST_CASE("mma: extreme scales (E8M0 0, 1, 127, 253, 254, 0xFF) on extreme and random blocks") {
  const int sc[] = {0, 1, 127, 253, 254, 255};
  SplitMix r(17);
  int bad = 0, n_inf = 0, n_sub = 0, n_zero_from_underflow = 0, n_nan = 0;
  std::vector<Case> blocks;
  Case mx;  // every element 448 x 448 (E4M3) / 6 x 448 (E2M1 x E4M3)
  mx.a.fill(0x7E); mx.b.fill(0x7E);
  blocks.push_back(mx);
  Case mn;  // one 2^-9 x 2^-9 product (E2M1: nibble pair 0x01 -> 0.5 x 2^-9)
  mn.a[0] = 0x01; mn.b[0] = 0x01;
  blocks.push_back(mn);
  Case neg = mx;
  for (auto& v : neg.b) v = 0xFE;
  blocks.push_back(neg);
  for (int i = 0; i < 6; ++i) blocks.push_back(random_case(r, 3 * i + 1));
  for (const Case& base : blocks)
    for (int s1 : sc)
      for (int s2 : sc) {
        Case k = base;
        k.c = 0.0f;
        k.sa = {{uint8_t(s1), uint8_t(s1), uint8_t(s1), uint8_t(s1)}};
        k.sb = {{uint8_t(s2), 127, uint8_t(s2), uint8_t(254 - s2 % 255)}};
        for (int ins = 2; ins < 4; ++ins) {
          check_case(ins, k, "extreme scales", bad);
          const float g = kHeader[ins](k);
          if (std::isinf(g)) ++n_inf;
          if (std::isnan(g)) ++n_nan;
          if (std::fpclassify(g) == FP_SUBNORMAL) ++n_sub;
        }
        // Single block, scale pair (s1, s2) alone: underflow to a signed zero, overflow to Inf.
        const float v = k4::block_dot_e4m3(k.a.data(), k.b.data());
        const float sv = k4::scale_block(v, uint8_t(s1), uint8_t(s2));
        if (!same(sv, ref_scale(v, s1, s2)) && bad++ < 8)
          FAIL_CHECK("scale_block(" << hx(bits_of(v)) << ", " << s1 << ", " << s2 << ") = " << hx(bits_of(sv))
                                    << " expected " << hx(bits_of(ref_scale(v, s1, s2))));
        if (v != 0.0f && sv == 0.0f) {
          ++n_zero_from_underflow;
          CHECK(std::signbit(sv) == std::signbit(v));  // IEEE underflow keeps the sign
        }
      }
  CHECK(bad == 0);
  CHECK(n_inf > 0);
  CHECK(n_nan > 0);
  CHECK(n_sub > 0);
  CHECK(n_zero_from_underflow > 0);
  // By hand: max block 32 * 448^2 = 6422528 = 0x1.88p22; times 2^(254+254-254) overflows.
  CHECK(k4::block_dot_e4m3(mx.a.data(), mx.b.data()) == 6422528.0f);
  CHECK(k4::scale_block(6422528.0f, 254, 254) == INFINITY);
  CHECK(k4::scale_block(-6422528.0f, 254, 254) == -INFINITY);
  CHECK(k4::scale_block(6422528.0f, 0, 0) == float(std::ldexp(6422528.0, -254)));  // 2^-231.4: 0
  CHECK(bits_of(k4::scale_block(6422528.0f, 0, 0)) == 0u);
  CHECK(k4::scale_block(1.0f, 0, 127) == 0x1p-127f);  // a subnormal, exact
  CHECK(std::isnan(k4::scale_block(0.0f, 255, 127)));  // a NaN scale makes even a zero block NaN
  CHECK(std::isnan(k4::scale_block(1.0f, 127, 255)));
  // Subnormal with rounding: 3 * 2^-150 -> 2^-148 (tie to even); 5 * 2^-151 -> 2^-149.
  CHECK(bits_of(k4::scale_block(3.0f, 0, 104)) == 0x00000002u);  // 3 * 2^-150
  CHECK(bits_of(k4::scale_block(5.0f, 0, 103)) == 0x00000001u);  // 5 * 2^-151
  CHECK(bits_of(k4::scale_block(-5.0f, 0, 103)) == 0x80000001u);
  // The two roundings of the contract: block 2^7 + 5 * 2^-18 -> f32 2^7 + 2^-16; times 2^-134
  // a tie -> 2^-127 (0x00400000), where one rounding of the exact value gives 0x00400001.
  Case d;
  d.a[0] = 0x58; d.b[0] = 0x50;
  d.a[1] = 0x01; d.b[1] = 0x01;
  d.a[2] = 0x01; d.b[2] = 0x04;
  CHECK(bits_of(k4::block_dot_e4m3(d.a.data(), d.b.data())) == bits_of(128.0f + 0x1p-16f));
  d.sa = {{0, 127, 127, 127}};
  d.sb = {{120, 127, 127, 127}};
  CHECK(bits_of(k4::mma_f8f8_k128(0.0f, d.a.data(), d.sa.data(), d.b.data(), d.sb.data())) == 0x00400000u);
  CHECK(bits_of(round_exact(ref_block_e4m3(d.a.data(), d.b.data()).s, -18 - 134)) == 0x00400001u);
}

TEST_CASE("mma: exact cancellation gives +0, near-cancellation needs exact accumulation") {
  int bad = 0;
  // 16 products x*y and 16 products -x*y: exactly 0, and +0 whatever the accumulator's zero.
  Case k;
  for (int i = 0; i < 16; ++i) {
    k.a[i] = uint8_t(0x30 + i);  k.b[i] = uint8_t(0x41 + i % 7);
    k.a[16 + i] = uint8_t(0x30 + i);  k.b[16 + i] = uint8_t(0xC1 + i % 7);
  }
  CHECK(bits_of(k4::block_dot_e4m3(k.a.data(), k.b.data())) == 0u);
  for (float c : {0.0f, -0.0f}) {
    k.c = c;
    CHECK(bits_of(k4::mma_fp8_k32(c, k.a.data(), k.b.data())) == 0u);  // -0 + +0 = +0
    check_case(0, k, "exact cancellation", bad);
  }
  // 448*448 + 2^-9*2^-9 - 448*448 = 2^-18 exactly; an f32 running sum in element order says 0.
  Case n;
  n.a[0] = 0x7E; n.b[0] = 0x7E;
  n.a[1] = 0x01; n.b[1] = 0x01;
  n.a[2] = 0x7E; n.b[2] = 0xFE;
  CHECK(k4::block_dot_e4m3(n.a.data(), n.b.data()) == 0x1p-18f);
  float naive = 0.0f;
  for (int i = 0; i < 32; ++i) naive += float(e4m3_value(n.a[i]) * e4m3_value(n.b[i]));
  CHECK(naive == 0.0f);
  check_case(0, n, "near cancellation", bad);
  // Large terms cancel (15 * 448^2 against 15 * -448^2), two small ones remain.
  Case w;
  for (int i = 0; i < 15; ++i) { w.a[i] = 0x7E; w.b[i] = 0x7E; w.a[15 + i] = 0x7E; w.b[15 + i] = 0xFE; }
  w.a[30] = 0x01; w.b[30] = 0x03;   // 3 * 2^-18
  w.a[31] = 0x3F; w.b[31] = 0x09;   // 1.875 * 2^-6 * 1.125
  const double exact = 3 * 0x1p-18 + 1.875 * 1.125 * 0x1p-6;
  CHECK(double(k4::block_dot_e4m3(w.a.data(), w.b.data())) == double(float(exact)));
  check_case(0, w, "wide cancellation", bad);
  // FP4: 6 * 448 sixteen times against -6 * 448, plus 0.5 * 2^-9.
  Case f;
  for (int i = 0; i < 32; i += 2) f.a[i / 2] = uint8_t(nib_of(6.0) | nib_of(-6.0) << 4);
  for (int i = 0; i < 32; ++i) f.b[i] = 0x7E;
  f.a[15] = uint8_t(nib_of(0.5) | nib_of(0.0) << 4);
  f.b[30] = 0x01;
  CHECK(k4::block_dot_e2m1_e4m3(f.a.data(), f.b.data()) == 0x1p-10f);
  check_case(2, f, "fp4 near cancellation", bad);
  CHECK(bad == 0);
}

TEST_CASE("mma: NaN elements and maximal elements") {
  int bad = 0;
  Case base;
  for (int i = 0; i < 128; ++i) { base.a[i] = 0x38; base.b[i] = 0x40; }  // 1 x 2
  for (uint8_t nan : {uint8_t(0x7F), uint8_t(0xFF)})
    for (int pos : {0, 31, 64, 127}) {
      Case k = base;
      k.b[pos] = nan;
      CHECK(std::isnan(k4::mma_fp8_k128_unit(1.0f, k.a.data(), k.b.data())));
      CHECK(std::isnan(k4::mma_f4f8_k128(1.0f, k.a.data(), k.sa.data(), k.b.data(), k.sb.data())));
      CHECK(std::isnan(k4::mma_f8f8_k128(1.0f, k.a.data(), k.sa.data(), k.b.data(), k.sb.data())));
      for (int ins = 1; ins < 4; ++ins) check_case(ins, k, "NaN element", bad);
      Case ka = base;
      ka.a[pos] = nan;  // NaN on the E4M3 A side
      CHECK(std::isnan(k4::mma_f8f8_k128(0.0f, ka.a.data(), ka.sa.data(), ka.b.data(), ka.sb.data())));
      CHECK(bits_of(k4::block_dot_e4m3(ka.a.data() + 32 * (pos / 32), ka.b.data() + 32 * (pos / 32))) == 0x7FC00000u);
    }
  // A NaN scale in one block of four makes the result NaN; other blocks finite.
  Case ks = base;
  ks.sa[2] = 0xFF;
  CHECK(std::isnan(k4::mma_f8f8_k128(0.0f, ks.a.data(), ks.sa.data(), ks.b.data(), ks.sb.data())));
  // Extremes: +-448 x +-448 and FP4 +-6 x +-448.
  Case m;
  for (int i = 0; i < 128; ++i) { m.a[i] = (i % 3) ? 0x7E : 0xFE; m.b[i] = (i % 5) ? 0x7E : 0xFE; }
  for (int ins = 0; ins < 4; ++ins) check_case(ins, m, "max elements", bad);
  Case f;
  for (int i = 0; i < 64; ++i) f.a[i] = uint8_t(nib_of(6.0) | nib_of(-6.0) << 4);
  f.b.fill(0x7E);
  f.b[0] = 0xFE;
  CHECK(k4::block_dot_e2m1_e4m3(f.a.data(), f.b.data()) == float(-6.0 * 448 * 2));
  check_case(2, f, "fp4 extremes", bad);
  // Inf blocks of both signs: +Inf + -Inf = NaN.
  Case inf;
  for (int i = 0; i < 128; ++i) { inf.a[i] = 0x7E; inf.b[i] = i < 32 ? 0x7E : 0xFE; }
  inf.sa = {{254, 254, 127, 127}};
  inf.sb = {{254, 254, 127, 127}};
  CHECK(std::isnan(k4::mma_f8f8_k128(0.0f, inf.a.data(), inf.sa.data(), inf.b.data(), inf.sb.data())));
  inf.sa[1] = 127;
  inf.sb[1] = 127;
  CHECK(k4::mma_f8f8_k128(0.0f, inf.a.data(), inf.sa.data(), inf.b.data(), inf.sb.data()) == INFINITY);
  check_case(3, inf, "inf", bad);
  CHECK(bad == 0);
}

TEST_CASE("mma: the accumulation order acc + block0 + block1 + ... is what is computed") {
  // C = 2^10 (ulp 2^-13), h = 2^-14 (half an ulp of C). Blocks (h, -C, h, h), accumulator C:
  //   contract:      ((((C + h) + -C) + h) + h) = 2h   (C + h ties back to C)
  //   reverse:       ((((C + h) + h) + -C) + h) = h
  //   blocks first:  C + (((h + -C) + h) + h)    = 3h
  //   exact:         3h
  const float C = 1024.0f, h = 0x1p-14f;
  auto alt = [&](const float blk[4]) {
    float rev = C, first = 0.0f;
    for (int k = 3; k >= 0; --k) rev = rev + blk[k];
    for (int k = 0; k < 4; ++k) first = first + blk[k];
    double ex = C;
    for (int k = 0; k < 4; ++k) ex += blk[k];
    return std::array<float, 3>{{rev, C + first, float(ex)}};
  };
  const float blk[4] = {h, -C, h, h};
  const auto alts = alt(blk);
  // E4M3 x E4M3, unit scales: h = 2^-7 * 2^-7 (code 0x04 twice), -C = 32 * -32.
  Case k;
  k.c = C;
  k.a[0] = 0x04; k.b[0] = 0x04;
  k.a[32] = code_of(32); k.b[32] = code_of(-32);
  k.a[64] = 0x04; k.b[64] = 0x04;
  k.a[96] = 0x04; k.b[96] = 0x04;
  const float got = k4::mma_fp8_k128_unit(k.c, k.a.data(), k.b.data());
  CHECK(got == 2 * h);
  int bad = 0;
  check_case(1, k, "order", bad);
  for (float a : alts) CHECK_FALSE(same(a, got));  // each other order would be caught
  // The same with E8M0 scales doing the work: blocks of 1 * 1 scaled to h and to 2^10.
  Case s;
  s.c = C;
  s.a[0] = 0x38; s.b[0] = 0x38;                      // 1, scaled by 2^-14
  s.a[32] = 0x38; s.b[32] = 0xB8;                    // -1, scaled by 2^10
  s.a[64] = 0x38; s.b[64] = 0x38;
  s.a[96] = 0x38; s.b[96] = 0x38;
  s.sa = {{127 - 14, 127 + 10, 127 - 7, 127 - 7}};
  s.sb = {{127, 127, 127 - 7, 127 - 7}};
  CHECK(k4::mma_f8f8_k128(s.c, s.a.data(), s.sa.data(), s.b.data(), s.sb.data()) == 2 * h);
  check_case(3, s, "order (scaled)", bad);
  // FP4 A: nibble 1.0 in the low half of byte 0 of each block of 16 bytes.
  Case f = s;
  f.a.fill(0);
  for (int blkno = 0; blkno < 4; ++blkno) f.a[16 * blkno] = nib_of(1.0);
  f.b = s.b;
  CHECK(k4::mma_f4f8_k128(f.c, f.a.data(), f.sa.data(), f.b.data(), f.sb.data()) == 2 * h);
  check_case(2, f, "order (fp4)", bad);
  CHECK(bad == 0);
}

TEST_CASE("mma: planted wrong models are caught by the corpus") {
  // Each plausible mistake, run over the random corpus, must disagree with the reference
  // somewhere: the tests above would then fail.
  auto count_mismatch = [](const std::function<float(const Case&)>& impl, int ins) {
    int n = 0;
    for (const Case& k : corpus())
      if (!same(impl(k), kRef[ins](k))) ++n;
    return n;
  };
  // 1. One bit off in the result.
  CHECK(count_mismatch([](const Case& k) { return std::nextafter(kHeader[1](k), INFINITY); }, 1) > 50000);
  // 2. Products accumulated in f32, element by element.
  CHECK(count_mismatch([](const Case& k) {
          float c = k.c;
          for (int i = 0; i < 128; ++i) c += float(e4m3_value(k.a[i]) * e4m3_value(k.b[i]));
          return c;
        }, 1) > 1000);
  // 3. Blocks in reverse order.
  CHECK(count_mismatch([](const Case& k) {
          float c = k.c;
          for (int b = 3; b >= 0; --b) c = c + k4::block_dot_e4m3(k.a.data() + 32 * b, k.b.data() + 32 * b);
          return c;
        }, 1) > 100);
  // 4. All 128 products summed exactly, rounded once (no per-block rounding).
  CHECK(count_mismatch([](const Case& k) {
          RefBlock t{false, 0, 18};
          for (int b = 0; b < 4; ++b) t.s += ref_block_e4m3(k.a.data() + 32 * b, k.b.data() + 32 * b).s;
          return k.c + round_exact(t.s, -18);
        }, 1) > 100);
  // 5. Block sum truncated instead of rounded to nearest even.
  CHECK(count_mismatch([](const Case& k) {
          const double s = double(ref_block_e4m3(k.a.data(), k.b.data()).s) * 0x1p-18;
          float f = float(s);
          if (std::fabs(double(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
          return k.c + f;
        }, 0) > 1000);
  // 6. Scaling rounded together with the block sum (one rounding of S * 2^k, not two).
  CHECK(count_mismatch([](const Case& k) {
          float c = k.c;
          for (int b = 0; b < 4; ++b) {
            const RefBlock t = ref_block_e4m3(k.a.data() + 32 * b, k.b.data() + 32 * b);
            c = c + round_exact(t.s, -18 + k.sa[b] + k.sb[b] - 254);
          }
          return c;
        }, 3) > 0);
  // 7. The two scales applied one at a time in f32 (an extra rounding at the range edge).
  CHECK(count_mismatch([](const Case& k) {
          float c = k.c;
          for (int b = 0; b < 4; ++b) {
            const float v = k4::block_dot_e4m3(k.a.data() + 32 * b, k.b.data() + 32 * b);
            c = c + (v * float(std::ldexp(1.0, k.sa[b] - 127))) * float(std::ldexp(1.0, k.sb[b] - 127));
          }
          return c;
        }, 3) > 0);
  // 8. FP4 nibbles read high-first.
  CHECK(count_mismatch([](const Case& k) {
          std::array<uint8_t, 64> sw;
          for (int i = 0; i < 64; ++i) sw[i] = uint8_t((k.a[i] >> 4) | (k.a[i] << 4));
          return k4::mma_f4f8_k128(k.c, sw.data(), k.sa.data(), k.b.data(), k.sb.data());
        }, 2) > 50000);
}

}  // TEST_SUITE numerics
