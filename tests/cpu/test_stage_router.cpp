// test_stage_router.cpp -- stage 4 (RMSNorm, MXFP8 xn, gate logits, sigmoid, route keys) and
// the routing picks of stage 5 on hand-made rows: a constant row, constant gate rows, scores
// that tie after the route key drops 7 bits, the route weights.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/config.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/policy.hpp"
#include "reference/stages/moe.hpp"
#include "reference/stages/router.hpp"
#include "reference/weights.hpp"
#include "tests/cpu/float64_model.hpp"

namespace {

using k4::f64::bf16;
using k4::f64::bf16_nearest;

float f32_next(float x, int ulps) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += uint32_t(ulps);
  std::memcpy(&x, &u, 4);
  return x;
}

k4::RankWeights router_weights(const k4::Config& c, double g, double gate) {
  k4::RankWeights w;
  w.g_post.assign(c.hidden, bf16_nearest(g));
  w.w_gate.assign(size_t(c.n_routed) * c.hidden, bf16_nearest(gate));
  w.bias.assign(c.n_routed, 0.0f);
  return w;
}

// A RouterOut for one token whose keys come from scores (sig + bias) and sigs.
k4::RouterOut keyed(const std::vector<float>& score, const std::vector<float>& sig) {
  k4::RouterOut r;
  r.sig = sig;
  for (size_t e = 0; e < score.size(); ++e) r.key.push_back(k4::route_key(score[e], int(e)));
  return r;
}

}  // namespace

TEST_SUITE("stage_router") {

TEST_CASE("RMSNorm of a constant row") {
  const k4::Config c = k4::preset("tiny");
  for (double v : {1.0, 2.0, -3.0, 0.125}) {
    for (double g : {0.0, 1.0}) {
      CAPTURE(v);
      CAPTURE(g);
      // a = v, h_in = 0: ss = hidden v^2 (exact), rstd = rsq(v^2 + f32(1e-6)) ~ 1/|v|
      std::vector<uint16_t> a(c.hidden, bf16_nearest(v)), h(c.hidden, 0);
      k4::RouterOut r;
      k4::route_scores(r, a, h, router_weights(c, g, 0.0), 1, c);
      const double rstd = 1.0 / std::sqrt(double(float(float(v * v) + 1e-6f)));
      CHECK(std::fabs(r.rstd[0] - rstd) <= rstd * 0x1p-23);
      // xn = bf16(v rstd (1 + g)) = sign(v) (1 + g): v rstd is within 1e-6 of +-1
      for (int i = 0; i < c.hidden; ++i) REQUIRE(bf16(r.xn[i]) == (v < 0 ? -1.0 : 1.0) * (1.0 + g));
      // MXFP8 of a block of +-(1 + g): amax * f32(1/448) has a nonzero mantissa, so the scale
      // rounds up: 1 -> 2^-9 * 1.14 -> e = 118 + 1 (2^-8); 2 -> e = 120 (2^-7). Then
      // (1 + g) * 2^(127 - e) = 256 (E4M3 0x78, sign bit for v < 0)
      const int e = g == 0.0 ? 119 : 120;
      for (int b = 0; b < c.hidden / 32; ++b) REQUIRE(r.xsc[b] == e);
      for (int i = 0; i < c.hidden; ++i) REQUIRE(r.xn8[i] == (v < 0 ? 0xF8 : 0x78));
      // the logits of an all-zero gate are +0, the sigmoid 1/2
      for (int x = 0; x < c.n_routed; ++x) {
        CHECK(r.logit[x] == 0.0f);
        CHECK(r.sig[x] == 0.5f);
      }
    }
  }
}

TEST_CASE("constant gate rows: logit = sum of the row, sigmoid of bf16(logit)") {
  const k4::Config c = k4::preset("tiny");
  std::vector<uint16_t> a(c.hidden, bf16_nearest(1.0)), h(c.hidden, 0);
  k4::RankWeights w = router_weights(c, 0.0, 0.0);
  for (int e = 0; e < c.n_routed; ++e)
    for (int i = 0; i < c.hidden; ++i) w.w_gate[size_t(e) * c.hidden + i] = bf16_nearest((e - 16) * 0x1p-11);
  for (int e = 0; e < c.n_routed; ++e) w.bias[e] = 0.25f * float(e % 4);
  k4::RouterOut r;
  k4::route_scores(r, a, h, w, 1, c);
  for (int e = 0; e < c.n_routed; ++e) {
    CAPTURE(e);
    // hidden (e - 16) 2^-11, every partial sum exact (multiples of 2^-11 below 2^12)
    const double lg = (e - 16) * c.hidden * 0x1p-11;
    CHECK(r.logit[e] == float(lg));
    const double s = 1.0 / (1.0 + std::exp(-bf16(bf16_nearest(lg))));
    // the f32 product L * log2e moves e^-L by |L| 2^-24 relative; rcp, 1 + e, exp2 3 ulp
    CHECK(std::fabs(r.sig[e] - s) <= s * ((1.0 - s) * std::fabs(lg) * 0x1p-23 + 0x1p-22));
    CHECK(r.key[e] == k4::route_key(r.sig[e] + w.bias[e], e));
  }
}

// ---- V1 (docs/numerics.md §13): router.gate = f32 and router.round_logit = false ----------

// h_in = 0, a = 1024 at elements 0 and 1 (g_post 0): ss / hidden = 2 * 2^20 / 2048 = 2^10, so
// rstd = 2^-5 exactly and xn = 32 at elements 0 and 1, +0 elsewhere (lane 0, chain 0's pair).
struct OneHot {
  k4::Config c = k4::preset("tiny");
  std::vector<uint16_t> a, h;
  k4::RankWeights w;
  OneHot() : a(c.hidden, 0), h(c.hidden, 0), w(router_weights(c, 0.0, 0.0)) {
    a[0] = a[1] = bf16_nearest(1024.0);
    w.w_gate_f32.assign(size_t(c.n_routed) * c.hidden, 0.0f);
  }
  void gate(int e, float g0, float g1) {  // the F32 gate row and its bf16 copy
    w.w_gate_f32[size_t(e) * c.hidden] = g0, w.w_gate_f32[size_t(e) * c.hidden + 1] = g1;
    w.w_gate[size_t(e) * c.hidden] = k4::bf16_bits_rne(g0), w.w_gate[size_t(e) * c.hidden + 1] = k4::bf16_bits_rne(g1);
  }
  k4::RouterOut run(const std::string& variant) {
    k4::Config v = c;
    v.variant = k4::parse_variant(variant);
    k4::RouterOut r;
    k4::route_scores(r, a, h, w, 1, v);
    REQUIRE(bf16(r.xn[0]) == 32.0);
    REQUIRE(bf16(r.xn[2]) == 0.0);
    return r;
  }
};

float sigmoid_of(float x) { return k4::rcp_approx(1.0f + k4::exp2_approx(-x * k4::kLog2e)); }

TEST_CASE("V1a one-hot: the logit is the F32 gate value times xn exactly; the seed's and V1b's its bf16 copy's") {
  OneHot t;
  const float g = k4::f32_from_bits(0x3DCCCCCDu);  // f32(0.1); bf16 copy 0x3DCD (0.10009765625)
  t.gate(5, g, 0.0f);
  const k4::RouterOut seed = t.run("seed"), v1a = t.run("router.gate=f32,router.round_logit=false"),
                      v1b = t.run("router.round_logit=false");
  CHECK(k4::f32_bits(v1a.logit[5]) == k4::f32_bits(g * 32.0f));  // fma(0, 0, fma(g, 32, +0)) = 32 g
  CHECK(k4::f32_bits(seed.logit[5]) == 0x404D0000u);             // 32 * 0x3DCD0000
  CHECK(k4::f32_bits(v1b.logit[5]) == 0x404D0000u);
  CHECK(k4::f32_bits(v1a.sig[5]) == k4::f32_bits(sigmoid_of(g * 32.0f)));
  CHECK(k4::f32_bits(seed.sig[5]) == k4::f32_bits(sigmoid_of(k4::f32_from_bits(0x404D0000u))));
  CHECK(v1a.sig[5] != seed.sig[5]);
  // V1b = seed where the logit is bf16-exact (here every logit)
  CHECK(v1b.sig == seed.sig);
  CHECK(v1b.key == seed.key);
  // xn, its MXFP8 and rstd do not depend on the gate variant
  CHECK(v1a.xn == seed.xn);
  CHECK(v1a.xn8 == seed.xn8);
  CHECK(v1a.xsc == seed.xsc);
  CHECK(v1a.rstd == seed.rstd);
}

TEST_CASE("V1b: a logit that is not bf16-exact is not rounded (32 + 2^-5: the seed's sigmoid takes 32)") {
  OneHot t;
  t.gate(7, 1.0f, 0x1p-10f);  // bf16-exact gate: 32 * 1 + 32 * 2^-10 = 32.03125
  const k4::RouterOut seed = t.run("seed"), v1b = t.run("router.round_logit=false"),
                      v1a = t.run("router.gate=f32,router.round_logit=false");
  CHECK(seed.logit[7] == 32.03125f);
  CHECK(v1b.logit[7] == 32.03125f);
  CHECK(k4::f32_bits(seed.sig[7]) == k4::f32_bits(sigmoid_of(32.0f)));  // bf16(32.03125) = 32
  CHECK(k4::f32_bits(v1b.sig[7]) == k4::f32_bits(sigmoid_of(32.03125f)));
  CHECK(v1a.sig[7] == v1b.sig[7]);  // a bf16-exact gate: V1a's operands are V1b's
  // tie: a negative logit far enough out that the sigmoids differ in bits
  t.gate(8, -0.125f, -0x1p-11f);  // 32 (-0.125 - 2^-11) = -4.015625, bf16 -4.0
  const k4::RouterOut s2 = t.run("seed"), b2 = t.run("router.round_logit=false");
  CHECK(s2.logit[8] == -4.015625f);
  CHECK(k4::f32_bits(s2.sig[8]) == k4::f32_bits(sigmoid_of(-4.0f)));
  CHECK(k4::f32_bits(b2.sig[8]) == k4::f32_bits(sigmoid_of(-4.015625f)));
  CHECK(s2.sig[8] != b2.sig[8]);
}

TEST_CASE("V1a with a bf16-exact F32 gate and the logit rounded gives the seed's bits (the fma pair is the portable fdot2)") {
  const k4::Config c = k4::preset("tiny");
  k4::RankWeights w = router_weights(c, 0.0, 0.0);
  uint64_t z = 12345;
  auto next = [&] { z = z * 6364136223846793005ull + 1442695040888963407ull; return double(int64_t(z >> 40) % 2001 - 1000); };
  for (int i = 0; i < c.hidden; ++i) w.g_post[i] = bf16_nearest(next() * 1e-4);
  for (auto& g : w.w_gate) g = bf16_nearest(next() * 2e-5);
  for (auto& b : w.bias) b = float(next() * 1e-5);
  w.w_gate_f32.resize(w.w_gate.size());
  for (size_t i = 0; i < w.w_gate.size(); ++i) w.w_gate_f32[i] = bf16(w.w_gate[i]);
  std::vector<uint16_t> a(size_t(3) * c.hidden), h(size_t(3) * c.hidden);
  for (auto& x : a) x = bf16_nearest(next() * 1e-3);
  for (auto& x : h) x = bf16_nearest(next() * 1e-3);
  k4::RouterOut seed, v1a;
  k4::route_scores(seed, a, h, w, 3, c);
  k4::Config f = c;
  f.variant.router_gate = k4::RouterGate::f32;
  k4::route_scores(v1a, a, h, w, 3, f);
  CHECK(v1a.logit == seed.logit);
  CHECK(v1a.key == seed.key);
  // the F32 gate's own low bits move the logits (the fixture's planted one-bit error)
  w.w_gate_f32[5] = k4::f32_from_bits(k4::f32_bits(w.w_gate_f32[5]) ^ 0x10000u);
  k4::RouterOut moved;
  k4::route_scores(moved, a, h, w, 3, f);
  CHECK(moved.logit != seed.logit);
  // without an F32 gate, router.gate = f32 is refused by name
  w.w_gate_f32.clear();
  CHECK_THROWS_WITH_AS(k4::route_scores(moved, a, h, w, 3, f), doctest::Contains("router.gate = f32 needs the F32 gate w_gate_f32"),
                       std::invalid_argument);
}

TEST_CASE("route keys: scores equal after dropping 7 bits tie, and the lower expert wins") {
  const float half = 0.5f;
  const float half64 = f32_next(half, 64), half127 = f32_next(half, 127), half128 = f32_next(half, 128);
  // one bucket (bits >> 7 equal): the lower id wins whatever the low bits say
  CHECK(k4::route_key(half, 3) > k4::route_key(half64, 9));
  CHECK(k4::route_key(half127, 3) > k4::route_key(half, 9));
  CHECK(k4::route_key(half, 9) < k4::route_key(half127, 3));
  // the next bucket beats both
  CHECK(k4::route_key(half128, 120) > k4::route_key(half127, 0));
  // orderable: negative scores below positive ones, more negative lower; -0 below +0
  CHECK(k4::route_key(-0.25f, 0) < k4::route_key(0.0f, 127));
  CHECK(k4::route_key(-0.5f, 0) < k4::route_key(-0.25f, 127));
  CHECK(k4::route_key(-0.0f, 0) < k4::route_key(0.0f, 127));
  // a NaN as the canonical NaN of its sign: +NaN above +Inf, -NaN below -Inf, any payload
  const float qnan = std::numeric_limits<float>::quiet_NaN(), nnan = k4::f32_from_bits(0xFFC00000u);
  CHECK(k4::route_key(qnan, 5) > k4::route_key(INFINITY, 0));
  CHECK(k4::route_key(nnan, 0) < k4::route_key(-INFINITY, 127));
  CHECK(k4::route_key(k4::f32_from_bits(0xFFFFFFFFu), 4) == k4::route_key(nnan, 4));
  CHECK(k4::route_key(k4::f32_from_bits(0x7F800001u), 4) == k4::route_key(qnan, 4));
  // the id bits: 127 - e in the low 7 bits
  CHECK((k4::route_key(half, 3) & 127) == 124);
}

TEST_CASE("R4.10: a NaN sig keys as -NaN (the seed negates the NaN logit), a NaN bias by its own sign") {
  const float qnan = std::numeric_limits<float>::quiet_NaN(), nnan = k4::f32_from_bits(0xFFC00000u);
  CHECK(k4::route_key_of(qnan, 0.25f, 7) == k4::route_key(nnan, 7));
  CHECK(k4::route_key_of(qnan, 0.25f, 7) < k4::route_key_of(0.0f, -INFINITY, 0));  // below every number
  CHECK(k4::route_key_of(qnan, qnan, 7) == k4::route_key(nnan, 7));                 // the sig's NaN first
  CHECK(k4::route_key_of(0.5f, qnan, 7) > k4::route_key_of(1.0f, INFINITY, 0));     // a +NaN bias: first
  CHECK(k4::route_key_of(0.5f, nnan, 7) == k4::route_key(nnan, 7));
  CHECK(k4::route_key_of(0.5f, 0.25f, 7) == k4::route_key(0.75f, 7));
  // routed: a NaN logit's expert is never among the 4 picks while 4 others have numbers
  const k4::Config c = k4::preset("tiny");
  k4::RouterOut r;
  r.sig.assign(32, 0.5f);
  for (int e = 0; e < 32; ++e) r.key.push_back(k4::route_key_of(e == 0 ? qnan : 0.5f, 0.0f, e));
  r.sig[0] = qnan;
  k4::RouteOut out;
  k4::route_top4(out, r, 1, c);
  CHECK(std::vector<int32_t>(out.ids.begin(), out.ids.begin() + 4) == std::vector<int32_t>({1, 2, 3, 4}));
}

TEST_CASE("route_top4: picks by key in pick order, weights renormalized, the shared slot") {
  const k4::Config c = k4::preset("tiny");  // 32 routed experts
  std::vector<float> score(32, 0.0f), sig(32, 0.0f);
  for (int e = 0; e < 32; ++e) score[e] = 0.01f * float(e % 7);  // below 0.25
  score[20] = f32_next(0.5f, 128);  // a bucket above 0.5
  score[3] = 0.5f;                  // 3 and 9 tie in 0.5's bucket: 3 first
  score[9] = f32_next(0.5f, 64);
  score[30] = 0.25f;
  sig[20] = 0.5f, sig[3] = 0.25f, sig[9] = 0.125f, sig[30] = 0.125f;  // unbiased sigmoids
  k4::RouteOut ro;
  k4::route_top4(ro, keyed(score, sig), 1, c);
  CHECK(std::vector<int32_t>(ro.ids.begin(), ro.ids.end()) == std::vector<int32_t>({20, 3, 9, 30, 32}));
  // tot = (0.5 + 0.25) + (0.125 + 0.125) = 1; w = sig * (2 / 1)
  CHECK(std::vector<float>(ro.weights.begin(), ro.weights.end()) == std::vector<float>({1.0f, 0.5f, 0.25f, 0.25f, 1.0f}));
  // every score equal: the four lowest ids; all sigmoids 0: max(tot, 1e-20) keeps the weights 0
  k4::route_top4(ro, keyed(std::vector<float>(32, 0.75f), std::vector<float>(32, 0.0f)), 1, c);
  CHECK(std::vector<int32_t>(ro.ids.begin(), ro.ids.end()) == std::vector<int32_t>({0, 1, 2, 3, 32}));
  for (int p = 0; p < 4; ++p) CHECK(ro.weights[p] == 0.0f);
}

}  // TEST_SUITE
