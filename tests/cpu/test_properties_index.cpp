// test_properties_index.cpp -- stage 0 properties on seeded random rows (many seeds, custom
// init / local pins), and the long-context path against ranking every block.
//
// Scores are drawn from a mix built for collisions: a few repeated values (ties), +-0, -Inf,
// NaN of both signs, and normals; never >= 1e29 (K1's scores cannot get there, and above the
// pins the pins lose by contract, test_stage_index.cpp). Each row is checked three ways:
// the independent ranking of float64_model (check_index, exact), the stated properties one by
// one (pinned selected, tail last, NaN never beats a number, ties to the higher id), and for
// long rows select_long_candidates against ranking all n_blk blocks (513 .. 8192).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/stages/index.hpp"
#include "tests/cpu/fixtures.hpp"
#include "tests/cpu/float64_model.hpp"

namespace {

using k4::Config;
using k4::test::Rng;

float neg_nan() {
  const uint32_t b = 0xFFC00000u;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

float draw_score(Rng& r, int mode) {
  const int u = r.below(100);
  if (mode == 0) return float(r.normal() * 4.0);  // plain
  if (u < 8) return std::numeric_limits<float>::quiet_NaN();
  if (u < 12) return neg_nan();
  if (u < 16) return -std::numeric_limits<float>::infinity();
  if (u < 22) return 0.0f;
  if (u < 28) return -0.0f;
  if (u < 30) return 1e28f;
  if (u < 70) return float(r.below(5) - 2) * 0.5f;  // ties
  return float(r.normal() * 4.0);
}

// S rows of random lengths (a pad row now and then); block table entries random; one rank's
// index scores.
struct Rows {
  k4::StepShared sh;
  std::vector<float> scores;
};
Rows random_rows(Rng& r, int S, int q_len, int max_blocks, int mode) {
  Rows out;
  k4::StepShared& sh = out.sh;
  sh.tokens = S, sh.q_len = q_len;
  for (int k = 0; k < S; k += q_len) {
    const int last = 1 + r.below(max_blocks * 128);
    for (int j = 0; j < q_len; ++j) sh.seq_lens.push_back(std::max(0, last - (q_len - 1 - j)));
  }
  if (r.below(4) == 0) sh.seq_lens[r.below(S)] = 0;  // a pad row (its request stays consistent enough)
  int width = 1;
  for (int L : sh.seq_lens) width = std::max(width, (std::max(L, 1) + 127) / 128);
  sh.bt_width = sh.score_width = width;
  for (int k = 0; k < S; ++k)
    for (int b = 0; b < width; ++b) {
      sh.block_table.push_back(sh.seq_lens[k] == 0 ? 0 : r.below(1000));
      out.scores.push_back(draw_score(r, mode));
    }
  return out;
}

// The stated properties, row by row; returns "" or the first broken one.
std::string properties(const Config& c, const k4::StepShared& sh, const std::vector<float>& scores, const k4::IndexOut& idx) {
  for (int k = 0; k < sh.tokens; ++k) {
    const int ctx = std::max(sh.seq_lens[k], 1), n = (ctx + 127) / 128, tail = n - 1;
    const int* blk = idx.blocks.data() + size_t(k) * 16;
    const std::string row = "row " + std::to_string(k) + " (n_blk " + std::to_string(n) + "): ";
    std::vector<char> sel(n, 0);
    int n_sel = 0;
    for (int s = 0; s < 16; ++s)
      if (blk[s] >= 0) sel[blk[s]] = 1, ++n_sel;
    if (n_sel != std::min(n, 16)) return row + "selects " + std::to_string(n_sel) + " blocks";
    if (blk[n_sel - 1] != tail) return row + "the tail is not in the last slot";
    if (n <= 16) {
      for (int b = 0; b < n; ++b)
        if (blk[b] != b) return row + "a short context is not in id order";
      continue;
    }
    const float* sc = scores.data() + size_t(k) * sh.score_width;
    auto pinned = [&](int b) { return b < c.init_blocks || b >= n - c.local_blocks; };
    for (int b = 0; b < n; ++b)
      if (pinned(b) && !sel[b]) return row + "pinned block " + std::to_string(b) + " dropped";
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        if (!sel[a] || sel[b] || pinned(a) || pinned(b)) continue;
        // a selected, b not: a's score is not below b's; NaN never beats a number
        if (std::isnan(sc[a]) && !std::isnan(sc[b])) return row + "NaN block " + std::to_string(a) + " beats a number";
        if (!std::isnan(sc[a]) && !std::isnan(sc[b]) && sc[a] < sc[b]) return row + "a lower score beats a higher one";
        const bool tie = (std::isnan(sc[a]) && std::isnan(sc[b])) || sc[a] == sc[b];
        if (tie && a < b) return row + "a tie went to the lower id " + std::to_string(a) + " over " + std::to_string(b);
      }
  }
  return "";
}

// The top 16 (block ids) of n_blk blocks by (priority, id), independent of index_key.
std::vector<int> ranked_top16(const Config& c, const float* sc, int n) {
  std::vector<int> ord(n);
  std::iota(ord.begin(), ord.end(), 0);
  auto pr = [&](int b) {
    if (b >= n - c.local_blocks) return double(1e29f);
    if (b < c.init_blocks) return double(1e30f);
    return double(sc[b]);
  };
  std::partial_sort(ord.begin(), ord.begin() + 16, ord.end(), [&](int a, int b) {
    const double x = pr(a), y = pr(b);
    if (std::isnan(x) != std::isnan(y)) return std::isnan(y);
    if (!std::isnan(x) && x != y) return x > y;
    return a > b;
  });
  ord.resize(16);
  return ord;
}

Config with_pins(int init, int local) {
  Config c = k4::preset("tiny");
  c.init_blocks = init, c.local_blocks = local;
  c.validate();
  return c;
}

}  // namespace

TEST_SUITE("properties_index") {

TEST_CASE("random rows: the model selects what ranking by value selects, and every property holds") {
  const std::vector<std::pair<int, int>> pins = {{0, 1}, {1, 1}, {3, 2}, {0, 4}, {7, 9}};
  int rows = 0, scored = 0, with_nan = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    Rng r(seed);
    const auto [init, local] = pins[seed % pins.size()];
    const Config c = with_pins(init, local);
    const int S = 1 + r.below(16), q_len = (S % 2 == 0 && r.below(2)) ? 2 : 1;
    const Rows rw = random_rows(r, S, q_len, seed % 3 == 0 ? 40 : 300, int(seed % 5 != 0));
    const k4::StepShared& sh = rw.sh;
    k4::IndexOut idx;
    k4::select_blocks(idx, sh, rw.scores, c);
    CAPTURE(seed);
    const k4::f64::Report rep = k4::f64::check_index(c, sh, rw.scores, idx);
    REQUIRE_MESSAGE(k4::f64::all_ok(rep), k4::f64::describe(rep));
    const std::string broken = properties(c, sh, rw.scores, idx);
    REQUIRE_MESSAGE(broken.empty(), broken);
    for (int k = 0; k < S; ++k) {
      const int n = (std::max(sh.seq_lens[k], 1) + 127) / 128;
      ++rows, scored += n > 16;
      for (int b = 0; b < n; ++b) with_nan += std::isnan(rw.scores[size_t(k) * sh.score_width + b]) && n > 16;
    }
  }
  MESSAGE("rows ", rows, ", scored ", scored, ", NaN scores in scored rows ", with_nan);
  CHECK(scored > rows / 3);
  CHECK(with_nan > 100);
}

TEST_CASE("the long path selects exactly what ranking every block selects (513 .. 8192 blocks)") {
  const std::vector<int> fixed = {513, 514, 520, 777, 1024, 1025, 2047, 4096, 5001, 8191, 8192};
  const std::vector<std::pair<int, int>> pins = {{0, 1}, {2, 1}, {0, 3}, {5, 5}};
  int cases = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Rng r(seed * 977);
    const Config c = with_pins(pins[seed % pins.size()].first, pins[seed % pins.size()].second);
    const int n = seed <= fixed.size() ? fixed[seed - 1] : 513 + r.below(8192 - 513 + 1);
    const int mode = int(seed % 4);  // 0: plain; 1..3: ties, NaN, +-0, -Inf
    std::vector<float> sc(n);
    for (float& s : sc) s = mode == 3 ? float(r.below(3)) : draw_score(r, mode);  // mode 3: 3 values only
    int32_t keys[16], blocks[16];
    k4::select_long_candidates(keys, blocks, c, sc.data(), n);
    const std::vector<int> want = ranked_top16(c, sc.data(), n);
    CAPTURE(seed);
    CAPTURE(n);
    REQUIRE(std::vector<int>(blocks, blocks + 16) == want);
    for (int i = 1; i < 16; ++i) REQUIRE((keys[i - 1] > keys[i] || (keys[i - 1] == keys[i] && blocks[i - 1] > blocks[i])));
    ++cases;
  }
  CHECK(cases == 60);
}

TEST_CASE("long requests through select_blocks: every row long, the same selection as ranking") {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    Rng r(seed * 31 + 7);
    const Config c = with_pins(int(seed % 3), 1 + int(seed % 2));
    k4::StepShared sh;
    std::vector<float> scores;
    const int q_len = 1 + int(seed % 4), S = q_len * (1 + int(seed % 2));
    sh.tokens = S, sh.q_len = q_len;
    for (int k = 0; k < S; k += q_len) {
      const int last = 512 * 128 + 1 + r.below(2000 * 128);  // the last row past THREADS blocks
      for (int j = 0; j < q_len; ++j) sh.seq_lens.push_back(last - (q_len - 1 - j) * 100);
    }
    int width = 0;
    for (int L : sh.seq_lens) width = std::max(width, (L + 127) / 128);
    sh.bt_width = sh.score_width = width;
    for (int k = 0; k < S; ++k)
      for (int b = 0; b < width; ++b) sh.block_table.push_back(r.below(5000)), scores.push_back(draw_score(r, 1));
    k4::IndexOut idx;
    k4::select_blocks(idx, sh, scores, c);
    CAPTURE(seed);
    for (int k = 0; k < S; ++k) CHECK(idx.long_row[k] == 1);
    const k4::f64::Report rep = k4::f64::check_index(c, sh, scores, idx);
    REQUIRE_MESSAGE(k4::f64::all_ok(rep), k4::f64::describe(rep));
    REQUIRE(properties(c, sh, scores, idx).empty());
  }
}

}  // TEST_SUITE

TEST_SUITE("exhaustive_index") {

TEST_CASE("the long path against ranking, 2000 random contexts") {
  for (uint64_t seed = 1; seed <= 2000; ++seed) {
    Rng r(seed * 7919);
    const Config c = with_pins(r.below(4), 1 + r.below(4));
    const int n = 513 + r.below(8192 - 513 + 1);
    std::vector<float> sc(n);
    const int mode = r.below(4);
    for (float& s : sc) s = mode == 3 ? float(r.below(2)) : draw_score(r, mode);
    int32_t keys[16], blocks[16];
    k4::select_long_candidates(keys, blocks, c, sc.data(), n);
    CAPTURE(seed);
    REQUIRE(std::vector<int>(blocks, blocks + 16) == ranked_top16(c, sc.data(), n));
  }
}

TEST_CASE("random rows, 5000 steps") {
  for (uint64_t seed = 1; seed <= 5000; ++seed) {
    Rng r(seed + 1000000);
    const Config c = with_pins(r.below(5), 1 + r.below(5));
    const int S = 1 + r.below(16);
    const Rows rw = random_rows(r, S, 1, 1 + r.below(512), 1);
    k4::IndexOut idx;
    k4::select_blocks(idx, rw.sh, rw.scores, c);
    CAPTURE(seed);
    REQUIRE(k4::f64::all_ok(k4::f64::check_index(c, rw.sh, rw.scores, idx)));
    REQUIRE(properties(c, rw.sh, rw.scores, idx).empty());
  }
}

}  // TEST_SUITE
