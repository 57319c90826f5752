// test_stage_split_kv.cpp -- stage 1's KV-scale modes (docs/numerics.md §13 V4) on
// hand-worked keys: scalar (one k / v scale a cache, the seed's formulas), static448 (vLLM's
// static path: P8 = E4M3(448 p), pscale = v_scale / 448) and atom_vllm (ATOM's
// cache_mode="vllm": split t takes the keys [t span, t span + span) over one or two 256-key
// tiles by online softmax, P8 = E4M3(p), o = (o * factor) + (v_scale * PV)).
//
// The caches start as NaN (E4M3 0x7F) bytes, so a key a mode must mask and reads anyway
// shows up as a NaN. Expected bits are computed from the rule's formula with the policy
// functions (exp2_approx, rcp_approx); where a case must not be vacuous, it also checks that
// the two rules it tells apart really give different bits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/policy.hpp"
#include "reference/stages/index.hpp"
#include "reference/stages/split.hpp"
#include "tests/cpu/fixtures.hpp"

namespace {

using k4::KvScale;

constexpr uint8_t kE4NaN = 0x7F;

float bf(uint16_t b) { uint32_t u = uint32_t(b) << 16; float f; std::memcpy(&f, &u, 4); return f; }
uint16_t bf_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return uint16_t(u >> 16); }  // exact values only
uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
float e4(uint8_t c) { return k4::e4m3_to_f32(c); }

// One token of seq_len keys with one k / v scale a cache; block b's table entry is b.
struct KvToken {
  k4::Config cfg = k4::preset("tiny");
  k4::StepShared sh;
  k4::StepRank rk;
  k4::IndexOut idx;
  k4::SplitOut out;
  KvToken(int seq_len, KvScale mode, float ks, float vs) {
    cfg.variant.kv_scale = mode;
    k4::test::one_token_split_step(cfg, seq_len, sh, rk);
    rk.k_scale = {ks};
    rk.v_scale = {vs};
  }
  int page(int key) const { return (key / 128) * 16 + (key % 128) / 16; }
  void set_k(int key, uint8_t code) {
    for (int d = 0; d < 128; ++d) rk.k_cache[size_t(page(key)) * 2048 + k4::k_byte(key % 16, d)] = code;
  }
  void set_v(int key, uint8_t code) {
    for (int d = 0; d < 128; ++d) rk.v_cache[size_t(page(key)) * 2048 + k4::v_byte(key % 16, d)] = code;
  }
  void run() {
    k4::select_blocks(idx, sh, rk.index_scores, cfg);
    k4::split_attention(out, sh, rk, idx, cfg);
  }
  uint16_t o(int t, int h, int d) const { return out.o[size_t(t) * 2048 + h * 128 + d]; }
  float m(int t, int h) const { return out.m[t * 16 + h]; }
  float l(int t, int h) const { return out.l[t * 16 + h]; }
};

void check_empty(const KvToken& x, int t, uint32_t l_bits) {
  for (int h = 0; h < 16; ++h) {
    CHECK(f32_bits(x.m(t, h)) == f32_bits(-3.4e38f));
    CHECK(f32_bits(x.l(t, h)) == l_bits);
    for (int d = 0; d < 128; ++d) CHECK(x.o(t, h, d) == 0);
  }
}

// A random finite E4M3 code (no NaN).
uint8_t finite_code(k4::test::Rng& r) {
  uint8_t c;
  do c = uint8_t(r.below(256)); while ((c & 0x7F) == 0x7F);
  return c;
}

}  // namespace

TEST_SUITE("stage_split_kv") {

TEST_CASE("V4.1 / V4.2 worked example: vs = 0.01, p = 0x3D2DB6DB gives P8 0x59 (scalar) against 0x5A (static448)") {
  const float vs = from_bits(0x3C23D70A), p = from_bits(0x3D2DB6DB);
  const float fscale = k4::kFp8Max * k4::rcp_approx(vs + 1e-8f);
  CHECK(f32_bits(vs + 1e-8f) == 0x3C23D715u);
  CHECK(f32_bits(fscale) == 0x472EFFF5u);
  CHECK(f32_bits(vs * fscale) == 0x43DFFFF2u);
  CHECK(k4::e4m3_bits((vs * fscale) * p, k4::Fp8Overflow::NoSaturate) == 0x59);  // 18.99998 -> 18
  CHECK(k4::e4m3_bits(k4::kFp8Max * p, k4::Fp8Overflow::NoSaturate) == 0x5A);    // 19.0, a tie -> 20
  CHECK(f32_bits(vs * k4::kInvFp8Max) == 0x37BB3EE7u);
}

TEST_CASE("scalar and static448 give the same bits when v_scale is a power of two >= 0.25") {
  for (float vs : {0.25f, 1.0f, 4.0f}) {
    CAPTURE(vs);
    k4::test::Rng r(uint64_t(vs * 16));
    KvToken a(700, KvScale::scalar, 0.5f, vs), b(700, KvScale::static448, 0.5f, vs);
    for (auto& q : a.rk.q) q = bf_bits(e4(finite_code(r) & 0xBF));  // |q| < 2
    for (int key = 0; key < 700; ++key) a.set_k(key, uint8_t(finite_code(r) & 0xBF)), a.set_v(key, finite_code(r));
    b.rk = a.rk;
    a.run(), b.run();
    CHECK(a.out.o == b.out.o);
    CHECK(a.out.m == b.out.m);
    CHECK(a.out.l == b.out.l);
    int nonzero = 0;
    for (uint16_t v : a.out.o) nonzero += (v & 0x7FFF) != 0;
    CHECK(nonzero > 3 * 2048 / 2);  // partitions 0..2 hold 700 keys
    for (int t = 3; t < 8; ++t) check_empty(b, t, f32_bits(256.0f));
  }
}

TEST_CASE("static448: P8 = E4M3(448 p) and pscale = v_scale / 448, where scalar folds v_scale * fscale") {
  // key 0 takes the max (p = 1) with V = 0; key 1 has V = 1, so o reads P8 of key 1 alone:
  // o = bf16((pscale * P8_1) * (1 / l)). The two rules differ only near an E4M3 tie (the fold
  // is 447.99957): search a k scale and K codes whose p falls there.
  const float vs = 0.01f, sm = k4::preset("tiny").sm_scale;
  const float fold = vs * (k4::kFp8Max * k4::rcp_approx(vs + 1e-8f));
  int k0 = -1, k1 = -1;
  float ks = 0.0f;
  auto score = [&](float kscale, int code) { return (sm * kscale) * (128.0f * e4(uint8_t(code))); };
  for (int i = 0; i < 4096 && k0 < 0; ++i)
    for (int a = 0x30; a < 0x50 && k0 < 0; ++a)
      for (int b = 0x20; b < a && k0 < 0; ++b) {
        const float kscale = 1.0f + float(i) / 4096.0f;
        const float p1 = k4::exp2_approx((score(kscale, b) - score(kscale, a)) * k4::kLog2e);
        if (k4::e4m3_bits(fold * p1, k4::Fp8Overflow::NoSaturate) != k4::e4m3_bits(448.0f * p1, k4::Fp8Overflow::NoSaturate))
          k0 = a, k1 = b, ks = kscale;
      }
  REQUIRE(k0 >= 0);
  uint16_t got[2];
  for (KvScale mode : {KvScale::scalar, KvScale::static448}) {
    KvToken x(2, mode, ks, vs);
    for (auto& q : x.rk.q) q = bf_bits(1.0f);
    x.set_k(0, uint8_t(k0)), x.set_k(1, uint8_t(k1));
    x.set_v(0, 0x00), x.set_v(1, 0x38);
    x.run();
    const float s0 = score(ks, k0), s1 = score(ks, k1);
    const float p1 = k4::exp2_approx((s1 - s0) * k4::kLog2e);
    const bool st = mode == KvScale::static448;
    const uint8_t p8 = k4::e4m3_bits((st ? 448.0f : fold) * p1, k4::Fp8Overflow::NoSaturate);
    const float pscale = vs * k4::kInvFp8Max;  // vmax = vs here: both rules give vs / 448
    for (int h = 0; h < 16; ++h) {
      CHECK(x.m(0, h) == s0);
      const float l = x.l(0, h);
      CHECK(std::fabs(l - (1.0f + p1)) <= 1e-6f);
      for (int d = 0; d < 128; ++d) CHECK(x.o(0, h, d) == k4::bf16_bits_rne((pscale * e4(p8)) * (1.0f / l)));
    }
    got[st] = x.o(0, 0, 0);
    for (int t = 1; t < 8; ++t) check_empty(x, t, f32_bits(256.0f));
  }
  CHECK(got[0] != got[1]);
}

TEST_CASE("atom_vllm: n_ctx = 300 splits into ranges of 38 keys; split 6 crosses tiles 0 and 1") {
  // q = 0: every valid score is 0, p = 1, P8 = 1.0 (0x38, no 448); V = 1 below key 256, 2 from it
  const float vs = 0.5f;
  KvToken x(300, KvScale::atom_vllm, 1.0f, vs);
  for (int key = 0; key < 300; ++key) x.set_k(key, 0x00), x.set_v(key, key < 256 ? 0x38 : 0x40);
  x.run();
  // splits 0..5 lie in tile 0: o_run = vs * 38, l = 38 (the first tile's factor is 0)
  for (int t = 0; t < 8; ++t) {
    const int begin = 38 * t, end = std::min(begin + 38, 300);
    float o_run = 0.0f, l_run = 0.0f;  // the two tiles of split 6 in order, factor 0 then 1
    if (begin < 256) o_run = (0.0f * 0.0f) + (vs * float(std::min(end, 256) - begin)), l_run = float(std::min(end, 256) - begin);
    if (end > 256) {
      const int n1 = end - std::max(begin, 256);
      const float f = begin < 256 ? 1.0f : 0.0f;
      o_run = (o_run * f) + (vs * float(2 * n1)), l_run = (f * l_run) + float(n1);
    }
    CAPTURE(t);
    for (int h = 0; h < 16; ++h) {
      CHECK(x.m(t, h) == 0.0f);
      CHECK(x.l(t, h) == l_run);
      for (int d = 0; d < 128; ++d) CHECK(x.o(t, h, d) == k4::bf16_bits_rne(o_run * (1.0f / l_run)));
    }
  }
  CHECK(x.l(6, 0) == 38.0f);  // 28 keys of tile 0 and 10 of tile 1
  CHECK(bf(x.o(6, 0, 0)) != bf(x.o(5, 0, 0)));
}

TEST_CASE("atom_vllm: V bytes below a split's begin are masked too (a NaN there stays in its own splits)") {
  KvToken x(300, KvScale::atom_vllm, 1.0f, 1.0f);
  for (int key = 0; key < 300; ++key) x.set_k(key, 0x00), x.set_v(key, key < 228 ? kE4NaN : 0x38);
  x.run();
  for (int t = 0; t < 6; ++t) CHECK(x.o(t, 3, 5) == 0x7FC0);  // [38 t, 38 t + 38) reads NaN V
  for (int t = 6; t < 8; ++t) {
    const float n = t == 6 ? 38.0f : 34.0f;  // o_run = n (V = 1, P8 = 1), l = n
    for (int h = 0; h < 16; ++h)
      for (int d = 0; d < 128; ++d) CHECK(x.o(t, h, d) == k4::bf16_bits_rne(n * (1.0f / n)));
  }
}

TEST_CASE("atom_vllm: a later tile's max rescales the earlier tile by exp2((M0 - M1) LOG2E); P8 = E4M3(p)") {
  const float vs = 0.75f, sm = k4::preset("tiny").sm_scale;
  KvToken x(300, KvScale::atom_vllm, 1.0f, vs);
  for (auto& q : x.rk.q) q = bf_bits(1.0f);
  for (int key = 0; key < 300; ++key) x.set_k(key, key < 256 ? 0x00 : 0x30), x.set_v(key, key < 256 ? 0x38 : 0x40);
  x.set_k(265, 0x28);  // 0.25: half the score of the other tile-1 keys
  x.run();
  // split 6 = [228, 266): tile 0 keys 228..255 score 0; tile 1 keys 256..264 score s1 = sm * 64,
  // key 265 scores sm * 32
  const float s1 = sm * 64.0f, s2 = sm * 32.0f;
  const float p2 = k4::exp2_approx((s2 - s1) * k4::kLog2e);
  const uint8_t p8 = k4::e4m3_bits(p2, k4::Fp8Overflow::NoSaturate);
  CHECK(p8 != 0x38);
  CHECK(p8 != 0x00);
  const float factor = k4::exp2_approx((0.0f - s1) * k4::kLog2e);
  const float acc1 = 9.0f * 2.0f + e4(p8) * 2.0f;  // exact
  const float o_run = ((vs * 28.0f) * factor) + (vs * acc1);
  for (int h = 0; h < 16; ++h) {
    CHECK(x.m(6, h) == s1);
    const float l = x.l(6, h);
    CHECK(std::fabs(double(l) - (28.0 * std::exp(-double(s1)) + 9.0 + std::exp(double(s2 - s1)))) <= 1e-5);
    for (int d = 0; d < 128; ++d) CHECK(x.o(6, h, d) == k4::bf16_bits_rne(o_run * (1.0f / l)));
  }
  // the float64 value: (28 e^-s1 * 1 + (9 + e^(s2 - s1)) * 2) vs / l, within E4M3(p) and bf16
  const double e = std::exp(-double(s1)), want = (28.0 * e + 18.0 + 2.0 * std::exp(double(s2 - s1))) * vs /
                                                 (28.0 * e + 9.0 + std::exp(double(s2 - s1)));
  CHECK(std::fabs(bf(x.o(6, 0, 0)) - want) <= want * 0x1p-6);
}

TEST_CASE("atom_vllm: an empty split stores m = NEG, l = +0, o = +0 (n_ctx = 9: span 2)") {
  KvToken x(9, KvScale::atom_vllm, 1.0f, 1.0f);
  for (int key = 0; key < 9; ++key) x.set_k(key, 0x00), x.set_v(key, 0x38);
  x.run();
  for (int t = 0; t < 5; ++t) {
    CHECK(x.l(t, 0) == (t < 4 ? 2.0f : 1.0f));
    CHECK(x.o(t, 0, 0) == bf_bits(1.0f));
  }
  for (int t = 5; t < 8; ++t) check_empty(x, t, 0u);
}

}  // TEST_SUITE
