// test_stage_merge.cpp -- stage 2 (LSE merge, per-token FP8 quant) on hand-made partitions.
//
// One live partition passes its o through and, with amax 448, x_scale = 448 * f32(1/448) =
// 1 (exactly, in f32) so attn8 is E4M3(a); two equal partitions average; m differences weight
// by exp; an all-zero (or all -0) row quantizes to zeros; a NaN m poisons its head.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "reference/config.hpp"
#include "reference/stages/merge.hpp"
#include "reference/stages/split.hpp"
#include "tests/cpu/float64_model.hpp"

namespace {

using k4::f64::bf16;
using k4::f64::bf16_nearest;

constexpr float kNeg = -3.4e38f;

// S tokens, every partition empty (m = NEG, l = 256, o = 0) until set.
k4::SplitOut empty_split(int S) {
  k4::SplitOut sp;
  sp.q8.assign(size_t(S) * 2048, 0);
  sp.o.assign(size_t(S) * 8 * 2048, 0);
  sp.m.assign(size_t(S) * 8 * 16, kNeg);
  sp.l.assign(size_t(S) * 8 * 16, 256.0f);
  return sp;
}
void set_part(k4::SplitOut& sp, int k, int t, float m, float l) {
  for (int h = 0; h < 16; ++h) sp.m[(k * 8 + t) * 16 + h] = m, sp.l[(k * 8 + t) * 16 + h] = l;
}
uint16_t& o_at(k4::SplitOut& sp, int k, int t, int i) { return sp.o[(size_t(k) * 8 + t) * 2048 + i]; }

// A bf16 pattern with both signs and max |v| = 448 at element 777.
double pattern(int i) { return i == 777 ? -448.0 : ((i % 13) - 6) * 0.75 * ((i / 13) % 3 + 1); }

}  // namespace

TEST_SUITE("stage_merge") {

TEST_CASE("one live partition: attn = its o; amax 448 gives x_scale 1 and attn8 = E4M3(a)") {
  const k4::Config c = k4::preset("tiny");
  k4::SplitOut sp = empty_split(1);
  set_part(sp, 0, 3, 5.0f, 3.0f);  // partition 3 live: w = 3 exp2(0) / 3 = 1, the others 0
  for (int i = 0; i < 2048; ++i) o_at(sp, 0, 3, i) = bf16_nearest(pattern(i));
  k4::MergeOut mg;
  k4::merge_partitions(mg, sp, 1, c);
  CHECK(mg.x_scale[0] == 1.0f);
  for (int i = 0; i < 2048; ++i) {
    CAPTURE(i);
    CHECK(mg.attn[i] == bf16_nearest(pattern(i)));
    CHECK(mg.attn8[i] == k4::f64::e4m3_nearest(pattern(i), false));
  }
  CHECK(mg.attn8[777] == 0xFE);  // -448
}

TEST_CASE("two partitions of equal m and l average; m differences weight by exp") {
  const k4::Config c = k4::preset("tiny");
  k4::SplitOut sp = empty_split(2);
  set_part(sp, 0, 0, 2.0f, 4.0f);
  set_part(sp, 0, 5, 2.0f, 4.0f);  // sl = 4 each, gs = 8, w = 0.5
  set_part(sp, 1, 0, 0.0f, 1.0f);
  set_part(sp, 1, 1, -1.0f, 1.0f);  // w = 1 / (1 + e^-1), e^-1 / (1 + e^-1)
  for (int i = 0; i < 2048; ++i) {
    o_at(sp, 0, 0, i) = bf16_nearest(i % 2 ? 1.0 : -1.5);
    o_at(sp, 0, 5, i) = bf16_nearest(i % 2 ? 3.0 : 0.5);
    o_at(sp, 1, 0, i) = bf16_nearest(1.0);
    o_at(sp, 1, 1, i) = bf16_nearest(-1.0);
  }
  k4::MergeOut mg;
  k4::merge_partitions(mg, sp, 2, c);
  const double w0 = 1.0 / (1.0 + std::exp(-1.0)), want1 = w0 - (1.0 - w0);  // 0.4621
  for (int i = 0; i < 2048; ++i) {
    CHECK(bf16(mg.attn[i]) == (i % 2 ? 2.0 : -0.5));
    CHECK(std::fabs(bf16(mg.attn[2048 + i]) - want1) <= want1 * (0x1p-8 + 1e-6));
  }
  // token 0: amax 2, x_scale = f32(2 * f32(1/448)), attn8 = E4M3(f32(a * rcp(x_scale)))
  const float xs = 2.0f * float(1.0 / 448.0);
  CHECK(mg.x_scale[0] == xs);
  CHECK(mg.attn8[1] == k4::f64::e4m3_nearest(double(2.0f * (1.0f / xs)), false));
  CHECK(mg.attn8[0] == k4::f64::e4m3_nearest(double(-0.5f * (1.0f / xs)), false));
}

TEST_CASE("an all-zero row quantizes to zeros (not 0 * inf); an all -0 row becomes +0") {
  const k4::Config c = k4::preset("tiny");
  k4::SplitOut sp = empty_split(2);
  set_part(sp, 0, 0, 1.0f, 2.0f);
  set_part(sp, 1, 0, 1.0f, 2.0f);
  for (int i = 0; i < 2048; ++i) o_at(sp, 1, 0, i) = 0x8000;  // -0
  k4::MergeOut mg;
  k4::merge_partitions(mg, sp, 2, c);
  for (int k = 0; k < 2; ++k) {
    CHECK(mg.x_scale[k] == 0.0f);
    for (int i = 0; i < 2048; ++i) {
      CHECK(mg.attn[size_t(k) * 2048 + i] == 0x0000);  // sum0: 0.0 + w * -0 = +0
      CHECK(mg.attn8[size_t(k) * 2048 + i] == 0x00);
    }
  }
}

TEST_CASE("a NaN m poisons its head only") {
  const k4::Config c = k4::preset("tiny");
  k4::SplitOut sp = empty_split(1);
  set_part(sp, 0, 0, 1.0f, 2.0f);
  sp.m[0 * 16 + 4] = std::numeric_limits<float>::quiet_NaN();  // partition 0, head 4
  for (int i = 0; i < 2048; ++i) o_at(sp, 0, 0, i) = bf16_nearest(1.0);
  k4::MergeOut mg;
  k4::merge_partitions(mg, sp, 1, c);
  for (int d = 0; d < 128; ++d) {
    CHECK(mg.attn[4 * 128 + d] == 0x7FC0);
    CHECK(mg.attn[3 * 128 + d] == bf16_nearest(1.0));
  }
  // amax is NaN: x_scale NaN, every code the NaN code
  CHECK(std::isnan(mg.x_scale[0]));
  CHECK(mg.attn8[0] == 0x7F);
}

}  // TEST_SUITE
