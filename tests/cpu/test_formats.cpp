// test_formats.cpp -- the storage formats (bf16.hpp, e4m3.hpp, e8m0.hpp, e2m1.hpp) against
// references written by value, not by bits.
//
// Decode: every code of E4M3 (256), E8M0 (256), E2M1 (16) and bf16 (65536) against
// (-1)^s * 2^e * (1 + m / 2^M) evaluated with std::pow in double, plus literal anchors.
// Encode: f32 -> bf16, f32 -> E4M3 (Saturate and NoSaturate) and f32 -> E2M1 over all 2^32
// f32 inputs (suite "exhaustive") against a converter that finds the two neighbouring
// representable values by value in double, picks the nearer and breaks ties to the even code;
// hand-written boundary tables and double-rounding cases (suite "numerics").
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

#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/e8m0.hpp"

namespace {

using k4::Fp8Overflow;

// ---- test-side helpers (kept apart from hd.hpp's so that a bug there cannot hide) ----
uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// First mismatches of a parallel sweep: recorded from any thread, reported after the loop
// (doctest's macros are not thread-safe) as hex bits of input, result and expected.
struct Mismatches {
  std::atomic<uint64_t> count{0};
  std::mutex mu;
  std::vector<std::array<uint64_t, 3>> rows;
  void add(uint64_t in, uint64_t got, uint64_t want) {
    if (count.fetch_add(1) < 256) {
      std::lock_guard<std::mutex> g(mu);
      rows.push_back({in, got, want});
    }
  }
};
void report(Mismatches& m, const char* what, int in_hex, int out_hex) {
  std::sort(m.rows.begin(), m.rows.end());
  for (size_t i = 0; i < m.rows.size() && i < 8; ++i) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s mismatch: input 0x%0*llx got 0x%0*llx expected 0x%0*llx", what,
                  in_hex, (unsigned long long)m.rows[i][0], out_hex, (unsigned long long)m.rows[i][1],
                  out_hex, (unsigned long long)m.rows[i][2]);
    FAIL_CHECK(buf);
  }
  CHECK_MESSAGE(m.count.load() == 0, std::string(what) << ": " << m.count.load() << " mismatches");
}

// Hex for messages (doctest stringifies operands one by one: no stream manipulators).
std::string hx(uint64_t v, int digits = 8) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llx", digits, (unsigned long long)v);
  return buf;
}

struct Timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double s() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

// ---- independent decode tables (OCP MX spec v1.0 formulas, by value) ----
struct E4M3Table {
  double v[256];
  bool nan[256];
  E4M3Table() {
    for (int c = 0; c < 256; ++c) {
      const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
      nan[c] = (e == 15 && m == 7);
      const double mag = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
      v[c] = s ? -mag : mag;
    }
  }
};
const E4M3Table& e4t() { static const E4M3Table t; return t; }

// E2M1 magnitudes, code 0..7, written out.
const double kE2M1Mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// ---- reference converters, by value ----
// Round a >= 0 (finite) to the nearest multiple of q = 2^qexp, ties to an even multiple.
// Returns the multiple n (the code parity is n's parity in every format here).
double round_to_quantum(double a, double inv_q) {
  const double t = a * inv_q;             // exact: inv_q is a power of two
  const int64_t n = int64_t(t);           // t >= 0: truncation is floor
  const double frac = t - double(n);
  const int64_t up = int64_t(frac > 0.5) | (int64_t(frac == 0.5) & (n & 1));  // branch-free
  return double(n + up);
}

// The E4M3 grid position nearest |x| (unbounded: 480 and up are "past the range").
double e4m3_round_mag(double a) {
  if (a == 0.0) return 0.0;
  int ex;
  std::frexp(a, &ex);                     // a = f * 2^ex, f in [0.5, 1): leading bit 2^(ex-1)
  const int qexp = std::max(ex - 1, -6) - 3;
  return round_to_quantum(a, std::ldexp(1.0, -qexp)) * std::ldexp(1.0, qexp);
}

// The E4M3 code of a value on the grid (search of the independent table).
int e4m3_code_of_value(double v, bool neg) {
  for (int c = 0; c < 256; ++c)
    if (!e4t().nan[c] && e4t().v[c] == v && ((c >> 7) != 0) == neg) return c;
  return -1;
}

// Expected E4M3 code of any double, per e4m3.hpp's contract (RNE; past 464 -> rule).
int ref_e4m3(double x, Fp8Overflow rule) {
  if (std::isnan(x)) return 0x7F;
  const bool neg = std::signbit(x);
  const double r = std::isinf(x) ? INFINITY : e4m3_round_mag(std::fabs(x));
  if (r > 448.0) return (neg ? 0x80 : 0) | (rule == Fp8Overflow::Saturate ? 0x7E : 0x7F);
  return e4m3_code_of_value(neg ? -r : r, neg);
}

// Expected bf16 bits of any double (8 significant bits, exponent range of f32).
uint16_t ref_bf16(double x) {
  if (std::isnan(x)) return 0x7FC0;
  const bool neg = std::signbit(x);
  double a = std::fabs(x), r = INFINITY;
  if (!std::isinf(a)) {
    int ex;
    std::frexp(a, &ex);
    const int qexp = std::max(ex - 1, -126) - 7;
    r = a == 0.0 ? 0.0 : round_to_quantum(a, std::ldexp(1.0, -qexp)) * std::ldexp(1.0, qexp);
    if (r >= std::ldexp(1.0, 128)) r = INFINITY;
  }
  const float f = float(neg ? -r : r);    // exact: r is a bf16 value
  return uint16_t(bits_of(f) >> 16);
}

// Expected E2M1 code (RNE, saturating at 6) of a non-NaN double.
int ref_e2m1(double x) {
  const int s = std::signbit(x) ? 8 : 0;
  const double a = std::fabs(x);
  if (a >= 6.0) return s | 7;
  int k = 0;
  while (k < 7 && kE2M1Mag[k + 1] <= a) ++k;
  if (kE2M1Mag[k] == a) return s | k;
  const double dlo = a - kE2M1Mag[k], dhi = kE2M1Mag[k + 1] - a;
  if (dlo < dhi) return s | k;
  if (dhi < dlo) return s | (k + 1);
  return s | ((k % 2 == 0) ? k : k + 1);
}

// Comparators the sweeps use (and the planted-error cases feed a wrong result to).
bool e4m3_ok(float x, uint8_t got, Fp8Overflow rule) { return int(got) == ref_e4m3(double(x), rule); }
bool bf16_ok(float x, uint16_t got) { return got == ref_bf16(double(x)); }

// The same by-value rounding, for a whole f32 binade at once: its inputs come in increasing
// magnitude, so the neighbouring multiples k*q <= |x| < (k+1)*q and their midpoint are
// tracked as |x| grows (no per-input division, no unpredictable branch). For each input,
// emit(u, x, n) with n the nearest multiple of q, ties to even n.
template <class Emit>
void walk_binade(uint32_t hi, double q, Emit&& emit) {
  int64_t k = int64_t(std::fabs(double(float_of(hi))) / q);  // exact: 2^lead / 2^qexp or 0
  double next = double(k + 1) * q, mid = (double(k) + 0.5) * q;
  for (uint32_t m = 0; m < (1u << 23); ++m) {
    const uint32_t u = hi | m;
    const float x = float_of(u);
    const double a = std::fabs(double(x));
    while (a >= next) { ++k; next = double(k + 1) * q; mid = (double(k) + 0.5) * q; }
    const int64_t n = a < mid ? k : (a > mid ? k + 1 : k + (k & 1));
    emit(u, x, n);
  }
}

}  // namespace

TEST_SUITE("numerics") {

TEST_CASE("E4M3 decode: all 256 codes by value") {
  const auto& t = e4t();
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) {
    CAPTURE(c);
    const float f = k4::e4m3_to_f32(uint8_t(c));
    CHECK(k4::e4m3_is_nan(uint8_t(c)) == t.nan[c]);
    if (t.nan[c]) {
      ++nan_codes;
      CHECK(std::isnan(f));
      CHECK(k4::e4m3_to_int_x512(uint8_t(c)) == 0);  // documented: NaN -> 0
      continue;
    }
    CHECK(double(f) == t.v[c]);
    CHECK(std::signbit(f) == ((c & 0x80) != 0));   // -0 (0x80) keeps its sign
    CHECK(double(k4::e4m3_to_int_x512(uint8_t(c))) == t.v[c] * 512.0);
    CHECK(double(k4::e4m3_to_f32(uint8_t(c))) == t.v[c]);
  }
  CHECK(nan_codes == 2);
  // Literal anchors (OCP spec table): not derived from the formula above.
  const struct { int c; double v; } lit[] = {
      {0x00, 0.0},        {0x01, 0.001953125}, {0x07, 0.013671875}, {0x08, 0.015625},
      {0x30, 0.5},        {0x38, 1.0},         {0x3F, 1.875},       {0x40, 2.0},
      {0x44, 3.0},        {0x6F, 120.0},       {0x70, 128.0},       {0x77, 240.0},
      {0x78, 256.0},      {0x79, 288.0},       {0x7A, 320.0},       {0x7B, 352.0},
      {0x7C, 384.0},      {0x7D, 416.0},       {0x7E, 448.0},       {0xFE, -448.0},
      {0x81, -0.001953125}, {0xB8, -1.0}};
  for (const auto& l : lit) {
    CAPTURE(l.c);
    CHECK(double(k4::e4m3_to_f32(uint8_t(l.c))) == l.v);
  }
  CHECK(std::signbit(k4::e4m3_to_f32(0x80)));
  CHECK(k4::e4m3_to_f32(0x80) == 0.0f);
  CHECK(k4::e4m3_to_int_x512(0x7E) == 229376);
  CHECK(k4::e4m3_to_int_x512(0xFE) == -229376);
}

TEST_CASE("E8M0 decode: all 256 codes by value") {
  for (int b = 0; b < 256; ++b) {
    CAPTURE(b);
    const float f = k4::e8m0_to_f32(uint8_t(b));
    CHECK(k4::e8m0_is_nan(uint8_t(b)) == (b == 255));
    if (b == 255) { CHECK(std::isnan(f)); continue; }
    CHECK(double(f) == std::pow(2.0, b - 127));
    CHECK(!std::signbit(f));
  }
  CHECK(k4::e8m0_to_f32(0) == 0x1p-127f);
  CHECK(k4::e8m0_to_f32(127) == 1.0f);
  CHECK(k4::e8m0_to_f32(254) == 0x1p127f);
}

TEST_CASE("E2M1 decode: all 16 codes, nibble packing") {
  const double lit[16] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                          -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};
  for (int c = 0; c < 16; ++c) {
    CAPTURE(c);
    const float f = k4::e2m1_to_f32(uint8_t(c));
    CHECK(double(f) == lit[c]);
    if (c != 8) CHECK(std::signbit(f) == (c >= 8));  // code 8 (-0): its own test case below
    CHECK(k4::e2m1_to_int_x2(uint8_t(c)) == int(lit[c] * 2.0));
    CHECK(double(k4::e2m1_to_f32(k4::fp4_lo(uint8_t(c | 0xF0)))) == lit[c]);  // high bits dropped
  }
  for (int b = 0; b < 256; ++b) {
    CHECK(k4::fp4_lo(uint8_t(b)) == (b & 15));
    CHECK(k4::fp4_hi(uint8_t(b)) == (b >> 4));
    CHECK(k4::fp4_pack2(uint8_t(b & 15), uint8_t(b >> 4)) == b);
  }
}

TEST_CASE("E2M1 decode: the -0 code (8) decodes with its sign bit") {
  // OCP E2M1 code 0b1000 is -0 (e2m1.hpp: "values +-{0, ...}"); E4M3 0x80 and bf16 0x8000
  // keep their sign in this layer, so the FP4 decode should too.
  CHECK(std::signbit(k4::e2m1_to_f32(8)));
  CHECK(k4::e2m1_to_f32(8) == 0.0f);
  CHECK(k4::e2m1_to_int_x2(8) == 0);
}

TEST_CASE("bf16 decode: all 65536 codes by value; pair packing low first") {
  int bad = 0;
  for (int c = 0; c < 65536; ++c) {
    const int s = c >> 15, e = (c >> 7) & 255, m = c & 127;
    const float f = k4::bf16_to_f32(uint16_t(c));
    bool ok;
    if (e == 255 && m != 0) ok = std::isnan(f);
    else if (e == 255) ok = std::isinf(f) && std::signbit(f) == (s != 0);
    else {
      const double mag = e == 0 ? (m / 128.0) * std::pow(2.0, -126) : (1.0 + m / 128.0) * std::pow(2.0, e - 127);
      ok = double(f) == (s ? -mag : mag) && std::signbit(f) == (s != 0);
    }
    if (!ok && bad++ < 8) FAIL_CHECK("bf16 code " << hx(uint64_t(c), 4) << " decodes to " << f);
  }
  CHECK(bad == 0);
  const uint32_t w = k4::bf16_pair(1.0f, -2.0f);
  CHECK(w == 0xC0003F80u);
  CHECK(k4::bf16_pair_lo(w) == 1.0f);
  CHECK(k4::bf16_pair_hi(w) == -2.0f);
  CHECK(k4::bf16_bits_rne(3.0f) == 0x4040);
  CHECK(k4::bf16_to_f32(0x4040) == 3.0f);
  CHECK(k4::bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
}

TEST_CASE("f32 -> bf16 boundary table") {
  const struct { uint32_t in; uint16_t out; const char* why; } tab[] = {
      {0x3F800000u, 0x3F80, "1"},
      {0x3F808000u, 0x3F80, "1 + 2^-8: tie -> even"},
      {0x3F818000u, 0x3F82, "1 + 3*2^-8: tie -> even (up)"},
      {0x3F808001u, 0x3F81, "just past the tie"},
      {0x3F807FFFu, 0x3F80, "just below the tie"},
      {0x7F7F7FFFu, 0x7F7F, "below the overflow tie"},
      {0x7F7F8000u, 0x7F80, "overflow tie -> even = Inf"},
      {0x7F7FFFFFu, 0x7F80, "FLT_MAX -> Inf"},
      {0xFF7FFFFFu, 0xFF80, "-FLT_MAX -> -Inf"},
      {0x7F800000u, 0x7F80, "Inf"},
      {0xFF800000u, 0xFF80, "-Inf"},
      {0x7FC00000u, 0x7FC0, "qNaN"},
      {0xFFC00000u, 0x7FC0, "-qNaN -> canonical"},
      {0x7F800001u, 0x7FC0, "sNaN -> canonical"},
      {0xFFFFFFFFu, 0x7FC0, "NaN all ones -> canonical"},
      {0x7FFF0000u, 0x7FC0, "NaN whose upper half is a bf16 NaN -> canonical"},
      {0x80000000u, 0x8000, "-0"},
      {0x00000000u, 0x0000, "+0"},
      {0x00000001u, 0x0000, "min subnormal -> +0"},
      {0x80000001u, 0x8000, "-min subnormal -> -0"},
      {0x00008000u, 0x0000, "2^-134: tie -> even 0"},
      {0x00018000u, 0x0002, "3*2^-134: tie -> even"},
      {0x00008001u, 0x0001, "past the subnormal tie"},
      {0x007FFFFFu, 0x0080, "max subnormal -> min normal"},
      {0x00800000u, 0x0080, "min normal"},
  };
  for (const auto& t : tab) {
    CAPTURE(t.why);
    const float x = float_of(t.in);
    CHECK(k4::bf16_bits_rne(x) == t.out);
    CHECK(ref_bf16(double(x)) == t.out);  // the reference agrees with the hand table
  }
}

TEST_CASE("f32 -> E4M3 boundary table (Saturate / NoSaturate)") {
  const float inf = INFINITY;
  const struct { float in; int sat, nosat; const char* why; } tab[] = {
      {448.0f, 0x7E, 0x7E, "448 max"},
      {-448.0f, 0xFE, 0xFE, "-448"},
      {464.0f, 0x7E, 0x7E, "464: tie 448 / NaN code -> even 448"},
      {-464.0f, 0xFE, 0xFE, "-464"},
      {std::nextafter(464.0f, inf), 0x7E, 0x7F, "464 + ulp: past the range"},
      {-std::nextafter(464.0f, inf), 0xFE, 0xFF, "-(464 + ulp)"},
      {std::nextafter(464.0f, 0.0f), 0x7E, 0x7E, "464 - ulp"},
      {480.0f, 0x7E, 0x7F, "480"},
      {1e30f, 0x7E, 0x7F, "1e30"},
      {FLT_MAX, 0x7E, 0x7F, "FLT_MAX"},
      {inf, 0x7E, 0x7F, "+Inf"},
      {-inf, 0xFE, 0xFF, "-Inf"},
      {float_of(0x7FC00000u), 0x7F, 0x7F, "qNaN"},
      {float_of(0xFFC00000u), 0x7F, 0x7F, "-qNaN -> 0x7F"},
      {float_of(0x7F800001u), 0x7F, 0x7F, "sNaN"},
      {float_of(0xFFFFFFFFu), 0x7F, 0x7F, "-NaN all ones"},
      {432.0f, 0x7E, 0x7E, "432: tie 416 / 448 -> even 448"},
      {424.0f, 0x7D, 0x7D, "424 -> 416"},
      {0x1p-9f, 0x01, 0x01, "2^-9 min subnormal"},
      {0x1p-10f, 0x00, 0x00, "2^-10: tie -> 0"},
      {-0x1p-10f, 0x80, 0x80, "-2^-10 -> -0"},
      {std::nextafter(0x1p-10f, 1.0f), 0x01, 0x01, "2^-10 + ulp"},
      {std::nextafter(0x1p-10f, 0.0f), 0x00, 0x00, "2^-10 - ulp"},
      {1.5f * 0x1p-10f, 0x01, 0x01, "1.5 * 2^-10"},
      {2.5f * 0x1p-9f, 0x02, 0x02, "2.5 * 2^-9: tie -> 2"},
      {3.5f * 0x1p-9f, 0x04, 0x04, "3.5 * 2^-9: tie -> 4"},
      {7.5f * 0x1p-9f, 0x08, 0x08, "7.5 * 2^-9: tie -> 2^-6 (min normal)"},
      {0x1p-6f, 0x08, 0x08, "2^-6"},
      {float_of(0x00000001u), 0x00, 0x00, "f32 min subnormal"},
      {float_of(0x80000001u), 0x80, 0x80, "-f32 min subnormal"},
      {float_of(0x007FFFFFu), 0x00, 0x00, "f32 max subnormal"},
      {-0.0f, 0x80, 0x80, "-0"},
      {0.0f, 0x00, 0x00, "+0"},
      {1.0f, 0x38, 0x38, "1"},
      {1.0625f, 0x38, 0x38, "1.0625: tie -> even 1"},
      {1.1875f, 0x3A, 0x3A, "1.1875: tie -> even 1.25"},
      {-1.1875f, 0xBA, 0xBA, "-1.1875"},
      {240.0f, 0x77, 0x77, "240"},
      {248.0f, 0x78, 0x78, "248: tie 240 / 256 -> 256"},
      {0.1f, 0x1D, 0x1D, "0.1 -> 0.1015625"},
      {3.0f, 0x44, 0x44, "3"},
  };
  for (const auto& t : tab) {
    CAPTURE(t.why);
    CHECK(int(k4::e4m3_bits(t.in, Fp8Overflow::Saturate)) == t.sat);
    CHECK(int(k4::e4m3_bits(t.in, Fp8Overflow::NoSaturate)) == t.nosat);
    CHECK(ref_e4m3(double(t.in), Fp8Overflow::Saturate) == t.sat);  // the reference agrees too
    CHECK(ref_e4m3(double(t.in), Fp8Overflow::NoSaturate) == t.nosat);
    CHECK(int(k4::e4m3_bits(t.in, Fp8Overflow::Saturate)) == t.sat);
  }
  // fp8_pack4: element 0 in the low byte; NoSaturate by default.
  CHECK(k4::fp8_pack4(1.0f, -2.0f, 500.0f, 0x1p-9f) == 0x017FC038u);
  CHECK(k4::fp8_pack4(1.0f, -2.0f, 500.0f, 0x1p-9f, Fp8Overflow::Saturate) == 0x017EC038u);
}

TEST_CASE("E4M3 / bf16 double rounding: the f32 path is the specified one") {
  // Each d rounds to an f32 that sits on a tie (or on the range edge); the model's input is
  // the f32, so the specified code is ref(f32(d)), which differs from rounding d directly.
  const struct { double d; int want_nosat; } cases[] = {
      {1.1875 - 0x1p-30, 0x3A},           // f32 -> 1.1875 tie -> 1.25; direct: 1.125 (0x39)
      {1.0625 + 0x1p-30, 0x38},           // f32 -> 1.0625 tie -> 1;    direct: 1.125 (0x39)
      {464.0 + 0x1p-20, 0x7E},            // f32 -> 464 tie -> 448;     direct: past the range (0x7F)
      {0x1p-10 + 0x1p-40, 0x00},          // f32 -> 2^-10 tie -> 0;     direct: 2^-9 (0x01)
      {3 * 0x1p-10 - 0x1p-40, 0x02},      // f32 -> 1.5*2^-9 tie -> 2;  direct: 0x01
      {-(1.1875 - 0x1p-30), 0xBA},
      {-(464.0 + 0x1p-20), 0xFE},
  };
  for (const auto& c : cases) {
    CAPTURE(c.d);
    const float f = float(c.d);
    REQUIRE(double(f) != c.d);
    const int via_f32 = ref_e4m3(double(f), Fp8Overflow::NoSaturate);
    const int direct = ref_e4m3(c.d, Fp8Overflow::NoSaturate);
    CHECK(via_f32 != direct);  // a genuine double-rounding case
    CHECK(via_f32 == c.want_nosat);
    CHECK(int(k4::e4m3_bits(f, Fp8Overflow::NoSaturate)) == c.want_nosat);
  }
  // bf16: 1 + 2^-8 + 2^-40 -> f32 1 + 2^-8 (tie) -> 0x3F80; direct rounding gives 0x3F81.
  const double d = 1.0 + 0x1p-8 + 0x1p-40;
  CHECK(ref_bf16(d) == 0x3F81);
  CHECK(ref_bf16(double(float(d))) == 0x3F80);
  CHECK(k4::bf16_bits_rne(float(d)) == 0x3F80);
}

TEST_CASE("formats: planted one-bit errors are caught by the comparators") {
  const float xs[] = {1.0f, -1.1875f, 448.0f, 464.0f, 0x1p-9f, 0x1p-10f, -0.0f, 100.0f, 3e-3f, INFINITY};
  for (float x : xs) {
    CAPTURE(x);
    for (Fp8Overflow r : {Fp8Overflow::Saturate, Fp8Overflow::NoSaturate}) {
      const uint8_t got = k4::e4m3_bits(x, r);
      CHECK(e4m3_ok(x, got, r));
      for (int bit = 0; bit < 8; ++bit) CHECK_FALSE(e4m3_ok(x, uint8_t(got ^ (1u << bit)), r));
    }
    const uint16_t g16 = k4::bf16_bits_rne(x);
    CHECK(bf16_ok(x, g16));
    for (int bit = 0; bit < 16; ++bit) CHECK_FALSE(bf16_ok(x, uint16_t(g16 ^ (1u << bit))));
  }
  CHECK_FALSE(bf16_ok(float_of(0xFFC00000u), 0xFFC0));  // a non-canonical NaN is caught
  CHECK_FALSE(e4m3_ok(float_of(0xFFC00000u), 0xFF, Fp8Overflow::NoSaturate));
  // E2M1: every wrong code of a tie and of a saturating input is caught.
  for (float x : {0.25f, 0.75f, 2.5f, 5.0f, 7.0f, -1.75f, -0.0f}) {
    CAPTURE(x);
    const int got = k4::e2m1_bits_rne_sat(x);
    CHECK(got == ref_e2m1(double(x)));
    for (int bit = 0; bit < 4; ++bit) CHECK_FALSE((got ^ (1 << bit)) == ref_e2m1(double(x)));
  }
}

}  // TEST_SUITE numerics

TEST_SUITE("exhaustive") {

TEST_CASE("f32 -> bf16: all 2^32 inputs vs the by-value reference") {
  Timer tm;
  Mismatches bad;
  std::atomic<uint64_t> checked{0};
#pragma omp parallel for schedule(dynamic, 1)
  for (int chunk = 0; chunk < 512; ++chunk) {
    const uint32_t hi = uint32_t(chunk) << 23;
    const int b = chunk & 255;
    const bool neg = chunk >= 256;
    // Quantum of this binade's bf16 grid: 2^(lead - 7), lead = b - 127 (b = 0: subnormal, -126).
    const int qexp = (b == 0 ? -126 : b - 127) - 7;
    const double q = std::ldexp(1.0, qexp);
    const double top = std::ldexp(1.0, 128);
    uint64_t n_local = 0;
    if (b == 255) {
      for (uint32_t m = 0; m < (1u << 23); ++m) {
        const uint16_t want = m ? 0x7FC0 : (neg ? 0xFF80 : 0x7F80);
        const uint16_t got = k4::bf16_bits_rne(float_of(hi | m));
        if (got != want) bad.add(hi | m, got, want);
        ++n_local;
      }
    } else {
      walk_binade(hi, q, [&](uint32_t u, float x, int64_t n) {
        double r = double(n) * q;
        if (r >= top) r = INFINITY;
        const uint32_t fb = bits_of(float(neg ? -r : r));  // exact: r is on the bf16 grid
        const uint16_t got = k4::bf16_bits_rne(x);
        if ((fb & 0xFFFFu) != 0 || got != uint16_t(fb >> 16)) bad.add(u, got, fb >> 16);
        ++n_local;
      });
    }
    checked += n_local;
  }
  CHECK(checked.load() == (uint64_t(1) << 32));
  report(bad, "bf16", 8, 4);
  MESSAGE("f32 -> bf16 exhaustive: " << tm.s() << " s");
}

TEST_CASE("f32 -> E4M3: all 2^32 inputs, both overflow rules, vs the by-value reference") {
  Timer tm;
  Mismatches bad_sat, bad_nosat;
  const auto& t = e4t();
  std::atomic<uint64_t> n_over{0}, n_nan{0}, n_zero{0}, n_finite{0};
#pragma omp parallel for schedule(dynamic, 1)
  for (int chunk = 0; chunk < 512; ++chunk) {
    const uint32_t hi = uint32_t(chunk) << 23;
    const int b = chunk & 255;
    const bool neg = chunk >= 256;
    const int lead = b == 0 ? -127 : b - 127;
    const int qexp = std::max(lead, -6) - 3;
    const double q = std::ldexp(1.0, qexp);
    uint64_t lo = 0, ln = 0, lz = 0, lf = 0;
    auto check = [&](uint32_t u, float x, double r) {  // r: the grid magnitude nearest |x|
      const uint8_t gs = k4::e4m3_bits(x, Fp8Overflow::Saturate);
      const uint8_t gn = k4::e4m3_bits(x, Fp8Overflow::NoSaturate);
      if (r > 448.0) {  // past the range (incl. Inf)
        ++lo;
        const uint8_t ws = uint8_t((neg ? 0x80 : 0) | 0x7E), wn = uint8_t((neg ? 0x80 : 0) | 0x7F);
        if (gs != ws) bad_sat.add(u, gs, ws);
        if (gn != wn) bad_nosat.add(u, gn, wn);
        return;
      }
      const double want = neg ? -r : r;
      if (r == 0.0) ++lz; else ++lf;
      // Decode the results with the independent table: value and sign must match.
      const bool ok_s = !t.nan[gs] && t.v[gs] == want && ((gs & 0x80) != 0) == neg;
      const bool ok_n = !t.nan[gn] && t.v[gn] == want && ((gn & 0x80) != 0) == neg;
      if (!ok_s) bad_sat.add(u, gs, uint64_t(int64_t(e4m3_code_of_value(want, neg)) & 0xFF));
      if (!ok_n) bad_nosat.add(u, gn, uint64_t(int64_t(e4m3_code_of_value(want, neg)) & 0xFF));
    };
    if (b == 255) {
      for (uint32_t m = 0; m < (1u << 23); ++m) {
        const uint32_t u = hi | m;
        if (m == 0) { check(u, float_of(u), INFINITY); continue; }
        ++ln;  // NaN of either sign -> 0x7F in both rules
        const uint8_t gs = k4::e4m3_bits(float_of(u), Fp8Overflow::Saturate);
        const uint8_t gn = k4::e4m3_bits(float_of(u), Fp8Overflow::NoSaturate);
        if (gs != 0x7F) bad_sat.add(u, gs, 0x7F);
        if (gn != 0x7F) bad_nosat.add(u, gn, 0x7F);
      }
    } else {
      walk_binade(hi, q, [&](uint32_t u, float x, int64_t n) { check(u, x, double(n) * q); });
    }
    n_over += lo; n_nan += ln; n_zero += lz; n_finite += lf;
  }
  CHECK(n_over + n_nan + n_zero + n_finite == (uint64_t(1) << 32));
  CHECK(n_finite.load() > 0);
  CHECK(n_nan.load() == 2 * ((uint64_t(1) << 23) - 1));
  report(bad_sat, "E4M3 Saturate", 8, 2);
  report(bad_nosat, "E4M3 NoSaturate", 8, 2);
  MESSAGE("f32 -> E4M3 exhaustive (both rules): " << tm.s() << " s; inputs past the range "
          << n_over.load() << ", to zero " << n_zero.load() << ", nonzero in range " << n_finite.load());
}

TEST_CASE("f32 -> E2M1 (RNE, saturating): all non-NaN f32 vs the by-value reference") {
  Timer tm;
  Mismatches bad;
  std::atomic<uint64_t> skipped{0};
#pragma omp parallel for schedule(dynamic, 1)
  for (int chunk = 0; chunk < 512; ++chunk) {
    const uint32_t hi = uint32_t(chunk) << 23;
    const int sign = chunk >= 256 ? 8 : 0;
    if ((chunk & 255) == 255) {  // +-Inf saturates; NaN is undefined by e2m1.hpp (skipped)
      const uint8_t got = k4::e2m1_bits_rne_sat(float_of(hi));
      if (got != (sign | 7)) bad.add(hi, got, uint64_t(sign | 7));
      skipped += (1u << 23) - 1;
      continue;
    }
    // Walk the binade upwards: k is the largest grid index with kE2M1Mag[k] <= |x|.
    int k = 0;
    for (uint32_t m = 0; m < (1u << 23); ++m) {
      const uint32_t u = hi | m;
      const float x = float_of(u);
      const double a = std::fabs(double(x));
      while (k < 7 && a >= kE2M1Mag[k + 1]) ++k;
      int want;
      if (k == 7) want = 7;  // 6 and beyond: saturate
      else {
        const double mid = 0.5 * (kE2M1Mag[k] + kE2M1Mag[k + 1]);
        want = a < mid ? k : (a > mid ? k + 1 : (k % 2 == 0 ? k : k + 1));
      }
      want |= sign;
      const uint8_t got = k4::e2m1_bits_rne_sat(x);
      if (got != want) bad.add(u, got, uint64_t(want));
    }
  }
  report(bad, "E2M1", 8, 1);
  MESSAGE("f32 -> E2M1 exhaustive: " << tm.s() << " s; skipped (NaN input, undefined by contract) "
          << skipped.load());
}

}  // TEST_SUITE exhaustive
