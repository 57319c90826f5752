// test_serving_layout.cpp -- the serving stacks' layouts (golden/format/serving_layout.hpp):
// each map checked on a small case against the layout enumerated tile by tile (written here
// independently of the formula), and every byte position of K4's shapes taken there and back.
#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "golden/format/serving_layout.hpp"

namespace L = k4::golden::layout;

namespace {

// The map over one matrix is a permutation, and the whole-tensor functions move byte i of
// every plane of its position (bits 0-7, 8-15, 16-23 of i) to it and back. Each element is
// compared, and the first that differs is reported with its indices: one assertion a check,
// not one an element (tens of millions of those cost minutes under the sanitizers).
template <class Index, class Fwd, class Inv>
void check_round_trip(size_t mats, size_t rows, size_t cols, Index index, Fwd fwd, Inv inv) {
  const size_t per = rows * cols;
  std::vector<uint8_t> seen(per, 0);
  std::string first;  // the first element that breaks the rule, empty where none does
  for (size_t r = 0; r < rows && first.empty(); ++r)
    for (size_t c = 0; c < cols && first.empty(); ++c) {
      const size_t i = index(r, c);
      if (i >= per || seen[i]) first = "(" + std::to_string(r) + ", " + std::to_string(c) + ") -> " + std::to_string(i) +
                                       (i >= per ? ", past the matrix" : ", taken twice");
      else seen[i] = 1;
    }
  INFO("rows ", rows, ", cols ", cols);
  REQUIRE_MESSAGE(first.empty(), "not a permutation: ", first);
  for (int plane = 0; plane < 3; ++plane) {
    std::vector<uint8_t> logical(mats * per);
    for (size_t i = 0; i < logical.size(); ++i) logical[i] = uint8_t(i >> (8 * plane));
    const std::vector<uint8_t> served = fwd(logical);
    REQUIRE(served.size() == logical.size());
    for (size_t m = 0; m < mats && first.empty(); ++m)
      for (size_t r = 0; r < rows && first.empty(); ++r)
        for (size_t c = 0; c < cols && first.empty(); ++c)
          if (served[m * per + index(r, c)] != logical[m * per + r * cols + c])
            first = "matrix " + std::to_string(m) + " (" + std::to_string(r) + ", " + std::to_string(c) + "), plane " +
                    std::to_string(plane);
    REQUIRE_MESSAGE(first.empty(), "the served tensor differs from the map at ", first);
    REQUIRE(inv(served) == logical);
  }
}

}  // namespace

TEST_SUITE("serving_layout") {

TEST_CASE("shuffle_weight(16, 16): a [32][64] matrix enumerated tile by tile") {
  const size_t N = 32, Kb = 64;
  size_t at = 0;
  for (size_t rg = 0; rg < N / 16; ++rg)          // 16-row groups, outermost
    for (size_t kt = 0; kt < Kb / 32; ++kt)       // 32-byte tiles along k
      for (size_t h = 0; h < 2; ++h)              // the tile's two 16-byte halves
        for (size_t r = 0; r < 16; ++r)           // 16 rows of a half
          for (size_t b = 0; b < 16; ++b) CHECK(L::shuffle_weight_index(16 * rg + r, 32 * kt + 16 * h + b, N, Kb) == at++);
  CHECK(at == N * Kb);
  CHECK(L::shuffle_weight_index(1, 0, N, Kb) == 16);   // row 1 follows row 0's 16 bytes
  CHECK(L::shuffle_weight_index(0, 16, N, Kb) == 256); // the second half after 16 rows x 16 B
  CHECK(L::shuffle_weight_index(16, 0, N, Kb) == 1024); // the next row group after Kb/32 tiles of 512 B
}

TEST_CASE("shuffle_scale: a [64][16] matrix enumerated block by block") {
  const size_t R = 64, C = 16;
  size_t at = 0;
  for (size_t rb = 0; rb < R / 32; ++rb)
    for (size_t cb = 0; cb < C / 8; ++cb)
      for (size_t c4 = 0; c4 < 4; ++c4)
        for (size_t r16 = 0; r16 < 16; ++r16)
          for (size_t ch = 0; ch < 2; ++ch)
            for (size_t rh = 0; rh < 2; ++rh) CHECK(L::shuffle_scale_index(32 * rb + 16 * rh + r16, 8 * cb + 4 * ch + c4, R, C) == at++);
  CHECK(at == R * C);
  CHECK(L::shuffle_scale_index(16, 0, R, C) == 1);  // row 16 pairs with row 0
  CHECK(L::shuffle_scale_index(0, 4, R, C) == 2);   // then column 4 with column 0
}

TEST_CASE("kv page-16: K in 16-dim slabs of 16 keys, V transposed (seed:L689-L716)") {
  const size_t D = 32;
  size_t at = 0;
  for (size_t slab = 0; slab < D / 16; ++slab)
    for (size_t t = 0; t < 16; ++t)
      for (size_t b = 0; b < 16; ++b) CHECK(L::kv_page_k_index(t, 16 * slab + b, D) == at++);
  at = 0;
  for (size_t d = 0; d < D; ++d)
    for (size_t t = 0; t < 16; ++t) CHECK(L::kv_page_v_index(t, d, D) == at++);
}

TEST_CASE("every byte position there and back, at K4's shapes (w13, w2, w_o; s13, s2; KV pages)") {
  struct W { size_t mats, N, Kb; };
  for (const W w : {W{2, 1536, 3072}, W{2, 6144, 384}, W{1, 6144, 2048}, W{3, 64, 96}}) {
    CAPTURE(w.N);
    CAPTURE(w.Kb);
    check_round_trip(
        w.mats, w.N, w.Kb, [&](size_t n, size_t kb) { return L::shuffle_weight_index(n, kb, w.N, w.Kb); },
        [&](const std::vector<uint8_t>& x) { return L::shuffle_weight(x, w.N, w.Kb, "w"); },
        [&](const std::vector<uint8_t>& x) { return L::unshuffle_weight(x, w.N, w.Kb, "w"); });
  }
  struct S { size_t R, C; };
  for (const S s : {S{2 * 1536, 192}, S{2 * 6144, 24}, S{96, 40}}) {  // s13 [experts*1536][6144/32], s2 [experts*6144][768/32]
    CAPTURE(s.R);
    CAPTURE(s.C);
    check_round_trip(
        1, s.R, s.C, [&](size_t r, size_t c) { return L::shuffle_scale_index(r, c, s.R, s.C); },
        [&](const std::vector<uint8_t>& x) { return L::shuffle_scale(x, s.R, s.C, "s"); },
        [&](const std::vector<uint8_t>& x) { return L::unshuffle_scale(x, s.R, s.C, "s"); });
  }
  for (const size_t D : {size_t(128), size_t(16)})
    for (const bool v : {false, true}) {
      CAPTURE(D);
      CAPTURE(v);
      check_round_trip(
          5, 16, D, [&](size_t t, size_t d) { return v ? L::kv_page_v_index(t, d, D) : L::kv_page_k_index(t, d, D); },
          [&](const std::vector<uint8_t>& x) { return L::kv_to_pages(x, D, v, "kv"); },
          [&](const std::vector<uint8_t>& x) { return L::kv_from_pages(x, D, v, "kv"); });
    }
}

TEST_CASE("shapes the layouts cannot take are refused, named") {
  CHECK_THROWS_WITH_AS(L::unshuffle_weight(std::vector<uint8_t>(8 * 32), 8, 32, "rank0 w13"),
                       "rank0 w13: shuffle_weight(16, 16) needs rows a multiple of 16 and row bytes a multiple of 32, got [8][32]",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(L::unshuffle_weight(std::vector<uint8_t>(16 * 32 + 1), 16, 32, "w_o"),
                       "w_o: 513 bytes are not whole [16][32] matrices", std::invalid_argument);
  CHECK_THROWS_AS(L::shuffle_scale(std::vector<uint8_t>(16 * 8), 16, 8, "s13"), std::invalid_argument);
  CHECK_THROWS_AS(L::kv_to_pages(std::vector<uint8_t>(16 * 24), 24, false, "k"), std::invalid_argument);
  CHECK_THROWS_AS(L::shuffle_weight_index(32, 0, 32, 64), std::invalid_argument);
}

}  // TEST_SUITE
