// The model's fast decodes (reference/stages/fast_dot.hpp) equal the formats' decodes, and
// mma.hpp's block_dot_ints on them (int64 and the model's int32 accumulator) equals its byte
// forms, bit for bit, on random and adversarial blocks.
#include <doctest/doctest.h>

#include <cstdio>

#include "reference/numerics/mma.hpp"
#include "reference/numerics/policy.hpp"
#include "reference/stages/fast_dot.hpp"
#include "tests/cpu/fixtures.hpp"

using namespace k4;

namespace {

// Adversarial E4M3 blocks: max magnitudes, subnormals, cancellation, NaN codes.
void fill_e4m3(uint8_t* v, test::Rng& r, int kind) {
  for (int i = 0; i < kBlockK; ++i) {
    switch (kind) {
      case 0: v[i] = uint8_t(r.next()); break;                              // any code (NaN too)
      case 1: v[i] = uint8_t((i & 1) ? 0x7E : 0xFE); break;                 // +-448: exact cancellation
      case 2: v[i] = uint8_t(r.below(8) | (r.below(2) << 7)); break;        // subnormals and zeros
      default: v[i] = uint8_t(r.next() & 0x7E); break;                      // positive, no NaN
    }
  }
}

}  // namespace

TEST_CASE("fast decodes equal the formats' decodes for every code") {
  for (uint32_t n = 0; n < 16; ++n) CHECK(fp4_x2_branchless(n) == e2m1_to_int_x2(uint8_t(n)));
  for (uint32_t b = 0; b < 256; ++b)
    if (!e4m3_is_nan(uint8_t(b))) CHECK(e4m3_x512_branchless(b) == e4m3_to_int_x512(uint8_t(b)));
}

TEST_CASE("block dots on the fast decodes equal mma.hpp's byte forms bit for bit") {
  test::Rng r(42);
  int nonzero = 0, nan = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    uint8_t a[kBlockK], b[kBlockK], w[kBlockK / 2];
    fill_e4m3(a, r, trial % 4);
    fill_e4m3(b, r, (trial / 4) % 4);
    for (auto& x : w) x = uint8_t(r.next());
    int32_t ai[kBlockK], bi[kBlockK], wi[kBlockK];
    decode_e4m3_row_fast(ai, a, kBlockK);
    decode_e4m3_row_fast(bi, b, kBlockK);
    decode_fp4_row_fast(wi, w, kBlockK);
    bool an = false, bn = false;
    for (int i = 0; i < kBlockK; ++i) an |= e4m3_is_nan(a[i]), bn |= e4m3_is_nan(b[i]);
    const float want = block_dot_e4m3(a, b);
    const float want4 = block_dot_e2m1_e4m3(w, b);
    const uint32_t g8 = f32_bits(block_dot_ints(ai, bi, an || bn, 18));
    const uint32_t g4 = f32_bits(block_dot_ints<int32_t>(wi, bi, bn, 10)), g4l = f32_bits(block_dot_ints(wi, bi, bn, 10));
    if (g8 != f32_bits(want) || g4 != f32_bits(want4) || g4l != f32_bits(want4))
      std::printf("trial %d: e4m3 want %08x got %08x; e2m1 want %08x got %08x (int32) %08x (int64)\n", trial,
                  f32_bits(want), g8, f32_bits(want4), g4, g4l);
    REQUIRE(g8 == f32_bits(want));
    REQUIRE(g4 == f32_bits(want4));
    REQUIRE(g4l == f32_bits(want4));
    nonzero += want != 0.0f;
    nan += is_nan(want);
  }
  CHECK(nonzero > 5000);  // the blocks are not trivial
  CHECK(nan > 100);       // and NaN codes were exercised
  // a planted one-bit error is seen by the comparison: one E4M3 code one step off
  uint8_t a[kBlockK] = {0x38}, b[kBlockK] = {0x38}, a2[kBlockK] = {0x39};  // 1 * 1 vs 1.125 * 1
  CHECK(f32_bits(block_dot_e4m3(a, b)) != f32_bits(block_dot_e4m3(a2, b)));
}
