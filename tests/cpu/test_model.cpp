// test_model.cpp -- run_step as a whole: what must not change its bits (the all-reduce form,
// the OpenMP thread count, one static KV scale vs the same scale per key, the KV page stride,
// q_len on short requests) and what must merely run (every token count 1..16, pad rows,
// q_len > 1 with a long request). Outputs are checked to be non-trivial.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/config.hpp"
#include "reference/model.hpp"
#include "tests/cpu/fixtures.hpp"
#include "tests/cpu/float64_model.hpp"

namespace {

using k4::LayerWeights;
using k4::StepInputs;
using k4::StepResult;

// Share of nonzero, finite bf16 values.
double live_share(const std::vector<uint16_t>& v) {
  size_t n = 0;
  for (uint16_t b : v) n += (b & 0x7FFF) != 0 && (b & 0x7F80) != 0x7F80;
  return v.empty() ? 0.0 : double(n) / double(v.size());
}

void require_live(const StepResult& r, double share = 0.9) {
  for (const k4::RankResult& R : r.ranks) {
    REQUIRE(live_share(R.split.o) > 0.0);
    REQUIRE(live_share(R.merge.attn) > share);
    REQUIRE(live_share(R.h_mid) > share);
    REQUIRE(live_share(R.router.xn) > share);
    REQUIRE(live_share(R.moe.mid) > share);
    REQUIRE(live_share(R.ar_out) > share);
  }
}

LayerWeights with_cfg(const LayerWeights& base, void (*edit)(k4::Config&)) {
  LayerWeights w = base;
  edit(w.cfg);
  w.cfg.validate();
  return w;
}

}  // namespace

TEST_SUITE("model") {

TEST_CASE("reduce-scatter + all-gather vs plain all-reduces: identical outputs") {
  for (int tp : {2, 4}) {
    const LayerWeights& base = k4::f64::cached_layer("tiny", tp, 1);
    const LayerWeights low = with_cfg(base, [](k4::Config& c) { c.ag_rs_from = 1; });
    const LayerWeights high = with_cfg(base, [](k4::Config& c) { c.ag_rs_from = 17; });
    for (int S : tp == 4 ? std::vector<int>{3} : std::vector<int>{1, 13}) {
      std::vector<int> lens;
      for (int k = 0; k < S; ++k) lens.push_back(std::vector<int>{700, 129, 0, 2300}[k % 4]);
      const StepInputs in = k4::test::random_step(base.cfg, {S, lens, 1, uint64_t(S) + 40});
      const StepResult a = k4::run_step(low, in), b = k4::run_step(high, in);
      CAPTURE(tp);
      CAPTURE(S);
      const std::string d = k4::f64::diff_step(a, b);
      REQUIRE_MESSAGE(d.empty(), d);
      require_live(a);
    }
  }
}

TEST_CASE("each rank selects from its own index scores (R0.0, seed:L487)") {
  const LayerWeights w = k4::test::random_layer(k4::preset("tiny", 2), 21);
  const StepInputs in = k4::test::random_step(w.cfg, {3, {5000, 20000, 900}, 1, 17});
  REQUIRE(in.ranks[0].index_scores != in.ranks[1].index_scores);  // the fixture's heads differ
  const StepResult r = k4::run_step(w, in);
  CHECK(r.ranks[0].index.blocks != r.ranks[1].index.blocks);
  // the ranks' scores swapped: their selections (and split partials) swap, bit for bit
  StepInputs sw = in;
  std::swap(sw.ranks[0].index_scores, sw.ranks[1].index_scores);
  const StepResult s = k4::run_step(w, sw);
  CHECK(s.ranks[0].index.sparse_table == r.ranks[1].index.sparse_table);
  CHECK(s.ranks[1].index.sparse_table == r.ranks[0].index.sparse_table);
  // rank 1's scores changed: rank 0's stages 0..2 (its own selection and attention) do not
  StepInputs ch = in;
  for (float& f : ch.ranks[1].index_scores) f = -f;
  const StepResult c = k4::run_step(w, ch);
  CHECK(c.ranks[0].index.sparse_table == r.ranks[0].index.sparse_table);
  CHECK(c.ranks[0].merge.attn == r.ranks[0].merge.attn);
  CHECK(c.ranks[1].index.sparse_table != r.ranks[1].index.sparse_table);
  // a rank's scores of the wrong size are refused, naming the rank
  StepInputs bad = in;
  bad.ranks[1].index_scores.pop_back();
  CHECK_THROWS_WITH_AS(k4::run_step(w, bad), doctest::Contains("inputs: rank1/index_scores: has"), std::invalid_argument);
}

TEST_CASE("the same bits for any OpenMP thread count") {
  const LayerWeights& w = k4::f64::cached_layer("tiny", 2, 1);
  const int saved = omp_get_max_threads();
  for (int S : {2, 6}) {  // narrow and wide
    std::vector<int> lens;
    for (int k = 0; k < S; ++k) lens.push_back(std::vector<int>{3000, 40, 1000}[k % 3]);
    const StepInputs in = k4::test::random_step(w.cfg, {S, lens, 1, uint64_t(S) * 3});
    omp_set_num_threads(1);
    const StepResult one = k4::run_step(w, in);
    for (int threads : {2, 3}) {
      omp_set_num_threads(threads);
      const StepResult many = k4::run_step(w, in);
      CAPTURE(S);
      CAPTURE(threads);
      const std::string d = k4::f64::diff_step(one, many);
      REQUIRE_MESSAGE(d.empty(), d);
    }
    require_live(one);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("every token count 1..16 runs (pad rows, short and multi-partition contexts)") {
  const LayerWeights& w = k4::f64::cached_layer("tiny", 1, 2);
  for (int S = 1; S <= 16; ++S) {
    std::vector<int> lens;
    for (int k = 0; k < S; ++k) lens.push_back(k == 5 ? 0 : (k * 397 + 1) % 2048);  // <= 16 blocks; row 5 a pad row
    const StepInputs in = k4::test::random_step(w.cfg, {S, lens, 1, uint64_t(S)});
    const StepResult r = k4::run_step(w, in);
    CAPTURE(S);
    const k4::RankResult& R = r.ranks[0];
    REQUIRE(R.ar_out.size() == size_t(S) * w.cfg.hidden);
    for (int k = 0; k < S; ++k) REQUIRE(R.index.n_ctx[k] == std::max(lens[k], 1));  // <= 16 blocks: every key
    require_live(r);
    // routing: 4 distinct experts and the shared one a token
    for (int k = 0; k < S; ++k) {
      std::vector<int32_t> ids(R.route.ids.begin() + k * 5, R.route.ids.begin() + k * 5 + 4);
      std::sort(ids.begin(), ids.end());
      REQUIRE(std::unique(ids.begin(), ids.end()) == ids.end());
      REQUIRE(R.route.ids[k * 5 + 4] == w.cfg.shared_expert());
    }
  }
}

TEST_CASE("q_len > 1: a long request takes the long path on every row, and selects as q_len 1 does") {
  const LayerWeights& w = k4::f64::cached_layer("tiny", 1, 2);
  // request 0: rows of 512 and 513 blocks (the last > THREADS: both long); request 1 short
  const StepInputs in2 = k4::test::random_step(w.cfg, {4, {512 * 128, 512 * 128 + 1, 900, 901}, 2, 9});
  StepInputs in1 = in2;
  in1.shared.q_len = 1;
  const StepResult r2 = k4::run_step(w, in2), r1 = k4::run_step(w, in1);
  const k4::RankResult &R2 = r2.ranks[0], &R1 = r1.ranks[0];
  CHECK(std::vector<int>(R2.index.long_row.begin(), R2.index.long_row.end()) == std::vector<int>({1, 1, 0, 0}));
  CHECK(std::vector<int>(R1.index.long_row.begin(), R1.index.long_row.end()) == std::vector<int>({0, 1, 0, 0}));
  // the long path selects what ranking does (R0.10): every other output bit is the same
  StepResult r1b = r1;
  r1b.ranks[0].index.long_row = R2.index.long_row;
  const std::string d = k4::f64::diff_step(r2, r1b);
  CHECK_MESSAGE(d.empty(), d);
  CHECK(k4::f64::all_ok(k4::f64::check_index(w.cfg, in2.shared, in2.ranks[0].index_scores, R2.index)));
  require_live(r2);
  // a q_len 4 request of short rows
  const StepInputs in4 = k4::test::random_step(w.cfg, {8, {1000, 1001, 1002, 1003, 2200, 2201, 2202, 2203}, 4, 10});
  StepInputs in4b = in4;
  in4b.shared.q_len = 1;
  const std::string d4 = k4::f64::diff_step(k4::run_step(w, in4), k4::run_step(w, in4b));
  CHECK_MESSAGE(d4.empty(), d4);
}

TEST_CASE("one static KV scale gives the bits of that scale on every key") {
  const LayerWeights& base = k4::f64::cached_layer("tiny", 2, 1);
  const LayerWeights stat = with_cfg(base, [](k4::Config& c) { c.variant.kv_scale = k4::KvScale::scalar; });
  StepInputs per_key = k4::test::random_step(base.cfg, {3, {2000, 300, 5}, 1, 21});
  StepInputs one = per_key;
  for (size_t r = 0; r < per_key.ranks.size(); ++r) {
    const float ks = 0.0625f + 0.01f * float(r), vs = 0.09f - 0.01f * float(r);
    std::fill(per_key.ranks[r].k_scale.begin(), per_key.ranks[r].k_scale.end(), ks);
    std::fill(per_key.ranks[r].v_scale.begin(), per_key.ranks[r].v_scale.end(), vs);
    one.ranks[r].k_scale = {ks};
    one.ranks[r].v_scale = {vs};
  }
  const StepResult a = k4::run_step(base, per_key), b = k4::run_step(stat, one);
  const std::string d = k4::f64::diff_step(a, b);
  CHECK_MESSAGE(d.empty(), d);
  require_live(b);
  CHECK(k4::f64::all_ok(k4::f64::check_split(stat.cfg, one.shared, one.ranks[1], b.ranks[1].index, b.ranks[1].split)));
}

TEST_CASE("kv_page_stride 8 and 16: the same KV in either layout, the same bits") {
  const LayerWeights& base = k4::f64::cached_layer("tiny", 1, 2);
  const LayerWeights s8 = with_cfg(base, [](k4::Config& c) { c.kv_page_stride = 8; });
  const StepInputs in16 = k4::test::random_step(base.cfg, {2, {3000, 777}, 1, 31});
  // entry e's pages: e * 16 + j (stride 16, the V side's 8 pages unused here) -> e * 8 + j
  StepInputs in8 = in16;
  k4::StepRank& R8 = in8.ranks[0];
  const k4::StepRank& R16 = in16.ranks[0];
  const int entries = R16.n_pages / 16, pb = base.cfg.page * base.cfg.head_dim;
  R8.n_pages = entries * 8;
  R8.k_cache.assign(size_t(R8.n_pages) * pb, 0), R8.v_cache.assign(size_t(R8.n_pages) * pb, 0);
  R8.k_scale.assign(size_t(R8.n_pages) * 16, 0.0f), R8.v_scale.assign(size_t(R8.n_pages) * 16, 0.0f);
  for (int e = 0; e < entries; ++e)
    for (int j = 0; j < 8; ++j) {
      const size_t from = size_t(e) * 16 + j, to = size_t(e) * 8 + j;
      std::copy_n(R16.k_cache.begin() + from * pb, pb, R8.k_cache.begin() + to * pb);
      std::copy_n(R16.v_cache.begin() + from * pb, pb, R8.v_cache.begin() + to * pb);
      std::copy_n(R16.k_scale.begin() + from * 16, 16, R8.k_scale.begin() + to * 16);
      std::copy_n(R16.v_scale.begin() + from * 16, 16, R8.v_scale.begin() + to * 16);
    }
  const StepResult a = k4::run_step(base, in16), b = k4::run_step(s8, in8);
  // the page ids differ by layout; the tables agree page for page under the map
  const auto& ta = a.ranks[0].index.sparse_table;
  const auto& tb = b.ranks[0].index.sparse_table;
  for (size_t i = 0; i < ta.size(); ++i) {
    if (i % 129 == 128) REQUIRE(ta[i] == tb[i]);                                 // n_ctx
    else REQUIRE(tb[i] == (ta[i] / 16) * 8 + ta[i] % 16);
  }
  StepResult bb = b;
  bb.ranks[0].index.sparse_table = ta;
  const std::string d = k4::f64::diff_step(a, bb);
  CHECK_MESSAGE(d.empty(), d);
  require_live(a);
}

}  // TEST_SUITE
