// test_stage_moe.cpp -- stage 5 (experts) on hand-made experts: swiglu's clamp and special
// values, up / gate of a one-element row, the MXFP8 of mid (round-up, exact powers, ties, an
// all -0 block), and a down sum whose narrow and wide orders differ in bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "reference/config.hpp"
#include "reference/stages/moe.hpp"
#include "reference/stages/router.hpp"
#include "reference/weights.hpp"
#include "tests/cpu/float64_model.hpp"

namespace {

using k4::f64::bf16;
using k4::f64::bf16_nearest;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// Experts set by hand; any other id is all zero (nibbles 0, scales 127).
class HandExperts : public k4::ExpertSource {
 public:
  explicit HandExperts(const k4::Config& c) : c_(c) {}
  k4::ExpertWeights& at(int e) {
    auto& p = map_[e];
    if (!p) p = zero();
    return *p;
  }
  std::shared_ptr<const k4::ExpertWeights> expert(int, int e) const override {
    auto it = map_.find(e);
    return it != map_.end() ? it->second : zero();
  }
  // element i of row r of an MXFP4 matrix cols wide: nibble, and its 32-block's scale
  static void set(std::vector<uint8_t>& w, std::vector<uint8_t>& s, int cols, int r, int i, uint8_t nib, uint8_t scale) {
    uint8_t& b = w[size_t(r) * cols / 2 + i / 2];
    b = i % 2 ? uint8_t((b & 0x0F) | (nib << 4)) : uint8_t((b & 0xF0) | nib);
    s[size_t(r) * cols / 32 + i / 32] = scale;
  }

 private:
  std::shared_ptr<k4::ExpertWeights> zero() const {
    auto w = std::make_shared<k4::ExpertWeights>();
    const int H = c_.hidden, I = c_.inter;
    w->w13.assign(size_t(2 * I) * H / 2, 0), w->s13.assign(size_t(2 * I) * H / 32, 127);
    w->w2.assign(size_t(H) * I / 2, 0), w->s2.assign(size_t(H) * I / 32, 127);
    return w;
  }
  k4::Config c_;
  std::map<int, std::shared_ptr<k4::ExpertWeights>> map_;
};

k4::RouteOut route(std::vector<int32_t> ids, std::vector<float> w) {
  k4::RouteOut r;
  r.ids = std::move(ids), r.weights = std::move(w);
  return r;
}

}  // namespace

TEST_SUITE("stage_moe") {

TEST_CASE("swiglu: the clamp, its special values, a hand value") {
  const float L = 7.0f;
  auto bits = [&](float g, float u) { return f32_bits(k4::swiglu(g, u, L)); };
  // g' = min(g, 7): any g >= 7 (and +Inf) gives g = 7's bits
  for (float g : {7.0f, 7.5f, 100.0f, 3e38f, kInf}) CHECK(bits(g, 0.3f) == bits(7.0f, 0.3f));
  // u' = clamp(u, -7, 7)
  for (float u : {7.0f, 8.0f, 1e30f, kInf}) CHECK(bits(1.5f, u) == bits(1.5f, 7.0f));
  for (float u : {-7.0f, -8.0f, -1e30f, -kInf}) CHECK(bits(1.5f, u) == bits(1.5f, -7.0f));
  CHECK(bits(1.5f, 6.99f) != bits(1.5f, 7.0f));
  CHECK(bits(6.99f, 0.3f) != bits(7.0f, 0.3f));
  // NaN in either propagates (canonical); g = -Inf: -Inf * sigmoid(-Inf) = -Inf * 0 = NaN
  CHECK(std::isnan(k4::swiglu(kNaN, 1.0f, L)));
  CHECK(std::isnan(k4::swiglu(1.0f, kNaN, L)));
  CHECK(std::isnan(k4::swiglu(-kInf, 1.0f, L)));
  // a very negative g: sigmoid underflows to 0, the zero takes the sign of -(u' + 1)
  CHECK(bits(-100.0f, 1.0f) == 0x80000000u);
  CHECK(bits(-100.0f, -3.0f) == 0x00000000u);
  CHECK(bits(0.0f, -7.0f) == 0x80000000u);  // (0 * 0.5) * (-6)
  // swiglu(1, 0) = sigmoid(1.702) = 0.8457957...; swiglu(7, 7) = 7 sigmoid(11.914) 8
  CHECK(std::fabs(k4::swiglu(1.0f, 0.0f, L) - 1.0 / (1.0 + std::exp(-1.702))) <= 4e-7);
  CHECK(std::fabs(k4::swiglu(7.0f, 7.0f, L) - 56.0 / (1.0 + std::exp(-11.914))) <= 56.0 * 4e-7);
}

TEST_CASE("up / gate of one element, swiglu, and the mid's MXFP8 blocks") {
  const k4::Config c = k4::preset("tiny");  // inter 128: 4 MXFP8 blocks a slot
  const int H = c.hidden, I = c.inter;
  HandExperts src(c);
  k4::ExpertWeights& ex = src.at(5);
  // gate row r: element 0 = 4.0 with scale 2^1 -> g = 8 (clamped to 7)
  // up row r: element 0 = u_r -> mid = bf16(7 sigmoid(11.914) (u' + 1)) = 7 (u' + 1)
  //   (sigmoid(11.914) = 1 - 6.7e-6 is within bf16's half ulp of 1 for these values)
  std::vector<double> u(I, 0.0), mid(I);
  u[5] = 1.0, u[9] = 2.0;                       // block 0: mids 7, 14 (row 5), 21 (row 9)
  u[40] = 6.0;                                  // block 1: 7 and 49
  for (int r = 64; r < 96; ++r) u[r] = 12.0;    // block 2: u' = 7: 56 everywhere
  for (int r = 0; r < 96; ++r) {
    HandExperts::set(ex.w13, ex.s13, H, r, 0, 0x6, 128);
    const uint8_t nib = u[r] == 0 ? 0 : u[r] == 1 ? 2 : u[r] == 2 ? 4 : u[r] == 6 ? 7 : 7;
    HandExperts::set(ex.w13, ex.s13, H, I + r, 0, nib, u[r] == 12.0 ? 128 : 127);
    mid[r] = 7.0 * (std::min(u[r], 7.0) + 1.0);
  }
  for (int r = 96; r < 128; ++r) {  // block 3: gate 0, u = -12 (u' = -7): (0 * 0.5) * -6 = -0
    HandExperts::set(ex.w13, ex.s13, H, I + r, 0, 0xF, 128);
    mid[r] = -0.0;
  }
  k4::RouterOut rr;
  rr.xn8.assign(H, 0), rr.xsc.assign(H / 32, 127);
  rr.xn8[0] = 0x38;  // x = 1.0 at element 0
  const k4::RouteOut ro = route({5, 6, 7, 8, 32}, {0.25f, 0.25f, 0.25f, 0.25f, 1.0f});
  k4::MoeOut moe;
  k4::experts_up_gate(moe, ro, rr, src, 0, 1, c);
  for (int r = 0; r < I; ++r) {
    CAPTURE(r);
    CHECK(moe.gate[r] == (r < 96 ? 8.0f : 0.0f));
    CHECK(moe.up[r] == float(r < 96 ? u[r] : -12.0));
    CHECK(moe.mid[r] == bf16_nearest(mid[r]));
  }
  // MXFP8 blocks of slot 0:
  //  block 0, amax 21: 21 f32(1/448) = 1.5 2^-5 (+ 1 ulp), mantissa != 0 -> e = 122 + 1 = 123,
  //    inv 16: 7 -> 112 (0x6E), 14 -> 224 (0x76), 21 -> 336, the tie of 320 / 352 -> 320 (0x7A)
  //  block 1, amax 49: 49 f32(1/448) = 1.75 2^-4 (+ 1 ulp) -> e = 124, inv 8: 7 -> 56 (0x66),
  //    49 -> 392 -> 384 (0x7C)
  //  block 2, amax 56: 56 f32(1/448) = 2^-3 exactly (no round-up) -> e = 124: 448 (0x7E)
  //  block 3, all -0: amax +0 -> e = 1; -0 * 2^126 = -0 -> the code 0x80
  CHECK(moe.midsc[0] == 123);
  CHECK(moe.midsc[1] == 124);
  CHECK(moe.midsc[2] == 124);
  CHECK(moe.midsc[3] == 1);
  CHECK(moe.mid8[0] == 0x6E);
  CHECK(moe.mid8[5] == 0x76);
  CHECK(moe.mid8[9] == 0x7A);
  CHECK(moe.mid8[32] == 0x66);
  CHECK(moe.mid8[40] == 0x7C);
  for (int r = 64; r < 96; ++r) CHECK(moe.mid8[r] == 0x7E);
  for (int r = 96; r < 128; ++r) CHECK(moe.mid8[r] == 0x80);
  // the other slots (zero experts): g = u = 0, mid 0, an all-zero block: scale byte 1, zeros
  for (size_t i = I; i < moe.mid8.size(); ++i) CHECK(moe.mid8[i] == 0x00);
  for (size_t b = 4; b < moe.midsc.size(); ++b) CHECK(moe.midsc[b] == 1);
}

TEST_CASE("down: narrow and wide sum the same terms in different orders") {
  k4::Config c = k4::preset("tiny");  // inter 128: one 128-k chunk a slot (KC = 1)
  const int H = c.hidden, I = c.inter;
  HandExperts src(c);
  // unit values (every row): expert 7 -> 1, 2 -> 2^-24, 5 -> 2^-24, 1 -> -1, shared (32) -> 0;
  // a unit is w2[r][0] * mid[0] * 2^(s2 - 127) with mid = 1.0
  const std::map<int, std::pair<uint8_t, uint8_t>> unit = {{7, {0x2, 127}}, {2, {0x2, 103}}, {5, {0x2, 103}}, {1, {0xA, 127}}};
  for (const auto& [e, ns] : unit) {
    k4::ExpertWeights& ex = src.at(e);
    for (int r = 0; r < H; ++r) HandExperts::set(ex.w2, ex.s2, I, r, 0, ns.first, ns.second);
  }
  const k4::RouteOut ro = route({7, 2, 5, 1, 32}, {1.0f, 1.0f, 1.0f, 1.0f, 1.0f});
  k4::MoeOut base;
  base.mid8.assign(size_t(5) * I, 0), base.midsc.assign(size_t(5) * I / 32, 127);
  for (int s = 0; s < 5; ++s) base.mid8[size_t(s) * I] = 0x38;
  // narrow (pick order, shared apart): ((((0 + 1) + 2^-24) + 2^-24) - 1) + 0 ... = 0
  c.wide_from = 5;
  k4::MoeOut narrow = base;
  k4::experts_down(narrow, ro, src, 0, 1, c);
  // wide (expert id order 1, 2, 5, 7, shared; quarter q takes units q, q + 4):
  //   A0 = (0 + U1) + Ush = -1, A1 = 2^-24, A2 = 2^-24, A3 = 1: (((0 - 1) + 2^-24) + 2^-24) + 1 = 2^-23
  c.wide_from = 1;
  k4::MoeOut wide = base;
  k4::experts_down(wide, ro, src, 0, 1, c);
  for (int r = 0; r < H; ++r) {
    REQUIRE(narrow.partial[r] == 0x0000);
    REQUIRE(wide.partial[r] == bf16_nearest(0x1p-23));
  }
  // both within the float64 bound of the exact 2^-23
  for (bool w : {false, true}) {
    c.wide_from = w ? 1 : 5;
    const k4::f64::Report rep = k4::f64::check_down(c, ro, src, 0, w ? wide : narrow, 1);
    CHECK_MESSAGE(k4::f64::all_ok(rep), k4::f64::describe(rep));
  }
}

}  // TEST_SUITE
