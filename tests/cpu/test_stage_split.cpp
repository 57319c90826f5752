// test_stage_split.cpp -- stage 1 (split FP8 attention) on hand-worked keys.
//
// The caches start as all NaN (E4M3 0x7F) bytes with NaN scales, so any key, byte or scale
// the contract masks and the model reads anyway shows up as a NaN. Cases: one valid key
// (o = v_scale * V, l = 1, m = f32(sm) * q.k), two keys of equal score whose V scales differ
// (the scale folded into P), a k scale that dominates, q -> E4M3 without saturation (NaN
// confined to its head), and partitions past the context (m = NEG, l = 256, o = 0).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/stages/index.hpp"
#include "reference/stages/split.hpp"
#include "tests/cpu/fixtures.hpp"
#include "tests/cpu/float64_model.hpp"

namespace {

using k4::Config;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float bf(uint16_t b) { uint32_t u = uint32_t(b) << 16; float f; std::memcpy(&f, &u, 4); return f; }
uint16_t bf_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return uint16_t(u >> 16); }  // exact values only
uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// One token of seq_len keys; block b's table entry is b (pages b * 16 + j, stride 16).
struct OneToken {
  Config cfg = k4::preset("tiny");
  k4::StepShared sh;
  k4::StepRank rk;
  k4::IndexOut idx;
  k4::SplitOut out;
  explicit OneToken(int seq_len) {
    k4::test::one_token_split_step(cfg, seq_len, sh, rk);
    rk.k_scale.assign(size_t(rk.n_pages) * 16, kNaN);
    rk.v_scale.assign(size_t(rk.n_pages) * 16, kNaN);
  }
  // key `key` of the sparse context (block key / 128 is selected in id order: short context)
  int page(int key) const { return (key / 128) * 16 + (key % 128) / 16; }
  void set_key(int key, uint8_t k_code, float ks, float vs) {
    for (int d = 0; d < 128; ++d) rk.k_cache[size_t(page(key)) * 2048 + k4::k_byte(key % 16, d)] = k_code;
    rk.k_scale[size_t(page(key)) * 16 + key % 16] = ks;
    rk.v_scale[size_t(page(key)) * 16 + key % 16] = vs;
  }
  void set_v(int key, int d, uint8_t code) { rk.v_cache[size_t(page(key)) * 2048 + k4::v_byte(key % 16, d)] = code; }
  void run() {
    k4::select_blocks(idx, sh, rk.index_scores, cfg);
    k4::split_attention(out, sh, rk, idx, cfg);
  }
  float o(int t, int h, int d) const { return bf(out.o[size_t(t) * 2048 + h * 128 + d]); }
  float m(int t, int h) const { return out.m[t * 16 + h]; }
  float l(int t, int h) const { return out.l[t * 16 + h]; }
};

// A V code for dim d: finite, both signs, spread over the exponents (codes 0..119).
uint8_t v_code(int d) { return uint8_t(((d * 37) % 120) | ((d & 1) << 7)); }

void check_empty_partitions(const OneToken& x, int from) {
  for (int t = from; t < 8; ++t)
    for (int h = 0; h < 16; ++h) {
      CHECK(f32_bits(x.m(t, h)) == f32_bits(-3.4e38f));
      CHECK(x.l(t, h) == 256.0f);
      for (int d = 0; d < 128; ++d) CHECK(f32_bits(x.o(t, h, d)) == 0u);
    }
}

}  // namespace

TEST_SUITE("stage_split") {

TEST_CASE("one valid key: o = v_scale * V, l = 1, m = f32(sm) * q.k") {
  OneToken x(1);
  for (auto& q : x.rk.q) q = bf_bits(1.0f);
  x.set_key(0, 0x30 /* 0.5 */, 1.0f, 0.5f);
  for (int d = 0; d < 128; ++d) x.set_v(0, d, v_code(d));
  x.run();
  // q.k = 128 * 0.5 = 64; s = (f32(sm) * 1) * 64, a power-of-two scaling: exact
  const float m = x.cfg.sm_scale * 64.0f;
  // vmax = 0.5; fscale = 448 * rcp(f32(0.5 + 1e-8) = 0.5) = 896; P8 = E4M3(0.5 * 896 * 1) = 448;
  // o = bf16((0.5 * f32(1/448)) * (448 V)) = 0.5 V, V having 4 significant bits
  for (int h = 0; h < 16; ++h) {
    CHECK(x.m(0, h) == m);
    CHECK(x.l(0, h) == 1.0f);
    for (int d = 0; d < 128; ++d) CHECK_MESSAGE(x.o(0, h, d) == float(0.5 * k4::f64::e4m3(v_code(d))), "h ", h, " d ", d);
  }
  // every NaN byte and scale past n_ctx = 1 is masked
  check_empty_partitions(x, 1);
}

TEST_CASE("two keys of equal score: V's scale is folded into P") {
  OneToken x(2);
  for (auto& q : x.rk.q) q = bf_bits(1.0f);
  x.set_key(0, 0x30, 1.0f, 1.0f);
  x.set_key(1, 0x30, 1.0f, 0.5f);
  for (int d = 0; d < 128; ++d) {
    x.set_v(0, d, 0x38);                    // 1.0
    x.set_v(1, d, d < 64 ? 0x40 : 0xC0);    // +2 / -2
  }
  x.run();
  // vmax = 1, fscale = 448: P8 = 448 and E4M3(0.5 * 448) = 224; l = 2
  // d < 64: f32(1/448) (448 * 1 + 224 * 2) / 2 = 1 (to bf16); d >= 64: (448 - 448) = 0
  for (int h = 0; h < 16; ++h) {
    CHECK(x.l(0, h) == 2.0f);
    for (int d = 0; d < 128; ++d) CHECK(x.o(0, h, d) == (d < 64 ? 1.0f : 0.0f));
  }
  check_empty_partitions(x, 1);
}

TEST_CASE("a key's k scale multiplies its score") {
  OneToken x(2);
  for (auto& q : x.rk.q) q = bf_bits(1.0f);
  x.set_key(0, 0x30, 1.0f, 1.0f);
  x.set_key(1, 0x30, 2.0f, 1.0f);
  for (int d = 0; d < 128; ++d) x.set_v(0, d, 0x38), x.set_v(1, d, 0x48);  // V 1 and 4
  x.run();
  // s0 = sm * 64, s1 = (sm * 2) * 64 = sm * 128 (exact): m = s1; p0 = exp(-sm * 64) ~ 0.0035
  const double p0 = std::exp(-double(x.cfg.sm_scale) * 64.0);
  for (int h = 0; h < 16; ++h) {
    CHECK(x.m(0, h) == x.cfg.sm_scale * 128.0f);
    CHECK(std::fabs(double(x.l(0, h)) - (1.0 + p0)) <= 4e-7);
    // P8_1 = 448, P8_0 = E4M3(448 p0 ~ 1.565); o ~ (4 * 448 + P8_0) / 448 / (1 + p0) ~ 3.99
    const double p8 = k4::f64::e4m3(k4::f64::e4m3_nearest(448.0 * p0, false));
    const double want = (4.0 * 448.0 + p8) / 448.0 / (1.0 + p0);
    for (int d = 0; d < 128; ++d) CHECK(std::fabs(x.o(0, h, d) - want) <= want * 0x1p-8);
  }
}

TEST_CASE("q -> E4M3 does not saturate: a NaN q8 poisons its head only") {
  OneToken x(1);
  for (auto& q : x.rk.q) q = bf_bits(1.0f);
  x.rk.q[5] = bf_bits(464.0f);    // head 0: the tie 464 -> 448
  x.rk.q[130] = bf_bits(480.0f);  // head 1: past 464 -> the NaN code
  x.rk.q[300] = bf_bits(-1024.0f);  // head 2: the negative NaN code
  x.set_key(0, 0x30, 1.0f, 1.0f);
  for (int d = 0; d < 128; ++d) x.set_v(0, d, 0x38);
  x.run();
  CHECK(x.out.q8[5] == 0x7E);
  CHECK(x.out.q8[130] == 0x7F);
  CHECK(x.out.q8[300] == 0xFF);
  CHECK(x.out.q8[0] == 0x38);
  // head 0: q.k = 127 * 0.5 + 448 * 0.5 = 287.5
  CHECK(x.m(0, 0) == x.cfg.sm_scale * 287.5f);
  for (int h : {1, 2}) {
    CHECK(std::isnan(x.m(0, h)));
    CHECK(std::isnan(x.l(0, h)));
    CHECK(f32_bits(x.m(0, h)) == 0x7FC00000u);  // canonical
    for (int d = 0; d < 128; ++d) CHECK(x.out.o[size_t(h) * 128 + d] == 0x7FC0);
  }
  for (int h = 3; h < 16; ++h) CHECK(x.o(0, h, 7) == 1.0f);
}

TEST_CASE("a context across partitions: partition 1 takes the third block") {
  OneToken x(300);  // blocks 0, 1 in partition 0 (256 keys), block 2 (44 keys) in partition 1
  for (auto& q : x.rk.q) q = bf_bits(0.0f);  // every score 0: uniform weights
  for (int key = 0; key < 300; ++key) {
    x.set_key(key, 0x00, 1.0f, 1.0f);
    for (int d = 0; d < 128; ++d) x.set_v(key, d, key < 256 ? 0x38 : 0x40);  // 1 then 2
  }
  x.run();
  for (int h = 0; h < 16; ++h) {
    CHECK(x.m(0, h) == 0.0f);
    CHECK(x.l(0, h) == 256.0f);
    CHECK(x.o(0, h, 3) == 1.0f);
    CHECK(x.m(1, h) == 0.0f);
    CHECK(x.l(1, h) == 44.0f + 212.0f * 0.0f);  // the 212 invalid keys add p = 0
    CHECK(x.o(1, h, 3) == 2.0f);
  }
  check_empty_partitions(x, 2);
}

}  // TEST_SUITE
