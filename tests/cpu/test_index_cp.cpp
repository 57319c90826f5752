// test_index_cp.cpp -- index.cp = on (indexer context parallelism, VARIANTS.md V6.2,
// docs/numerics.md §13 V6.2): the long threshold 288, the candidates of the four ranks' own
// blocks, and VARIANTS.md's invariant: with init_blocks = 0 the CP selection is the one-head
// long path's; with init_blocks > 0 the blocks below init are no candidate (the one-head path
// pins them at 1e30).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/stages/index.hpp"
#include "tests/cpu/fixtures.hpp"

namespace {

using k4::Config;

Config cp_config(int init_blocks, bool cp) {
  Config c = k4::preset("tiny");  // tp 4, N_SPLIT 8
  c.init_blocks = init_blocks;
  c.variant.index_cp = cp;
  c.validate();
  return c;
}

// Random scores with ties, -0, an Inf and a NaN or two.
std::vector<float> random_scores(int n, uint64_t seed) {
  k4::test::Rng r(seed);
  std::vector<float> s(static_cast<size_t>(n));
  for (float& x : s) x = float(int(r.below(200))) * 0.25f - 25.0f;
  s[size_t(r.below(n))] = -0.0f;
  s[size_t(r.below(n))] = std::numeric_limits<float>::infinity();
  s[size_t(r.below(n))] = std::numeric_limits<float>::quiet_NaN();
  return s;
}

struct Top16 {
  std::vector<int32_t> keys, blocks;
};
Top16 long_path(const Config& c, const std::vector<float>& s) {
  Top16 t{std::vector<int32_t>(16), std::vector<int32_t>(16)};
  k4::select_long_candidates(t.keys.data(), t.blocks.data(), c, s.data(), int(s.size()));
  return t;
}

// The oracle: the 16 best of blocks [from, n) by (index_key, block id) descending.
std::vector<int32_t> ranked(const Config& c, const std::vector<float>& s, int from) {
  const int n = int(s.size());
  std::vector<int32_t> b(size_t(n - from));
  std::iota(b.begin(), b.end(), from);
  auto key = [&](int x) { return k4::index_key(c, x, s[size_t(x)], n); };
  std::sort(b.begin(), b.end(), [&](int x, int y) { return key(x) > key(y) || (key(x) == key(y) && x > y); });
  b.resize(16);
  return b;
}

k4::StepShared one_row(int seq_len) {
  k4::StepShared sh;
  sh.tokens = 1, sh.q_len = 1;
  const int n = (seq_len + 127) / 128;
  sh.seq_lens = {seq_len};
  sh.bt_width = sh.score_width = n;
  for (int b = 0; b < n; ++b) sh.block_table.push_back(100 + b);
  return sh;
}

}  // namespace

TEST_SUITE("index_cp") {

TEST_CASE("init_blocks = 0: the CP long path selects what the one-head long path selects (289 .. 8192 blocks)") {
  const Config cp = cp_config(0, true), one = cp_config(0, false);
  for (int n : {289, 290, 300, 301, 302, 303, 400, 512, 513, 1000, 4097, 8192}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      CAPTURE(n);
      CAPTURE(seed);
      const std::vector<float> s = random_scores(n, seed * 1000 + uint64_t(n));
      const Top16 a = long_path(cp, s), b = long_path(one, s);
      CHECK(a.blocks == b.blocks);
      CHECK(a.keys == b.keys);
      CHECK(a.blocks == ranked(cp, s, 0));
    }
  }
}

TEST_CASE("init_blocks = 2, n_blk = 300: blocks 0 and 1 are never CP candidates; the one-head path pins them") {
  const Config cp = cp_config(2, true), one = cp_config(2, false);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    const std::vector<float> s = random_scores(300, seed);
    const Top16 a = long_path(cp, s), b = long_path(one, s);
    CHECK(std::find(a.blocks.begin(), a.blocks.end(), 0) == a.blocks.end());
    CHECK(std::find(a.blocks.begin(), a.blocks.end(), 1) == a.blocks.end());
    // pinned at 1e30 (only the +Inf block beats them)
    CHECK(std::find(b.blocks.begin(), b.blocks.end(), 0) != b.blocks.end());
    CHECK(std::find(b.blocks.begin(), b.blocks.end(), 1) != b.blocks.end());
    CHECK(a.blocks == ranked(cp, s, 2));  // the top 16 of the blocks >= init
  }
}

TEST_CASE("init_blocks = 3 (own0 = 4, 5, 6, 3 for ranks 0..3): the CP path ranks exactly the blocks >= 3") {
  const Config cp = cp_config(3, true);
  for (int n : {289, 333, 1025}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      CAPTURE(n);
      CAPTURE(seed);
      std::vector<float> s = random_scores(n, seed * 7 + uint64_t(n));
      for (int b = 3; b < 7; ++b) s[size_t(b)] = 1e6f + float(b);  // the four ranks' first blocks win
      const Top16 a = long_path(cp, s);
      CHECK(a.blocks == ranked(cp, s, 3));
      for (int b = 3; b < 7; ++b) CHECK(std::find(a.blocks.begin(), a.blocks.end(), b) != a.blocks.end());
    }
  }
}

TEST_CASE("the long threshold is 288 blocks under index.cp (THREADS = 512 otherwise); the selection is the same") {
  const Config cp = cp_config(0, true), one = cp_config(0, false);
  for (int blocks : {288, 289, 512}) {
    CAPTURE(blocks);
    const k4::StepShared sh = one_row(blocks * 128 - 5);
    const std::vector<float> s = random_scores(blocks, uint64_t(blocks));
    k4::IndexOut a, b;
    k4::select_blocks(a, sh, s, cp);
    k4::select_blocks(b, sh, s, one);
    CHECK(a.long_row[0] == (blocks > 288 ? 1 : 0));
    CHECK(b.long_row[0] == 0);
    CHECK(a.blocks == b.blocks);
    CHECK(a.sparse_table == b.sparse_table);
    CHECK(a.n_ctx == b.n_ctx);
  }
}

TEST_CASE("index.cp needs N_SPLIT = 2 TP (one index head a rank) and refuses ATOM's vllm cache mode") {
  Config c = k4::preset("tiny", 2);
  c.variant.index_cp = true;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("index.cp = on (VARIANTS.md V6.2) needs N_SPLIT = 2 TP"),
                       std::invalid_argument);
  c = k4::preset("tiny");
  c.variant.index_cp = true;
  c.variant.kv_scale = k4::KvScale::atom_vllm;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("index.cp = on with split.kv_scale = atom_vllm is no build"),
                       std::invalid_argument);
}

}  // TEST_SUITE
