// test_stage_router.cpp -- stage 4 (RMSNorm, MXFP8 xn, gate logits, sigmoid, route keys) and
// the routing picks of stage 5 on hand-made rows: a constant row, constant gate rows, scores
// that tie after the route key drops 7 bits, the route weights.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "reference/config.hpp"
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
  // NaN (keyed as the canonical +NaN) ranks above +Inf
  CHECK(k4::route_key(std::numeric_limits<float>::quiet_NaN(), 5) > k4::route_key(INFINITY, 0));
  // the id bits: 127 - e in the low 7 bits
  CHECK((k4::route_key(half, 3) & 127) == 124);
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
