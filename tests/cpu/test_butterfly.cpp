// test_butterfly.cpp -- the xor-butterfly reductions (butterfly.hpp) against trees written out
// by hand: the 64-lane wave tree of offsets (32, 16, 8, 4, 2, 1) and the 16-lane group tree
// of (8, 4, 2, 1), on inputs where another tree gives other f32 bits; the per-lane
// definition op(v[i], v[i ^ off]) with a non-commutative op; NaN and -0 for the max.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "reference/numerics/butterfly.hpp"

namespace {

uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
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

// ---- the trees, written out (lane 0's value; every lane of the add butterfly has it) ----
template <class Op>
float tree64(const float* v, Op op) {
  return op(op(op(op(op(op(v[0], v[32]), op(v[16], v[48])), op(op(v[8], v[40]), op(v[24],
         v[56]))), op(op(op(v[4], v[36]), op(v[20], v[52])), op(op(v[12], v[44]), op(v[28],
         v[60])))), op(op(op(op(v[2], v[34]), op(v[18], v[50])), op(op(v[10], v[42]), op(v[26],
         v[58]))), op(op(op(v[6], v[38]), op(v[22], v[54])), op(op(v[14], v[46]), op(v[30],
         v[62]))))), op(op(op(op(op(v[1], v[33]), op(v[17], v[49])), op(op(v[9], v[41]),
         op(v[25], v[57]))), op(op(op(v[5], v[37]), op(v[21], v[53])), op(op(v[13], v[45]),
         op(v[29], v[61])))), op(op(op(op(v[3], v[35]), op(v[19], v[51])), op(op(v[11], v[43]),
         op(v[27], v[59]))), op(op(op(v[7], v[39]), op(v[23], v[55])), op(op(v[15], v[47]),
         op(v[31], v[63]))))));
}
template <class Op>
float tree16(const float* v, Op op) {
  return op(op(op(op(v[0], v[8]), op(v[4], v[12])), op(op(v[2], v[10]), op(v[6], v[14]))),
         op(op(op(v[1], v[9]), op(v[5], v[13])), op(op(v[3], v[11]), op(v[7], v[15]))));
}
template <class Op>
float tree16_up(const float* v, Op op) {
  return op(op(op(op(v[0], v[1]), op(v[2], v[3])), op(op(v[4], v[5]), op(v[6], v[7]))),
         op(op(op(v[8], v[9]), op(v[10], v[11])), op(op(v[12], v[13]), op(v[14], v[15]))));
}

const auto kAdd = [](float a, float b) { return a + b; };
const auto kMax = [](float a, float b) { return k4::fmax_ieee(a, b); };

// Other trees a kernel might build by mistake.
float sum_sequential(const float* v, int n) {
  float s = v[0];
  for (int i = 1; i < n; ++i) s = s + v[i];
  return s;
}
float sum_adjacent_pairs(const float* v, int n) {  // offsets (1, 2, 4, ...)
  std::vector<float> t(v, v + n);
  for (int w = 1; w < n; w *= 2)
    for (int i = 0; i + w < n; i += 2 * w) t[i] = t[i] + t[i + w];
  return t[0];
}
float sum_exact(const float* v, int n) {
  long double s = 0;
  for (int i = 0; i < n; ++i) s += v[i];
  return float(s);
}

// Random lanes over 48 binades, random signs: a tree change almost surely changes bits.
std::array<float, 64> random_lanes(SplitMix& r) {
  std::array<float, 64> v;
  for (float& x : v) {
    x = float(std::ldexp(1.0 + double(r.next() >> 11) * 0x1p-53, r.range(-24, 24)));
    if (r.next() & 1) x = -x;
  }
  return v;
}

}  // namespace

TEST_SUITE("numerics") {

TEST_CASE("wave_sum: the written-out 64-lane tree, and every lane of butterfly") {
  SplitMix r(1);
  int bad = 0, d_seq = 0, d_pairs = 0, d_exact = 0;
  const int offs[6] = {32, 16, 8, 4, 2, 1};
  for (int it = 0; it < 20000; ++it) {
    const std::array<float, 64> v = random_lanes(r);
    const float want = tree64(v.data(), kAdd);
    const float got = k4::wave_sum(v.data());
    float lanes[64];
    std::memcpy(lanes, v.data(), sizeof lanes);
    k4::butterfly(lanes, 64, offs, 6, k4::AddF32{});
    bool ok = bits_of(got) == bits_of(want);
    for (int i = 0; i < 64; ++i) ok = ok && bits_of(lanes[i]) == bits_of(want);
    if (!ok && bad++ < 8)
      FAIL_CHECK("wave_sum case " << it << ": got " << hx(bits_of(got)) << " lane 63 " << hx(bits_of(lanes[63]))
                                  << " expected " << hx(bits_of(want)));
    d_seq += bits_of(sum_sequential(v.data(), 64)) != bits_of(want);
    d_pairs += bits_of(sum_adjacent_pairs(v.data(), 64)) != bits_of(want);
    d_exact += bits_of(sum_exact(v.data(), 64)) != bits_of(want);
  }
  CHECK(bad == 0);
  // The inputs tell trees apart: the sequential sum, the (1, 2, .., 32) tree and the exact sum
  // each give other bits on many of them.
  CHECK(d_seq > 5000);
  CHECK(d_pairs > 5000);
  CHECK(d_exact > 5000);
  MESSAGE("wave_sum: other bits in 20000 cases: sequential " << d_seq << ", offsets (1..32) " << d_pairs
                                                              << ", exact " << d_exact);
  // By hand: 2^24 at lane 0, 1 at lanes 32 and 48. Offsets (32, ..): 2^24 + 1 ties back to
  // 2^24, then 2^24 + 1 again -> 2^24. Offsets (1, ..): 1 + 1 first, 2^24 + 2 exactly.
  float h[64] = {};
  h[0] = 0x1p24f; h[32] = 1.0f; h[48] = 1.0f;
  CHECK(k4::wave_sum(h) == 0x1p24f);
  CHECK(sum_adjacent_pairs(h, 64) == 0x1p24f + 2.0f);
}

TEST_CASE("group_reduce: the written-out 16-lane tree; butterfly offsets in the order given") {
  SplitMix r(2);
  int bad = 0, d_up = 0;
  const int down[4] = {8, 4, 2, 1}, up[4] = {1, 2, 4, 8};
  for (int it = 0; it < 20000; ++it) {
    const std::array<float, 64> v = random_lanes(r);
    const float want = tree16(v.data(), kAdd), want_up = tree16_up(v.data(), kAdd);
    const float got = k4::group_reduce(v.data(), 16, k4::AddF32{});
    float l1[16], l2[16];
    std::memcpy(l1, v.data(), sizeof l1);
    std::memcpy(l2, v.data(), sizeof l2);
    k4::butterfly(l1, 16, down, 4, k4::AddF32{});
    k4::butterfly(l2, 16, up, 4, k4::AddF32{});
    bool ok = bits_of(got) == bits_of(want);
    for (int i = 0; i < 16; ++i) ok = ok && bits_of(l1[i]) == bits_of(want) && bits_of(l2[i]) == bits_of(want_up);
    if (!ok && bad++ < 8)
      FAIL_CHECK("group_reduce case " << it << ": got " << hx(bits_of(got)) << " expected " << hx(bits_of(want))
                                      << "; butterfly (1,2,4,8) lane 0 " << hx(bits_of(l2[0])) << " expected "
                                      << hx(bits_of(want_up)));
    d_up += bits_of(want_up) != bits_of(want);
  }
  CHECK(bad == 0);
  CHECK(d_up > 2000);  // the offset order is visible in the bits
  // Smaller groups: n = 2, 4, 8 are the first levels of the same tree, on lanes 0..n-1.
  const float v[8] = {0x1p24f, 1.0f, 1.0f, 1.0f, 3.0f, -0x1p24f, 0.5f, 0.25f};
  CHECK(k4::group_reduce(v, 2, k4::AddF32{}) == v[0] + v[1]);
  CHECK(k4::group_reduce(v, 4, k4::AddF32{}) == (v[0] + v[2]) + (v[1] + v[3]));
  CHECK(bits_of(k4::group_reduce(v, 8, k4::AddF32{})) ==
        bits_of(((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))));
}

TEST_CASE("butterfly: lane i becomes op(v[i], v[i ^ off]) (a non-commutative op shows it)") {
  // op(a, b) = 2a - b, exact on small integers: the operand order and the partner lane are
  // both visible. A partial butterfly (8, 2) over 16 lanes, against the definition.
  auto op = [](float a, float b) { return 2.0f * a - b; };
  float v[16], want[16];
  for (int i = 0; i < 16; ++i) v[i] = want[i] = float(i * i % 11);
  const int offs[2] = {8, 2};
  for (int off : offs) {
    float t[16];
    for (int i = 0; i < 16; ++i) t[i] = op(want[i], want[i ^ off]);
    std::memcpy(want, t, sizeof t);
  }
  k4::butterfly(v, 16, offs, 2, op);
  for (int i = 0; i < 16; ++i) {
    CAPTURE(i);
    CHECK(v[i] == want[i]);
  }
  CHECK(want[0] != want[2]);  // lanes differ: not a test of a constant
  // Integer ops: wrapping add and max.
  int32_t a[64];
  int64_t total = 0;
  for (int i = 0; i < 64; ++i) { a[i] = (i % 2) ? INT32_MAX - i : -i * 1000; total += a[i]; }
  int32_t s[64], m[64];
  std::memcpy(s, a, sizeof a);
  std::memcpy(m, a, sizeof a);
  const int w[6] = {32, 16, 8, 4, 2, 1};
  k4::butterfly(s, 64, w, 6, k4::AddI32{});
  k4::butterfly(m, 64, w, 6, k4::MaxI32{});
  for (int i = 0; i < 64; ++i) {
    CHECK(uint32_t(s[i]) == uint32_t(uint64_t(total)));  // modulo 2^32
    CHECK(m[i] == INT32_MAX - 1);
  }
}

TEST_CASE("wave_max: NaN wins, -0 below +0; max is associative, so every tree agrees") {
  // fmax_ieee is a lattice max (NaN absorbing, -0 < +0): unlike the sum, no tree order can
  // change its bits, so this checks the values, the written tree and two other orders.
  SplitMix r(3);
  int bad = 0;
  for (int it = 0; it < 5000; ++it) {
    std::array<float, 64> v = random_lanes(r);
    const int kind = it % 5;
    if (kind == 1) v[r.range(0, 63)] = float_of(r.next() & 1 ? 0xFFC00000u : 0x7F800001u);
    if (kind == 2) for (float& x : v) x = (r.next() & 1) ? -0.0f : -1.0f;
    if (kind == 3) { for (float& x : v) x = -0.0f; v[r.range(0, 63)] = 0.0f; }
    if (kind == 4) for (float& x : v) x = -std::fabs(x);
    float seq = v[0];
    for (int i = 1; i < 64; ++i) seq = k4::fmax_ieee(seq, v[i]);
    const float want = tree64(v.data(), kMax), got = k4::wave_max(v.data());
    float lanes[64];
    std::memcpy(lanes, v.data(), sizeof lanes);
    const int offs[6] = {32, 16, 8, 4, 2, 1};
    k4::butterfly(lanes, 64, offs, 6, k4::MaxF32{});
    bool ok = bits_of(got) == bits_of(want) && bits_of(seq) == bits_of(want);
    for (int i = 0; i < 64; ++i) ok = ok && bits_of(lanes[i]) == bits_of(want);
    if (!ok && bad++ < 8)
      FAIL_CHECK("wave_max case " << it << ": got " << hx(bits_of(got)) << " expected " << hx(bits_of(want)));
  }
  CHECK(bad == 0);
  float z[64];
  for (float& x : z) x = -0.0f;
  CHECK(bits_of(k4::wave_max(z)) == 0x80000000u);
  z[37] = 0.0f;
  CHECK(bits_of(k4::wave_max(z)) == 0x00000000u);
  z[5] = float_of(0xFFC00001u);
  CHECK(bits_of(k4::wave_max(z)) == 0x7FC00000u);
  float n16[16];
  for (int i = 0; i < 16; ++i) n16[i] = -float(i);
  CHECK(k4::group_reduce(n16, 16, k4::MaxF32{}) == 0.0f);
  CHECK(bits_of(tree16(n16, kMax)) == bits_of(k4::group_reduce(n16, 16, k4::MaxF32{})));
}

TEST_CASE("butterfly: planted errors are caught") {
  SplitMix r(4);
  const std::array<float, 64> v = random_lanes(r);
  const float want = tree64(v.data(), kAdd);
  CHECK(bits_of(k4::wave_sum(v.data())) == bits_of(want));
  CHECK_FALSE(bits_of(k4::wave_sum(v.data())) + 1u == bits_of(want));
  // The same tree with lanes 1 and 32 swapped (lane 0 meets lane 1 first, not lane 32)
  // gives other bits on many random inputs.
  int caught = 0;
  for (int it = 0; it < 1000; ++it) {
    std::array<float, 64> u = random_lanes(r), sw = u;
    std::swap(sw[1], sw[32]);
    caught += bits_of(tree64(sw.data(), kAdd)) != bits_of(k4::wave_sum(u.data()));
  }
  CHECK(caught > 100);
}

}  // TEST_SUITE numerics
