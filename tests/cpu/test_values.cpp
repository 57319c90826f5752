// test_values.cpp -- the values the model defines: NaN, Inf and -0 in every input (q, h_in,
// index scores, KV caches and scales, weights), all-zero rows, and the route ids the kernel
// clamps to E_TOP. Each scenario injection makes a golden through the real `k4 golden
// --scenario`; the test checks that the golden is made, that the special values are really in
// its inputs (or weights), and that the outputs are what the contract (docs/numerics.md) says:
// NaN exactly where a poisoned value reaches, and finite, non-trivial values elsewhere.
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "reference/numerics/hd.hpp"
#include "golden/diff/compare.hpp"
#include "golden/inputs/scenario.hpp"
#include "golden/format/schema.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/model.hpp"
#include "reference/numerics/bf16.hpp"
#include "tests/cpu/cli_run.hpp"

using namespace k4;
using k4::cli::TempDir;

namespace {

bool nan16(uint16_t b) { return (b & 0x7FFF) > 0x7F80; }
bool inf16(uint16_t b) { return (b & 0x7FFF) == 0x7F80; }
bool finite16(uint16_t b) { return (b & 0x7F80) != 0x7F80; }
bool finite32(float f) { return std::isfinite(f); }

template <class T, class F>
size_t count_if(const std::vector<T>& v, F f) {
  return size_t(std::count_if(v.begin(), v.end(), f));
}
// Elements [row * n, (row + 1) * n) of v.
template <class T>
std::vector<T> row_of(const std::vector<T>& v, size_t row, size_t n) {
  return std::vector<T>(v.begin() + long(row * n), v.begin() + long((row + 1) * n));
}
template <class T>
bool all_finite16(const std::vector<T>& v) {
  return std::all_of(v.begin(), v.end(), [](uint16_t b) { return finite16(b); });
}
bool all_finite32(const std::vector<float>& v) { return std::all_of(v.begin(), v.end(), finite32); }
template <class T>
bool any_nonzero(const std::vector<T>& v) {
  return std::any_of(v.begin(), v.end(), [](T x) { return x != T(0); });
}

struct Made {
  TempDir t{"values"};
  std::string path;
  std::unique_ptr<golden::GoldenReader> g;
  Config cfg;
  StepInputs in;
  StepResult res;
};

// k4 golden --preset tiny --tp 2 --scenario (the JSON) [extra]: the golden, read back.
std::unique_ptr<Made> make(const std::string& scenario_json, const std::string& extra = "") {
  auto m = std::make_unique<Made>();
  const std::string s = m->t.path("s.json");
  std::ofstream(s) << scenario_json;
  m->path = m->t.path("g.h5");
  const cli::Run r = cli::run(m->t, "golden --preset tiny --tp 2 --scenario " + s + " --out " + m->path + " " + extra);
  CAPTURE(r.err);
  REQUIRE(r.rc == 0);
  m->g = std::make_unique<golden::GoldenReader>(m->path);
  m->cfg = m->g->config();
  m->in = m->g->inputs();
  m->res = m->g->result();
  CHECK(m->g->root_attr("scenario").find("\"inject\"") != std::string::npos);
  return m;
}

// The route ids of token k (slots 0..3).
std::set<int> picks(const RankResult& R, int k, const Config& cfg) {
  std::set<int> s;
  for (int p = 0; p < cfg.top_k; ++p) s.insert(R.route.ids[size_t(k) * cfg.moe_slots() + p]);
  return s;
}

}  // namespace

TEST_SUITE("values") {

// ================================================================== index scores

TEST_CASE("values: NaN, +-Inf and -0 index scores: in the golden, NaN ranked lowest, +Inf selected, outputs finite") {
  REQUIRE_K4();
  auto m = make(R"({"tokens": 4, "context": [3000], "inject": {"nan_scores": 2, "inf_scores": 2, "neg_zero_scores": 2}})");
  const Config& c = m->cfg;
  const StepShared& sh = m->in.shared;
  for (const StepRank& I : m->in.ranks) {  // every rank's own scores carry the injections
    CHECK(count_if(I.index_scores, [](float f) { return std::isnan(f); }) >= 4);
    CHECK(count_if(I.index_scores, [](float f) { return f == INFINITY; }) >= 2);
    CHECK(count_if(I.index_scores, [](float f) { return f == -INFINITY; }) >= 2);
    CHECK(count_if(I.index_scores, [](float f) { return f32_bits(f) == 0x80000000u; }) >= 1);
  }
  for (size_t r = 0; r < m->res.ranks.size(); ++r)
    for (int k = 0; k < sh.tokens; ++k) {
      const RankResult& R = m->res.ranks[r];
      const std::vector<float>& scores = m->in.ranks[r].index_scores;
      const int n_blk = (sh.seq_lens[size_t(k)] + c.sparse_block - 1) / c.sparse_block;
      REQUIRE(n_blk > c.topk_blocks);  // scored rows
      const std::vector<int32_t> blocks = row_of(R.index.blocks, size_t(k), size_t(c.topk_blocks));
      for (int b = 0; b + 1 < n_blk; ++b) {  // the tail is pinned, its score unread
        const float sc = scores[size_t(k) * sh.score_width + b];
        const bool sel = std::find(blocks.begin(), blocks.end(), b) != blocks.end();
        if (std::isnan(sc)) CHECK_MESSAGE(!sel, "row " << k << " block " << b << ": a NaN score ranks below -Inf");
        if (sc == INFINITY) CHECK_MESSAGE(sel, "row " << k << " block " << b << ": +Inf is selected");
        if (sc == -INFINITY) CHECK_MESSAGE(!sel, "row " << k << " block " << b);
      }
      // the tail (pinned) is selected: n_ctx = 15 full blocks + the tail's keys (R0.6)
      CHECK(R.index.n_ctx[size_t(k)] == (c.topk_blocks - 1) * c.sparse_block + sh.seq_lens[size_t(k)] - (n_blk - 1) * c.sparse_block);
    }
  for (const RankResult& R : m->res.ranks) {
    CHECK(all_finite16(R.split.o));
    CHECK(all_finite16(R.merge.attn));
    CHECK(all_finite16(R.ar_out));
    CHECK(any_nonzero(R.ar_out));
  }
}

// ================================================================== q

TEST_CASE("values: special q (NaN, +Inf, 466 in token 0; -0, +-448, 464, +-2^-10, 2^-9 in every token)") {
  REQUIRE_K4();
  auto m = make(R"({"tokens": 4, "context": [1000], "inject": {"special_q": true}})");
  const Config& c = m->cfg;
  const int OK = c.o_k(), HD = c.head_dim;
  for (int r = 0; r < c.tp; ++r) {
    CAPTURE(r);
    const StepRank& I = m->in.ranks[size_t(r)];
    const RankResult& R = m->res.ranks[size_t(r)];
    // the specials are in the golden's q, and q8 is their E4M3 NoSaturate
    size_t seen_nan = 0, seen_inf = 0, seen_466 = 0, seen_464 = 0, seen_negz = 0, seen_tiny = 0;
    for (size_t i = 0; i < I.q.size(); ++i) {
      const uint16_t q = I.q[i];
      const uint8_t q8 = R.split.q8[i];
      if (nan16(q)) seen_nan += (q8 == 0x7F);
      if (q == 0x7F80) seen_inf += (q8 == 0x7F);
      if (q == bf16_bits_rne(466.0f)) seen_466 += (q8 == 0x7F);
      if (q == bf16_bits_rne(464.0f)) seen_464 += (q8 == 0x7E);
      if (q == 0x8000) seen_negz += (q8 == 0x80);
      if (q == bf16_bits_rne(0x1p-10f)) seen_tiny += (q8 == 0x00);
    }
    CHECK(seen_nan >= 1);
    CHECK(seen_inf >= 1);
    CHECK(seen_466 >= 1);
    CHECK(seen_464 >= 4);
    CHECK(seen_negz >= 4);
    CHECK(seen_tiny >= 4);
    // token 0: heads 0..2 NaN in the partitions holding keys, heads 3.. finite; from the merge's
    // amax on the whole token is NaN (x_scale NaN, attn8 all 0x7F)
    for (int h = 0; h < c.heads; ++h) {
      const uint16_t o0 = R.split.o[size_t(0) * OK + size_t(h) * HD];  // token 0, partition 0, head h, dim 0
      if (h < 3) CHECK(nan16(o0));
      else CHECK(finite16(o0));
    }
    CHECK(std::isnan(R.merge.x_scale[0]));
    CHECK(count_if(row_of(R.merge.attn8, 0, size_t(OK)), [](uint8_t b) { return b == 0x7F; }) == size_t(OK));
    CHECK(!all_finite16(row_of(R.oproj.partial, 0, size_t(c.hidden))));
    // its routing is defined: every route key is the canonical NaN's, the lowest ids win
    CHECK(picks(R, 0, c) == std::set<int>{0, 1, 2, 3});
    // tokens 1..3: finite and not trivial
    for (int k = 1; k < 4; ++k) {
      CAPTURE(k);
      CHECK(finite32(R.merge.x_scale[size_t(k)]));
      CHECK(all_finite16(row_of(R.merge.attn, size_t(k), size_t(OK))));
      CHECK(all_finite16(row_of(R.oproj.partial, size_t(k), size_t(c.hidden))));
      CHECK(all_finite16(row_of(R.h_mid, size_t(k), size_t(c.hidden))));
      CHECK(all_finite16(row_of(R.ar_out, size_t(k), size_t(c.hidden))));
      CHECK(any_nonzero(row_of(R.ar_out, size_t(k), size_t(c.hidden))));
    }
  }
}

TEST_CASE("values: extreme q poisons every token from the merge on; partitions past n_ctx stay o = +0, m = NEG, l = 256") {
  REQUIRE_K4();
  auto m = make(R"({"tokens": 2, "context": [300], "inject": {"extreme_q": true}})");
  const Config& c = m->cfg;
  for (const RankResult& R : m->res.ranks)
    for (int k = 0; k < 2; ++k) {
      CHECK(R.index.n_ctx[size_t(k)] == 300);
      for (int t = 0; t < c.n_split; ++t)
        for (int h = 0; h < c.heads; ++h) {
          const size_t mi = (size_t(k) * c.n_split + t) * c.heads + h;
          if (t * c.split_keys() >= 300) {  // no valid key (R1.13), whatever q holds
            CHECK(f32_bits(R.split.m[mi]) == f32_bits(-3.4e38f));
            CHECK(R.split.l[mi] == 256.0f);
            const size_t o0 = (size_t(k) * c.n_split + t) * c.o_k() + size_t(h) * c.head_dim;
            for (int d = 0; d < c.head_dim; ++d) CHECK(R.split.o[o0 + d] == 0x0000);
          }
        }
      CHECK(std::isnan(R.merge.x_scale[size_t(k)]));
      CHECK(picks(R, k, c) == std::set<int>{0, 1, 2, 3});
    }
}

// ================================================================== h_in

TEST_CASE("values: special h_in (a NaN, +Inf, -Inf element, 64 -0): h_mid, rstd and the routing as the contract says") {
  REQUIRE_K4();
  auto m = make(R"({"tokens": 4, "context": [1000], "inject": {"special_h_in": true}})");
  const Config& c = m->cfg;
  const size_t H = size_t(c.hidden);
  const std::vector<uint16_t>& h = m->in.shared.h_in;
  const std::vector<uint16_t> r0 = row_of(h, 0, H), r1 = row_of(h, 1, H), r2 = row_of(h, 2, H), r3 = row_of(h, 3, H);
  REQUIRE(count_if(r0, nan16) == 1);
  REQUIRE(count_if(r1, [](uint16_t b) { return b == 0x7F80; }) == 1);
  REQUIRE(count_if(r2, [](uint16_t b) { return b == 0xFF80; }) == 1);
  REQUIRE(count_if(r3, [](uint16_t b) { return b == 0x8000; }) >= 60);
  for (const RankResult& R : m->res.ranks) {
    CHECK(all_finite16(R.oproj.partial));  // h_in does not enter o_proj
    CHECK(all_finite16(R.a));
    // h_mid = bf16(a + h_in): the special exactly where it was planted, a where h_in is -0
    for (size_t i = 0; i < H; ++i) {
      CHECK(nan16(R.h_mid[i]) == nan16(r0[i]));
      CHECK(inf16(R.h_mid[H + i]) == inf16(r1[i]));
      CHECK(inf16(R.h_mid[2 * H + i]) == inf16(r2[i]));
      if (r3[i] == 0x8000) CHECK(R.h_mid[3 * H + i] == R.a[3 * H + i]);
    }
    // rstd: NaN (row 0), rsq(Inf) = 0 (rows 1, 2), finite (row 3)
    CHECK(std::isnan(R.router.rstd[0]));
    CHECK(f32_bits(R.router.rstd[1]) == 0u);
    CHECK(f32_bits(R.router.rstd[2]) == 0u);
    CHECK(finite32(R.router.rstd[3]));
    CHECK(R.router.rstd[3] > 0.0f);
    for (int k = 0; k < 3; ++k) CHECK(picks(R, k, c) == std::set<int>{0, 1, 2, 3});  // NaN logits: canonical NaN keys
    CHECK(all_finite16(row_of(R.ar_out, 3, H)));
    CHECK(any_nonzero(row_of(R.ar_out, 3, H)));
  }
}

// ================================================================== KV caches and scales

TEST_CASE("values: special KV (NaN codes, NaN / Inf scales where no row reads; -0 where rows read): masked, bit for bit") {
  REQUIRE_K4();
  auto m = make(R"({"tokens": 4, "context": [700, 300, 1000, 50], "inject": {"special_kv": true}})", "--kv-form whole");
  const Config& c = m->cfg;
  for (int r = 0; r < c.tp; ++r) {
    const StepRank& I = m->in.ranks[size_t(r)];
    CHECK(count_if(I.k_cache, [](uint8_t b) { return b == 0x7F; }) > 0);
    CHECK(count_if(I.k_cache, [](uint8_t b) { return b == 0xFF; }) > 0);
    CHECK(count_if(I.v_cache, [](uint8_t b) { return b == 0x7F || b == 0xFF; }) > 0);
    CHECK(count_if(I.k_scale, [](float f) { return std::isnan(f); }) > 0);
    CHECK(count_if(I.k_scale, [](float f) { return std::isinf(f); }) > 0);
    CHECK(count_if(I.v_scale, [](float f) { return std::isnan(f); }) > 0);
    CHECK(count_if(I.k_scale, [](float f) { return f32_bits(f) == 0x80000000u; }) > 0);
    CHECK(count_if(I.v_scale, [](float f) { return f32_bits(f) == 0x80000000u; }) > 0);
    const RankResult& R = m->res.ranks[size_t(r)];
    CHECK(all_finite16(R.split.o));
    CHECK(all_finite32(R.split.m));
    CHECK(all_finite32(R.split.l));
    CHECK(all_finite16(R.merge.attn));
    CHECK(all_finite16(R.ar_out));
    CHECK(any_nonzero(R.ar_out));
  }
  // The junk never reaches an output: the same step with every NaN / Inf of the caches zeroed
  // gives the golden's bits, every rank, every stage.
  StepInputs clean = m->in;
  for (StepRank& R : clean.ranks) {
    for (uint8_t& b : R.k_cache) if (b == 0x7F || b == 0xFF) b = 0;
    for (uint8_t& b : R.v_cache) if (b == 0x7F || b == 0xFF) b = 0;
    for (float& f : R.k_scale) if (!std::isfinite(f)) f = 0.0f;
    for (float& f : R.v_scale) if (!std::isfinite(f)) f = 0.0f;
  }
  const StepResult again = run_step(m->g->weights(), clean);
  for (int r = 0; r < c.tp; ++r) {
    const RankResult &a = again.ranks[size_t(r)], &b = m->res.ranks[size_t(r)];
    CHECK(a.split.o == b.split.o);
    CHECK(std::memcmp(a.split.m.data(), b.split.m.data(), a.split.m.size() * 4) == 0);
    CHECK(std::memcmp(a.split.l.data(), b.split.l.data(), a.split.l.size() * 4) == 0);
    CHECK(a.merge.attn8 == b.merge.attn8);
    CHECK(a.ar_out == b.ar_out);
  }
}

TEST_CASE("values: extreme KV (codes +-448, subnormals, -0; scales 0 and 1e3): the golden holds them, outputs finite") {
  REQUIRE_K4();
  auto m = make(R"({"tokens": 3, "context": [900], "inject": {"extreme_kv": true}})", "--kv-form whole");
  for (const StepRank& I : m->in.ranks) {
    CHECK(count_if(I.k_cache, [](uint8_t b) { return b == 0x7E || b == 0xFE; }) > 0);
    CHECK(count_if(I.v_cache, [](uint8_t b) { return b == 0x80; }) > 0);
    CHECK(count_if(I.k_scale, [](float f) { return f == 0.0f; }) > 0);
    CHECK(count_if(I.v_scale, [](float f) { return f == 1e3f; }) > 0);
  }
  for (const RankResult& R : m->res.ranks) {
    CHECK(all_finite16(R.split.o));
    CHECK(all_finite16(R.ar_out));
    CHECK(any_nonzero(R.ar_out));
  }
}

// ================================================================== weights

TEST_CASE("values: special weights (-0, +-Inf, NaN where contained): in the golden's weights, defined picks and rows") {
  REQUIRE_K4();
  for (int tokens : {4, 6}) {  // narrow and wide MoE
    CAPTURE(tokens);
    auto m = make(R"({"tokens": )" + std::to_string(tokens) + R"(, "context": [1000], "inject": {"special_weights": true}})");
    const Config& c = m->cfg;
    const size_t H = size_t(c.hidden);
    const LayerWeights w = m->g->weights();
    for (const RankWeights& rw : w.ranks) {
      CHECK(std::isnan(rw.bias[3]));
      CHECK(rw.bias[4] == -INFINITY);
      CHECK(rw.bias[5] == INFINITY);
      CHECK(f32_bits(rw.bias[6]) == 0x80000000u);
      CHECK(f32_bits(rw.s_o[3]) == 0x80000000u);
      CHECK(count_if(rw.w_o, [](uint8_t b) { return b == 0x80; }) > 0);
      CHECK(count_if(rw.g_post, [](uint16_t b) { return b == 0x8000; }) > 0);
      CHECK(count_if(rw.w_gate, [](uint16_t b) { return b == 0x7F80; }) == 1);
      CHECK(count_if(rw.w_gate, [](uint16_t b) { return b == 0xFF80; }) == 1);
    }
    for (int r = 0; r < c.tp; ++r) {
      CAPTURE(r);
      const golden::MoeStage ms = m->g->moe(r);
      REQUIRE(std::binary_search(ms.expert_ids.begin(), ms.expert_ids.end(), 3));
      CHECK(ms.experts->expert(r, 3)->s2[size_t(7) * size_t(c.inter / 32)] == 0xFF);  // stored in the golden
      const RankResult& R = m->res.ranks[size_t(r)];
      for (int k = 0; k < tokens; ++k) {
        CAPTURE(k);
        // bias NaN: the canonical NaN key, above every other: expert 3 first; +Inf: expert 5 second
        CHECK(R.route.ids[size_t(k) * c.moe_slots() + 0] == 3);
        CHECK(R.route.ids[size_t(k) * c.moe_slots() + 1] == 5);
        CHECK(picks(R, k, c).count(4) == 0);  // -Inf: never
        for (int p = 0; p < c.moe_slots(); ++p) CHECK(finite32(R.route.weights[size_t(k) * c.moe_slots() + p]));
        // s_o[3] = -0: partial +-0, the all-reduce from 0.0 makes it +0 (R3.4)
        CHECK(R.a[size_t(k) * H + 3] == 0x0000);
        // s2 NaN at row 7 of expert 3 (every token routes there): that row, and only it, is NaN
        const std::vector<uint16_t> part = row_of(R.moe.partial, size_t(k), H);
        CHECK(nan16(part[7]));
        CHECK(count_if(part, [](uint16_t b) { return !finite16(b); }) == 1);
        CHECK(count_if(row_of(R.ar_out, size_t(k), H), [](uint16_t b) { return !finite16(b); }) == 1);
      }
      CHECK(all_finite16(R.split.o));
      CHECK(all_finite16(R.h_mid));
    }
  }
}

TEST_CASE("values: one NaN weight poisons exactly what the contract says (nan_weight w_o, s_o, g_post, w_gate)") {
  REQUIRE_K4();
  const std::string ctx = R"("tokens": 2, "context": [500])";
  SUBCASE("w_o: rank 0's o_proj row 5 NaN (block-exact), a / h_mid row 5 NaN; the router's rows NaN, picks 0..3") {
    auto m = make("{" + ctx + R"(, "inject": {"nan_weight": "w_o"}})");
    const Config& c = m->cfg;
    const size_t H = size_t(c.hidden);
    CHECK(m->g->weights().ranks[0].w_o[size_t(5) * c.o_k() + 9] == 0x7F);
    for (int k = 0; k < 2; ++k) {
      const std::vector<uint16_t> p0 = row_of(m->res.ranks[0].oproj.partial, size_t(k), H);
      CHECK(nan16(p0[5]));
      CHECK(count_if(p0, [](uint16_t b) { return !finite16(b); }) == 1);
      CHECK(all_finite16(row_of(m->res.ranks[1].oproj.partial, size_t(k), H)));
      for (const RankResult& R : m->res.ranks) {
        CHECK(count_if(row_of(R.h_mid, size_t(k), H), [](uint16_t b) { return !finite16(b); }) == 1);
        CHECK(std::isnan(R.router.rstd[size_t(k)]));
        CHECK(picks(R, k, c) == std::set<int>{0, 1, 2, 3});
      }
    }
  }
  SUBCASE("s_o: row 5 NaN on every rank's partial, the rest finite") {
    auto m = make("{" + ctx + R"(, "inject": {"nan_weight": "s_o"}})");
    const size_t H = size_t(m->cfg.hidden);
    for (const RankResult& R : m->res.ranks)
      for (int k = 0; k < 2; ++k) {
        const std::vector<uint16_t> p = row_of(R.oproj.partial, size_t(k), H);
        CHECK(nan16(p[5]));
        CHECK(count_if(p, [](uint16_t b) { return !finite16(b); }) == 1);
      }
  }
  SUBCASE("g_post: xn element 9 NaN, rstd finite; its MXFP8 block: NaN -> 0x7F, the finite rest -> +-0, scale 254") {
    auto m = make("{" + ctx + R"(, "inject": {"nan_weight": "g_post"}})");
    const Config& c = m->cfg;
    const size_t H = size_t(c.hidden);
    for (const RankResult& R : m->res.ranks) {
      CHECK(all_finite16(R.oproj.partial));
      for (int k = 0; k < 2; ++k) {
        CHECK(finite32(R.router.rstd[size_t(k)]));
        const std::vector<uint16_t> xn = row_of(R.router.xn, size_t(k), H);
        CHECK(nan16(xn[9]));
        CHECK(count_if(xn, [](uint16_t b) { return !finite16(b); }) == 1);
        CHECK(R.router.xsc[size_t(k) * (H / 32)] == 254);
        for (int i = 0; i < 32; ++i) {
          const uint8_t q = R.router.xn8[size_t(k) * H + size_t(i)];
          if (i == 9) CHECK(q == 0x7F);
          else CHECK((q == 0x00 || q == 0x80));
        }
        CHECK(R.router.xsc[size_t(k) * (H / 32) + 1] != 254);  // the next block is untouched
        CHECK(picks(R, k, c) == std::set<int>{0, 1, 2, 3});
      }
    }
  }
  SUBCASE("w_gate: expert 2's logit NaN for every token: its key is -NaN's (the seed negates the logit), never picked") {
    auto m = make("{" + ctx + R"(, "inject": {"nan_weight": "w_gate"}})");
    const Config& c = m->cfg;
    for (const RankResult& R : m->res.ranks)
      for (int k = 0; k < 2; ++k) {
        for (int e = 0; e < c.n_routed; ++e) CHECK(std::isnan(R.router.logit[size_t(k) * c.n_routed + e]) == (e == 2));
        CHECK(std::isnan(R.router.sig[size_t(k) * c.n_routed + 2]));
        CHECK(R.router.key[size_t(k) * c.n_routed + 2] == route_key(-std::numeric_limits<float>::infinity(), 2) - 0x400000);
        for (int s = 0; s < c.top_k; ++s) {
          CHECK(R.route.ids[size_t(k) * c.moe_slots() + s] != 2);
          CHECK(!std::isnan(R.route.weights[size_t(k) * c.moe_slots() + s]));  // the picks' sigs are numbers
        }
        CHECK(R.route.weights[size_t(k) * c.moe_slots() + c.top_k] == c.shared_weight);
      }
  }
}

// ================================================================== all-zero rows

TEST_CASE("values: all-zero q, h_in and score rows (zero_rows): q8 zero, ties to the higher ids, h_mid = a, attention not zero") {
  REQUIRE_K4();
  auto m = make(R"({"tokens": 4, "context": [3000], "inject": {"zero_rows": [1]}})");
  const Config& c = m->cfg;
  const size_t H = size_t(c.hidden), OK = size_t(c.o_k());
  const StepShared& sh = m->in.shared;
  CHECK(!any_nonzero(row_of(sh.h_in, 1, H)));
  for (const StepRank& I : m->in.ranks) CHECK(!any_nonzero(row_of(I.index_scores, 1, size_t(sh.score_width))));
  const int n_blk = (sh.seq_lens[1] + c.sparse_block - 1) / c.sparse_block;
  for (int r = 0; r < c.tp; ++r) {
    const RankResult& R = m->res.ranks[size_t(r)];
    CHECK(!any_nonzero(row_of(m->in.ranks[size_t(r)].q, 1, OK)));
    CHECK(!any_nonzero(row_of(R.split.q8, 1, OK)));
    // equal keys: ties go to the higher block id (R0.5): the top 16 ids
    std::vector<int32_t> b = row_of(R.index.blocks, 1, size_t(c.topk_blocks));
    std::sort(b.begin(), b.end());
    for (int s = 0; s < c.topk_blocks; ++s) CHECK(b[size_t(s)] == n_blk - c.topk_blocks + s);
    CHECK(any_nonzero(row_of(R.merge.attn, 1, OK)));  // scores 0: uniform weights over V, not zero
    CHECK(row_of(R.h_mid, 1, H) == row_of(R.a, 1, H));  // bf16(a + 0) = a
    CHECK(all_finite16(row_of(R.ar_out, 1, H)));
    CHECK(any_nonzero(row_of(R.ar_out, 1, H)));
  }
}

TEST_CASE("values: a NaN K and a NaN V code at keys a row reads (nan_kv_rows): that token is NaN, no other row changes") {
  REQUIRE_K4();
  // rows 0..3 four requests of one row; row 1 reads the NaN codes
  auto m = make(R"({"tokens": 4, "context": [700, 300, 1000, 50], "inject": {"nan_kv_rows": [1]}})");
  const Config& c = m->cfg;
  const size_t H = size_t(c.hidden), OK = size_t(c.o_k());
  auto nan16 = [](uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0; };
  for (int r = 0; r < c.tp; ++r) {
    const StepRank& I = m->in.ranks[size_t(r)];
    CHECK(count_if(I.k_cache, [](uint8_t b) { return b == 0x7F; }) >= 1);
    CHECK(count_if(I.v_cache, [](uint8_t b) { return b == 0xFF; }) >= 1);
    const RankResult& R = m->res.ranks[size_t(r)];
    const std::vector<uint16_t> a1 = row_of(R.merge.attn, 1, OK);
    CHECK(std::all_of(a1.begin(), a1.end(), nan16));  // every head of row 1
    const std::vector<uint16_t> h1 = row_of(R.ar_out, 1, H);
    CHECK(std::any_of(h1.begin(), h1.end(), nan16));
    for (int k : {0, 2, 3}) {
      CAPTURE(k);
      CHECK(all_finite16(row_of(R.merge.attn, size_t(k), OK)));
      CHECK(all_finite16(row_of(R.ar_out, size_t(k), H)));
    }
  }
  // the other rows are bit for bit the golden of the same scenario without the NaN codes
  // (a golden, not run_step on its weights: the clean row 1 routes to experts m's golden lacks)
  auto plain = make(R"({"tokens": 4, "context": [700, 300, 1000, 50]})");
  for (int r = 0; r < c.tp; ++r) {
    const RankResult &a = plain->res.ranks[size_t(r)], &b = m->res.ranks[size_t(r)];
    CHECK(all_finite16(row_of(a.merge.attn, 1, OK)));  // the clean step's row 1 is finite
    for (int k : {0, 2, 3}) {
      CAPTURE(k);
      CHECK(row_of(a.merge.attn, size_t(k), OK) == row_of(b.merge.attn, size_t(k), OK));
      CHECK(row_of(a.ar_out, size_t(k), H) == row_of(b.ar_out, size_t(k), H));
    }
  }
  // a row without two keys to plant them in is refused
  TempDir t("values");
  std::ofstream(t.path("s.json")) << R"({"tokens": 2, "context": [1, 300], "inject": {"nan_kv_rows": [0]}})";
  const cli::Run bad = cli::run(t, "golden --preset tiny --scenario " + t.path("s.json") + " --out " + t.path("g.h5"));
  CHECK(bad.rc == 2);
  CHECK(bad.err.find("nan_kv_row 0 reads 1 keys; it needs 2") != std::string::npos);
  std::ofstream(t.path("s2.json")) << R"({"tokens": 2, "inject": {"nan_kv_rows": [2]}})";
  const cli::Run bad2 = cli::run(t, "golden --preset tiny --scenario " + t.path("s2.json") + " --out " + t.path("g.h5"));
  CHECK(bad2.rc == 2);
  CHECK(bad2.err.find(": nan_kv_row 2 is outside 0..1") != std::string::npos);
  CHECK(t.entries().size() == 2);  // the two scenario files: no golden, no temporary
}

TEST_CASE("values: rows whose attention is all zero (zero_attn_rows): attn, attn8, x_scale, o_proj rows +0; h_mid = h_in") {
  REQUIRE_K4();
  auto m = make(R"({"tokens": 3, "context": [600], "inject": {"zero_attn_rows": [2]}})");
  const Config& c = m->cfg;
  const size_t H = size_t(c.hidden), OK = size_t(c.o_k());
  for (int r = 0; r < c.tp; ++r) {
    const RankResult& R = m->res.ranks[size_t(r)];
    CHECK(count_if(m->in.ranks[size_t(r)].v_scale, [](float f) { return f == 0.0f; }) >= 600);
    CHECK(!any_nonzero(row_of(R.merge.attn, 2, OK)));  // +0 bits
    CHECK(!any_nonzero(row_of(R.merge.attn8, 2, OK)));
    CHECK(f32_bits(R.merge.x_scale[2]) == 0u);
    CHECK(!any_nonzero(row_of(R.oproj.partial, 2, H)));
    CHECK(!any_nonzero(row_of(R.a, 2, H)));
    CHECK(row_of(R.h_mid, 2, H) == row_of(m->in.shared.h_in, 2, H));
    CHECK(any_nonzero(row_of(R.merge.attn, 0, OK)));  // the other rows are not
    CHECK(all_finite16(row_of(R.ar_out, 2, H)));
    CHECK(any_nonzero(row_of(R.ar_out, 2, H)));
  }
}

TEST_CASE("values: the special-value keys round trip through the scenario JSON, and are absent when unset") {
  const Scenario s = scenario_from_json(
      R"({"tokens": 4, "inject": {"special_q": true, "special_h_in": true, "special_kv": true, "special_weights": true,
          "nan_weight": "g_post", "zero_attn_rows": [1, 3]}})",
      "t.json");
  CHECK(s.inject.special_q);
  CHECK(s.inject.special_weights);
  CHECK(s.inject.nan_weight == "g_post");
  CHECK(s.inject.zero_attn_rows == std::vector<int>{1, 3});
  const std::string j = scenario_to_json(s);
  CHECK(scenario_to_json(scenario_from_json(j, "again")) == j);
  CHECK(j.find("\"zero_attn_rows\":[1,3]") != std::string::npos);
  const std::string plain = scenario_to_json(Scenario{});
  for (const char* k : {"special_q", "special_h_in", "special_kv", "special_weights", "nan_weight", "zero_attn_rows"})
    CHECK(plain.find(k) == std::string::npos);
}

TEST_CASE("values: the CLI flags make the same golden as the scenario keys") {
  REQUIRE_K4();
  TempDir t("values");
  std::ofstream(t.path("s.json")) << R"({"tokens": 2, "context": [300], "inject": {"special_q": true, "special_kv": true,
      "special_weights": true, "zero_attn_rows": [1]}})";
  REQUIRE(cli::run(t, "golden --preset tiny --tp 2 --scenario " + t.path("s.json") + " --out " + t.path("a.h5")).rc == 0);
  REQUIRE(cli::run(t, "golden --preset tiny --tp 2 --tokens 2 --context 300 --special-q --special-kv --special-weights "
                      "--zero-attn-rows 1 --out " + t.path("b.h5")).rc == 0);
  golden::GoldenReader a(t.path("a.h5")), b(t.path("b.h5"));
  for (int r = 0; r < 2; ++r) {
    CHECK(a.rank_result(r).ar_out == b.rank_result(r).ar_out);
    CHECK(a.rank_result(r).split.o == b.rank_result(r).split.o);
  }
}

// ================================================================== route ids clamped to E_TOP

TEST_CASE("values: route ids past n_routed are clamped to E_TOP (the shared expert) where weights are addressed") {
  // Unreachable from any input: route_key's low 7 bits are 127 - e of a real expert e, so
  // route_top4 only picks ids < n_routed. Crafted keys (as a kernel's dump may hold them)
  // reach the clamp: the model then reads expert min(id, E_TOP) and sig[min(id, n_routed - 1)].
  const Config cfg = preset("tiny", 2);
  Scenario s;
  s.tokens = 1;
  const LayerWeights w = synth::synthetic_layer(cfg, 3);
  const StepInputs in = make_inputs(cfg, s, 5, &w);
  const StepResult res = run_step(w, in);
  RouterOut r = res.ranks[0].router;
  std::fill(r.key.begin(), r.key.end(), INT32_MIN);
  r.key[0] = 0x40000000 | (127 - 100);  // the max key says expert 100; the other rounds find INT32_MIN: 127
  RouteOut route;
  route_top4(route, r, 1, cfg);
  CHECK(route.ids[0] == 100);
  for (int p = 1; p < 4; ++p) CHECK(route.ids[size_t(p)] == 127);
  // every pick weighs sig[n_routed - 1] (the clamped index): four equal, finite weights
  for (int p = 0; p < 4; ++p) {
    CHECK(f32_bits(route.weights[size_t(p)]) == f32_bits(route.weights[0]));
    CHECK(finite32(route.weights[size_t(p)]));
  }
  MoeOut out;
  experts_up_gate(out, route, r, *w.experts, 0, 1, cfg);
  experts_down(out, route, *w.experts, 0, 1, cfg);
  const size_t I = size_t(cfg.inter);
  for (int p = 0; p < 4; ++p)  // every routed slot reads the shared expert (E_TOP): its gate / up bits
    for (size_t i = 0; i < I; ++i) {
      CHECK(f32_bits(out.gate[size_t(p) * I + i]) == f32_bits(out.gate[size_t(cfg.top_k) * I + i]));
      CHECK(f32_bits(out.up[size_t(p) * I + i]) == f32_bits(out.up[size_t(cfg.top_k) * I + i]));
    }
  CHECK(all_finite16(out.partial));
}

TEST_CASE("values: k4 replay of a dump whose route keys encode ids past n_routed: a verdict, no crash") {
  REQUIRE_K4();
  TempDir t("values");
  const std::string g = t.path("g.h5"), d = t.path("d.h5");
  REQUIRE(cli::run(t, "golden --preset tiny --tp 2 --tokens 2 --context 400 --out " + g).rc == 0);
  golden::GoldenReader gr(g);
  StepResult res = gr.result();
  for (RankResult& R : res.ranks) {
    std::fill(R.router.key.begin(), R.router.key.begin() + gr.config().n_routed, INT32_MIN);
    R.router.key[0] = 0x40000000 | (127 - 100);
  }
  golden::write_dump(d, gr.config(), gr.tokens(), res, {}, false);
  const cli::Run r = cli::run(t, "replay " + g + " " + d);
  CAPTURE(r.err);
  CHECK(r.signal == 0);
  CHECK(r.rc == 1);
  CHECK(r.out.find("router") != std::string::npos);
}

}  // TEST_SUITE values
