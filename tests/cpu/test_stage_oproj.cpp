// test_stage_oproj.cpp -- stage 3 (o_proj GEMV, the rank-ordered all-reduce, h_mid) on
// identity-like weights and on sums built to expose the f32 order.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "reference/config.hpp"
#include "reference/stages/merge.hpp"
#include "reference/stages/oproj.hpp"
#include "reference/weights.hpp"
#include "tests/cpu/float64_model.hpp"

namespace {

using k4::f64::bf16;
using k4::f64::bf16_nearest;
using k4::f64::e4m3;

// Weights all 0 (E4M3 0x00), scales 1. O_K = 2048 (16 heads of 128); any hidden.
k4::RankWeights zero_weights(const k4::Config& c) {
  k4::RankWeights w;
  w.w_o.assign(size_t(c.hidden) * c.o_k(), 0x00);
  w.s_o.assign(c.hidden, 1.0f);
  return w;
}

k4::MergeOut merged(int S, float x_scale) {
  k4::MergeOut mg;
  mg.attn.assign(size_t(S) * 2048, 0);
  mg.attn8.assign(size_t(S) * 2048, 0);
  mg.x_scale.assign(S, x_scale);
  return mg;
}

uint8_t code(int i) { return uint8_t((i * 29) % 119 | ((i % 3 == 0) << 7)); }  // finite E4M3 codes

}  // namespace

TEST_SUITE("stage_oproj") {

TEST_CASE("identity-like weights: partial[r] = bf16(attn8[r] * x_scale * s_o[r])") {
  const k4::Config c = k4::preset("tiny");
  k4::RankWeights w = zero_weights(c);
  for (int r = 0; r < c.hidden; ++r) {
    w.w_o[size_t(r) * 2048 + r % 2048] = 0x38;           // 1.0 on the diagonal
    w.w_o[size_t(r) * 2048 + (r + 1024) % 2048] = 0x30;  // 0.5 two quarters away
    w.s_o[r] = r % 2 ? 2.0f : 0.5f;
  }
  k4::MergeOut mg = merged(2, 0.25f);
  for (int i = 0; i < 2048; ++i) mg.attn8[i] = code(i), mg.attn8[2048 + i] = code(i + 5);
  k4::OprojOut op;
  k4::o_proj_partials(op, mg, w, 2, c);
  for (int k = 0; k < 2; ++k)
    for (int r = 0; r < c.hidden; ++r) {
      const double x0 = e4m3(mg.attn8[size_t(k) * 2048 + r % 2048]);
      const double x1 = e4m3(mg.attn8[size_t(k) * 2048 + (r + 1024) % 2048]);
      // E4M3 values: x0 + x1 / 2 needs at most ~20 significant bits (exact in f32), then
      // power-of-two scales: one bf16 rounding
      const double want = (x0 + 0.5 * x1) * 0.25 * (r % 2 ? 2.0 : 0.5);
      CHECK_MESSAGE(op.partial[size_t(k) * c.hidden + r] == bf16_nearest(want), "k ", k, " r ", r);
    }
  // all-reduce over 4 identical ranks: 4 * p, exact; h_mid = bf16(a + h_in)
  std::vector<const std::vector<uint16_t>*> parts(4, &op.partial);
  for (bool rs : {false, true}) {
    std::vector<std::vector<uint16_t>> a;
    k4::all_reduce_rows(a, parts, 2, c.hidden, true, rs, c.o_rows);
    REQUIRE(a.size() == 4);
    for (int dst = 0; dst < 4; ++dst)
      for (size_t i = 0; i < op.partial.size(); ++i) CHECK(a[dst][i] == bf16_nearest(4.0 * bf16(op.partial[i])));
    std::vector<uint16_t> h_in(op.partial.size(), bf16_nearest(1.0)), h_mid;
    k4::residual_add(h_mid, a[0], h_in);
    for (size_t i = 0; i < h_mid.size(); ++i) CHECK(h_mid[i] == bf16_nearest(bf16(a[0][i]) + 1.0));
  }
}

TEST_CASE("blocks chain in f32 within a quarter, and quarters add in order") {
  const k4::Config c = k4::preset("tiny");
  k4::RankWeights w = zero_weights(c);
  k4::MergeOut mg = merged(1, 1.0f);
  // E4M3 256 = 0x78, 2^-4 = 0x18; 256 * 256 = 2^16, 2^-4 * 2^-4 = 2^-8 = half an ulp of 2^16
  const uint8_t big = 0x78, neg_big = 0xF8, small = 0x18;
  for (int i = 0; i < 2048; ++i) mg.attn8[i] = big;
  // row 0: quarters 0..3 hold +2^16, 2^-8, 2^-8, -2^16 (element 0 of each quarter):
  //   ((((0 + 2^16) + 2^-8) + 2^-8) - 2^16) = 0 (each tie to even); another order gives 2^-7
  w.w_o[0] = big, w.w_o[512] = small, w.w_o[1024] = small, w.w_o[1536] = neg_big;
  mg.attn8[512] = small, mg.attn8[1024] = small;
  // row 1: the same four terms in the blocks 0..3 of quarter 0
  w.w_o[2048 + 0] = big, w.w_o[2048 + 32] = small, w.w_o[2048 + 64] = small, w.w_o[2048 + 96] = neg_big;
  mg.attn8[32] = small, mg.attn8[64] = small;
  // row 2: the reverse order across quarters: -2^16 first, then 2^-8, 2^-8, 2^16 -> 2^-7
  w.w_o[4096 + 0] = neg_big, w.w_o[4096 + 512] = small, w.w_o[4096 + 1024] = small, w.w_o[4096 + 1536] = big;
  // row 3: all four in one block: the block sum is exact (2^-7)
  w.w_o[6144 + 0] = big, w.w_o[6144 + 1] = neg_big, w.w_o[6144 + 2] = small, w.w_o[6144 + 3] = small;
  mg.attn8[1] = big, mg.attn8[2] = small, mg.attn8[3] = small;
  k4::OprojOut op;
  k4::o_proj_partials(op, mg, w, 1, c);
  CHECK(op.partial[0] == 0x0000);
  CHECK(op.partial[1] == 0x0000);
  CHECK(op.partial[2] == bf16_nearest(0x1p-7));
  CHECK(op.partial[3] == bf16_nearest(0x1p-7));
  for (int r = 4; r < c.hidden; ++r) CHECK(op.partial[r] == 0x0000);
}

TEST_CASE("the rank order of the all-reduce is part of the contract") {
  // partials (bf16): 1, 2^-24, 2^-24, -1 in rank order: ((((0 + 1) + 2^-24) + 2^-24) - 1) = 0;
  // the ranks permuted to 2^-24, 2^-24, 1, -1: 2^-23
  std::vector<uint16_t> one = {bf16_nearest(1.0)}, tiny = {bf16_nearest(0x1p-24)}, neg = {bf16_nearest(-1.0)};
  for (bool rs : {false, true}) {
    std::vector<std::vector<uint16_t>> a, b;
    k4::all_reduce_rows(a, {&one, &tiny, &tiny, &neg}, 1, 1, true, rs, 1);
    k4::all_reduce_rows(b, {&tiny, &tiny, &one, &neg}, 1, 1, true, rs, 1);
    for (int dst = 0; dst < 4; ++dst) {
      CHECK(a[dst][0] == 0x0000);
      CHECK(b[dst][0] == bf16_nearest(0x1p-23));
    }
  }
  // the 0.0 start turns an all -0 sum into +0; without it (the FFN's W = 1) -0 stays
  std::vector<uint16_t> mz = {0x8000};
  std::vector<std::vector<uint16_t>> z0, z1;
  k4::all_reduce_rows(z0, {&mz}, 1, 1, true, false, 1);
  k4::all_reduce_rows(z1, {&mz}, 1, 1, false, false, 1);
  CHECK(z0[0][0] == 0x0000);
  CHECK(z1[0][0] == 0x8000);
}

}  // TEST_SUITE
