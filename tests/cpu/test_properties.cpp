// test_properties.cpp -- numeric properties of stages 2-5 on seeded random inputs:
//  - the all-reduce's two forms (plain, reduce-scatter + all-gather) give the same bits for
//    any W, token count and special values, and the rank order is really modeled (a
//    permutation changes the bits of cancellation-prone partials);
//  - an all-zero row quantizes to zeros (the merge quant, MXFP8 of xn and of mid);
//  - swiglu respects its clamp;
//  - narrow and wide MoE differ in bits on random steps (wide_from forced) yet both stay
//    within the float64 bound.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <numeric>
#include <vector>

#include "reference/config.hpp"
#include "reference/model.hpp"
#include "reference/stages/merge.hpp"
#include "reference/stages/moe.hpp"
#include "reference/stages/oproj.hpp"
#include "reference/stages/router.hpp"
#include "tests/cpu/fixtures.hpp"
#include "tests/cpu/float64_model.hpp"

namespace {

using k4::test::Rng;
using k4::f64::bf16;
using k4::f64::bf16_nearest;

uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// bf16 partials with the specials mixed in: +-0, NaN, +-Inf, subnormals, big and tiny values.
uint16_t draw_partial(Rng& r) {
  switch (r.below(20)) {
    case 0: return 0x8000;                          // -0
    case 1: return 0x0000;
    case 2: return r.below(50) ? uint16_t(0x0001 + r.below(0x7F)) : 0x7FC0;  // subnormal (rarely NaN)
    case 3: return r.below(40) ? uint16_t(0x7F00 + r.below(0x7F)) : 0x7F80;  // huge (rarely Inf)
    case 4: return uint16_t(0x8000 | (0x7F00 + r.below(0x7F)));
    default: return bf16_nearest(r.normal() * std::ldexp(1.0, r.below(30) - 15));
  }
}

// Cancelling rows in the spirit of (1, 2^-24, 2^-24, -1): rank 0 holds +-big, ranks 1..W-2
// terms below half an ulp of big, rank W-1 holds -big. In rank order each small term rounds
// away (big + small = big) and the sum is exactly +0; with the last rank moved second, big
// cancels first and the sum is the small terms' (exact in bf16).
std::vector<std::vector<uint16_t>> cancelling(Rng& r, int W, size_t n, std::vector<uint16_t>& smalls) {
  std::vector<std::vector<uint16_t>> p(W, std::vector<uint16_t>(n));
  smalls.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int e = r.below(40) - 20;
    const double big = (r.below(2) ? 1 : -1) * std::ldexp(1.0 + r.below(8) / 8.0, e);
    p[0][i] = bf16_nearest(big);
    double sum = 0.0;
    for (int w = 1; w + 1 < W; ++w) {
      const double s = (r.below(2) ? 1 : -1) * std::ldexp(1.0 + r.below(4) / 4.0, e - 26);  // < 2^(e-24)
      p[w][i] = bf16_nearest(s);
      sum += s;
    }
    p[W - 1][i] = bf16_nearest(-big);
    smalls[i] = bf16_nearest(sum);
  }
  return p;
}

std::vector<const std::vector<uint16_t>*> ptrs(const std::vector<std::vector<uint16_t>>& v) {
  std::vector<const std::vector<uint16_t>*> p;
  for (const auto& x : v) p.push_back(&x);
  return p;
}

}  // namespace

TEST_SUITE("properties") {

TEST_CASE("all-reduce: reduce-scatter + all-gather and the plain form give the same bits") {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rng r(seed);
    const int W = 1 << r.below(4), S = 1 + r.below(16), rows = seed % 2 ? 32 : 16, hidden = rows * (1 + r.below(8));
    std::vector<std::vector<uint16_t>> part(W, std::vector<uint16_t>(size_t(S) * hidden));
    for (auto& p : part)
      for (auto& x : p) x = draw_partial(r);
    for (bool zero_start : {true, false}) {
      std::vector<std::vector<uint16_t>> plain, rs;
      k4::all_reduce_rows(plain, ptrs(part), S, hidden, zero_start, false, rows);
      k4::all_reduce_rows(rs, ptrs(part), S, hidden, zero_start, true, rows);
      CAPTURE(seed);
      CAPTURE(zero_start);
      REQUIRE(plain.size() == size_t(W));
      for (int dst = 0; dst < W; ++dst) {
        REQUIRE_MESSAGE(plain[dst] == rs[dst], k4::f64::first_mismatches(rs[dst], plain[dst]));
        REQUIRE(plain[dst] == plain[0]);
      }
      // and both against the float64 sum
      const k4::f64::Report rep = k4::f64::check_all_reduce("ar", ptrs(part), ptrs(plain), zero_start);
      REQUIRE_MESSAGE(k4::f64::all_ok(rep), k4::f64::describe(rep));
    }
  }
}

TEST_CASE("all-reduce: permuting the ranks changes the bits of cancelling partials") {
  for (int W : {3, 4, 8}) {
    Rng r(uint64_t(W) * 101);
    const size_t n = 4096;
    std::vector<uint16_t> smalls;
    const auto part = cancelling(r, W, n, smalls);
    std::vector<std::vector<uint16_t>> moved = {part[0], part[W - 1]};  // ranks 0, W-1, 1, .., W-2
    for (int w = 1; w + 1 < W; ++w) moved.push_back(part[w]);
    for (bool rs : {false, true}) {
      std::vector<std::vector<uint16_t>> a, b;
      k4::all_reduce_rows(a, ptrs(part), 1, int(n), true, rs, 16);
      k4::all_reduce_rows(b, ptrs(moved), 1, int(n), true, rs, 16);
      size_t differ = 0;
      for (size_t i = 0; i < n; ++i) {
        REQUIRE(a[0][i] == 0x0000);     // rank order: every small term rounds away
        REQUIRE(b[0][i] == smalls[i]);  // big cancels first
        differ += a[0][i] != b[0][i];
      }
      CAPTURE(W);
      CHECK(differ > n / 2);
      MESSAGE("W = ", W, std::string(rs ? " (reduce-scatter)" : " (plain)"), ": ", differ, " of ", n,
              " sums change when the last rank moves second");
    }
  }
}

TEST_CASE("an all-zero row quantizes to zeros: the merge quant") {
  const k4::Config c = k4::preset("tiny");
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    Rng r(seed);
    const int S = 1 + r.below(6), zero_tok = r.below(S);
    k4::SplitOut sp;
    sp.q8.assign(size_t(S) * 2048, 0);
    sp.o.resize(size_t(S) * 8 * 2048);
    sp.m.resize(size_t(S) * 8 * 16);
    sp.l.resize(size_t(S) * 8 * 16);
    for (auto& m : sp.m) m = float(r.normal());
    for (auto& l : sp.l) l = float(1.0 + 10.0 * r.uniform());
    for (size_t i = 0; i < sp.o.size(); ++i) {
      const bool zero = int(i / (8 * 2048)) == zero_tok;
      sp.o[i] = zero ? (r.below(2) ? 0x8000 : 0x0000) : bf16_nearest(r.normal());
    }
    k4::MergeOut mg;
    k4::merge_partitions(mg, sp, S, c);
    for (int k = 0; k < S; ++k) {
      const bool zero = k == zero_tok;
      size_t nz = 0;
      for (int i = 0; i < 2048; ++i) nz += mg.attn8[size_t(k) * 2048 + i] != 0;
      if (zero) {
        CHECK(mg.x_scale[k] == 0.0f);
        CHECK(nz == 0);
      } else {
        CHECK(mg.x_scale[k] > 0.0f);
        CHECK(nz > 1900);
      }
    }
    REQUIRE(k4::f64::all_ok(k4::f64::check_merge(c, sp, mg, S)));
  }
}

TEST_CASE("an all-zero row quantizes to zeros: MXFP8 of xn and of mid") {
  const k4::Config c = k4::preset("tiny");
  const k4::LayerWeights& w = k4::f64::cached_layer("tiny", 1, 3);
  Rng r(77);
  const int S = 3;
  std::vector<uint16_t> a(size_t(S) * c.hidden), h(a.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_nearest(r.normal()), h[i] = bf16_nearest(r.normal());
  // token 1: block 5 (elements 160..191) cancels exactly: v = a + h = 0
  for (int i = 160; i < 192; ++i) a[size_t(c.hidden) + i] = h[size_t(c.hidden) + i] ^ 0x8000;
  // token 2: all of it cancels (rstd = rsq(eps), every xn 0)
  for (int i = 0; i < c.hidden; ++i) a[size_t(2) * c.hidden + i] = h[size_t(2) * c.hidden + i] ^ 0x8000;
  k4::RouterOut ro;
  k4::route_scores(ro, a, h, w.ranks[0], S, c);
  const int B = c.hidden / 32;
  CHECK(ro.xsc[size_t(B) + 5] == 1);
  for (int i = 160; i < 192; ++i) CHECK((ro.xn8[size_t(c.hidden) + i] & 0x7F) == 0);
  for (int b = 0; b < B; ++b) CHECK(ro.xsc[size_t(2) * B + b] == 1);
  for (int i = 0; i < c.hidden; ++i) CHECK((ro.xn8[size_t(2) * c.hidden + i] & 0x7F) == 0);
  size_t nz = 0;
  for (int i = 0; i < c.hidden; ++i) nz += ro.xn8[i] != 0;
  CHECK(nz > size_t(c.hidden) * 9 / 10);
  REQUIRE(k4::f64::all_ok(k4::f64::check_router(c, a, h, w.ranks[0], ro, S)));
  // mid: token 2's xn is all zero, so every slot's gate and up are +0 and its mid zero
  k4::RouteOut rt;
  k4::route_top4(rt, ro, S, c);
  k4::MoeOut moe;
  k4::experts_up_gate(moe, rt, ro, *w.experts, 0, S, c);
  const size_t slot = size_t(c.inter), tok = slot * c.moe_slots();
  for (size_t i = 2 * tok; i < 3 * tok; ++i) CHECK(moe.mid8[i] == 0x00);
  for (size_t b = 2 * tok / 32; b < 3 * tok / 32; ++b) CHECK(moe.midsc[b] == 1);
  nz = 0;
  for (size_t i = 0; i < tok; ++i) nz += moe.mid8[i] != 0;
  CHECK(nz > tok * 9 / 10);
  REQUIRE(k4::f64::all_ok(k4::f64::check_mid(c, moe, S)));
}

TEST_CASE("swiglu respects the clamp") {
  Rng r(5);
  const float L = 7.0f;
  const float specials[] = {0.0f, -0.0f, 7.0f, -7.0f, 6.9999995f, 7.0000005f, 1e-40f, -1e-40f, 88.0f, -88.0f, 3e38f, -3e38f};
  size_t n = 0;
  for (int i = 0; i < 200000; ++i) {
    float g, u;
    if (i < 144) g = specials[i % 12], u = specials[i / 12];
    else g = float(r.normal() * std::ldexp(1.0, r.below(12) - 4)), u = float(r.normal() * std::ldexp(1.0, r.below(12) - 4));
    const float y = k4::swiglu(g, u, L);
    const float gc = std::min(g, L), uc = std::clamp(u, -L, L);
    REQUIRE(f32_bits(y) == f32_bits(k4::swiglu(gc, uc, L)));
    REQUIRE(std::fabs(y) <= L * (L + 1.0f));
    // and the value is the float64 swiglu within the f32 steps (float64_model.hpp, "mid")
    const double want = k4::f64::swiglu(g, u, L);
    const double x = 1.702 * std::min(double(g), 7.0), s = 1.0 / (1.0 + std::exp(-x));
    const double rel = (1.0 - s) * (std::fabs(x) * 3e-7 + 2.5e-7) + 4e-7;
    // below x ~ -88.7, e^-x overflows f32 and the sigmoid is 0 (its true value < 2^-127):
    // an absolute |g' (u' + 1)| 2^-126
    const double gu = std::fabs(std::min(double(g), 7.0) * (std::clamp(double(u), -7.0, 7.0) + 1.0));
    REQUIRE(std::fabs(y - want) <= std::fabs(want) * rel + gu * 0x1p-126 + 1e-44);
    ++n;
  }
  CHECK(n == 200000);
}

// Experts in pairs: expert 2i + 1 is expert 2i negated (every E2M1 sign bit flipped, the same
// scales), so a token routed to both with the same mid and weight adds u and -u.
class PairedExperts : public k4::ExpertSource {
 public:
  explicit PairedExperts(const k4::ExpertSource& base) : base_(base) {}
  std::shared_ptr<const k4::ExpertWeights> expert(int rank, int e) const override {
    auto w = std::make_shared<k4::ExpertWeights>(*base_.expert(rank, e & ~1));
    if (e & 1)
      for (auto& b : w->w2) b ^= 0x88;
    return w;
  }

 private:
  const k4::ExpertSource& base_;
};

TEST_CASE("narrow and wide MoE differ in bits, yet both agree with float64 within the bound") {
  const k4::LayerWeights& w = k4::f64::cached_layer("tiny", 1, 3);
  const PairedExperts paired(*w.experts);
  k4::Config narrow = w.cfg, wide = w.cfg;
  narrow.wide_from = 8, wide.wide_from = 1;
  const int SL = w.cfg.moe_slots(), I = w.cfg.inter, top_k = w.cfg.top_k;
  size_t random_differ = 0, built_differ = 0, total = 0;
  for (int S = 1; S <= 7; ++S) {
    for (bool built : {false, true}) {
      // random: 4 distinct experts a token, positive weights, random MXFP8 mids.
      // built: token 0 picks the pairs (2, 3) and (8, 9), each pair with one mid and one
      // weight (the second pair 2^-10 as heavy), its shared slot's mid zero: narrow sums
      // (((0 + a) - a) + b) - b = +0 exactly. Wide runs the step's distinct experts in id
      // order, quarter = position % 4; token 1's experts 0, 5, 6, 7 put 2, 3, 8, 9 at positions
      // 1, 2, 6, 7: chains A1 = a, A2 = -a + b, A3 = -b, and a + RN(b - a) rounds b away from
      // itself: the sum ends a few ulp of a away from 0.
      Rng r(uint64_t(S) * 71 + (built ? 5 : 9));
      k4::RouteOut ro;
      for (int k = 0; k < S; ++k) {
        std::vector<int32_t> picks;
        if (built && k == 0) picks = {2, 3, 8, 9};
        if (built && k == 1) picks = {7, 0, 6, 5};
        while (int(picks.size()) < top_k) {
          const int e = built ? 10 + r.below(w.cfg.n_routed - 10) : r.below(w.cfg.n_routed);
          if (std::find(picks.begin(), picks.end(), e) == picks.end()) picks.push_back(e);
        }
        const float w0 = float(0.1 + r.uniform()), w1 = float((0.1 + r.uniform()) * 0x1p-10);
        for (int p = 0; p < top_k; ++p) {
          ro.ids.push_back(picks[p]);
          ro.weights.push_back(built && k == 0 ? (p < 2 ? w0 : w1) : float(0.1 + r.uniform()));
        }
        ro.ids.push_back(w.cfg.shared_expert()), ro.weights.push_back(w.cfg.shared_weight);
      }
      k4::MoeOut moe;
      moe.mid8.resize(size_t(S) * SL * I), moe.midsc.resize(size_t(S) * SL * I / 32);
      for (auto& q : moe.mid8) q = uint8_t(r.below(0x7F) | (r.below(2) << 7));  // finite codes, both signs
      for (auto& sc : moe.midsc) sc = uint8_t(118 + r.below(8));
      if (built) {  // token 0: slot 1's mid = slot 0's, slot 3's = slot 2's, slot 4's zero
        for (int i = 0; i < I; ++i) {
          moe.mid8[I + i] = moe.mid8[i], moe.mid8[3 * I + i] = moe.mid8[2 * I + i], moe.mid8[4 * I + i] = 0;
          if (i % 32 == 0) moe.midsc[(I + i) / 32] = moe.midsc[i / 32], moe.midsc[(3 * I + i) / 32] = moe.midsc[(2 * I + i) / 32];
        }
      }
      const k4::ExpertSource& src = built ? static_cast<const k4::ExpertSource&>(paired) : *w.experts;
      k4::MoeOut mn = moe, mw = moe;
      k4::experts_down(mn, ro, src, 0, S, narrow);
      k4::experts_down(mw, ro, src, 0, S, wide);
      const int H = w.cfg.hidden;
      size_t differ = 0;
      if (built) {  // token 0's rows
        for (int i = 0; i < H; ++i) REQUIRE(mn.partial[i] == 0x0000);
        for (int i = 0; i < H; ++i) differ += mw.partial[i] != 0x0000;
        if (S >= 2) CHECK(differ > size_t(H) / 2);
        built_differ += differ;
      } else {
        for (size_t i = 0; i < mn.partial.size(); ++i) differ += mn.partial[i] != mw.partial[i];
        random_differ += differ;
      }
      total += mn.partial.size();
      MESSAGE("S = ", S, std::string(built ? " built (token 0): " : " random: "), "narrow and wide differ in ", differ, " of ",
              built ? size_t(H) : mn.partial.size(), " partial elements");
      const k4::f64::Report rn = k4::f64::check_down(narrow, ro, src, 0, mn, S);
      const k4::f64::Report rw = k4::f64::check_down(wide, ro, src, 0, mw, S);
      CHECK_MESSAGE(k4::f64::all_ok(rn), k4::f64::describe(rn));
      CHECK_MESSAGE(k4::f64::all_ok(rw), k4::f64::describe(rw));
    }
  }
  // random inputs: the orders rarely show through bf16 (a few f32 ulp apart); built: they do
  CHECK(built_differ > 0);
  CHECK(random_differ < total / 100);
}

}  // TEST_SUITE
