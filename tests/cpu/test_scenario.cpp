// test_scenario.cpp -- decode inputs from a seed and a scenario: deterministic, valid for the
// model (validate_inputs) over the context helpers, pad rows, KV variants and injections;
// block tables distinct and inside the cache; memory small for the longest contexts.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "golden/inputs/scenario.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/model.hpp"
#include "reference/numerics/bf16.hpp"

using namespace k4;

namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

Scenario scn(int tokens, std::vector<std::string> ctx, int q_len = 1) {
  Scenario s;
  s.tokens = tokens;
  s.q_len = q_len;
  s.context = std::move(ctx);
  return s;
}

}  // namespace

TEST_SUITE("scenario") {

TEST_CASE("scenario: the same seed gives the same inputs, another seed others") {
  const Config cfg = preset("tiny");
  const Scenario s = scn(4, {"short"});
  const StepInputs a = make_inputs(cfg, s, 5), b = make_inputs(cfg, s, 5), c = make_inputs(cfg, s, 6);
  CHECK(same_bits(a.shared.h_in, b.shared.h_in));
  CHECK(same_bits(a.ranks[3].k_cache, b.ranks[3].k_cache));
  CHECK(same_bits(a.shared.block_table, b.shared.block_table));
  CHECK(!same_bits(a.shared.h_in, c.shared.h_in));
  CHECK(!same_bits(a.ranks[0].q, a.ranks[1].q));  // ranks differ
}

TEST_CASE("scenario: every context helper, q_len, pad rows and KV variant passes validate_inputs") {
  struct V {
    Scenario s;
    const char* what;
  };
  std::vector<V> vs;
  vs.push_back({scn(1, {"1"}), "one key"});
  vs.push_back({scn(16, {"short"}), "16 short"});
  vs.push_back({scn(8, {"medium"}), "medium"});
  vs.push_back({scn(4, {"long"}), "long"});
  vs.push_back({scn(2, {"max"}), "max"});
  vs.push_back({scn(4, {"long"}, 2), "long q_len 2"});
  vs.push_back({scn(6, {"short", "medium", "long"}, 2), "one a request"});
  vs.push_back({scn(3, {"100", "2048", "2049"}), "one a row"});
  {
    Scenario s = scn(5, {"3000"});
    s.pad_rows = {0, 4};
    vs.push_back({s, "pad rows"});
  }
  {
    Scenario s = scn(4, {"5000"});
    s.static_kv_scale = 1;
    s.kv_page_stride = 8;
    vs.push_back({s, "static scales, stride 8"});
  }
  {
    Scenario s = scn(4, {"long"});
    s.cache_blocks = 7;
    vs.push_back({s, "a tiny cache: blocks share pages"});
  }
  for (const V& v : vs) {
    CAPTURE(v.what);
    Config cfg = preset("tiny");
    apply_scenario(v.s, cfg);
    const StepInputs in = make_inputs(cfg, v.s, 1);
    CHECK_NOTHROW(validate_inputs(in, cfg));
    const StepShared& sh = in.shared;
    for (int k = 0; k < sh.tokens; ++k) {
      const int ctx = std::max(sh.seq_lens[k], 1), n_blk = (ctx + cfg.sparse_block - 1) / cfg.sparse_block;
      std::set<int> ids;
      for (int b = 0; b < n_blk; ++b) ids.insert(sh.block_table[size_t(k) * sh.bt_width + b]);
      if (v.s.cache_blocks >= 256 && sh.seq_lens[k] > 0 && n_blk <= 256) CHECK(int(ids.size()) == n_blk);  // distinct
    }
    for (int r : v.s.pad_rows) {
      CHECK(sh.seq_lens[r] == 0);
      for (int b = 0; b < sh.bt_width; ++b) CHECK(sh.block_table[size_t(r) * sh.bt_width + b] == 0);
    }
    // memory stays small whatever the context: the cache is sized to the allocations
    CHECK(in.ranks[0].n_pages <= v.s.cache_blocks * cfg.kv_page_stride);
    CHECK(in.ranks[0].k_scale.size() == (cfg.one_kv_scale() ? 1u : size_t(in.ranks[0].n_pages) * cfg.page));
  }
}

TEST_CASE("scenario: a request's rows are consecutive positions and share their blocks") {
  const Config cfg = preset("tiny");
  const StepInputs in = make_inputs(cfg, scn(4, {"9000"}, 4), 2);
  for (int j = 0; j < 4; ++j) CHECK(in.shared.seq_lens[j] == 9000 - 3 + j);
  for (int b = 0; b < 70; ++b) CHECK(in.shared.block_table[size_t(b)] == in.shared.block_table[size_t(3 * in.shared.bt_width + b)]);
}

TEST_CASE("scenario injections land where they say") {
  const Config cfg = preset("tiny");
  Scenario s = scn(4, {"3000"});
  s.inject.nan_scores = 2;
  s.inject.inf_scores = 2;
  s.inject.neg_zero_scores = 1;
  s.inject.zero_rows = {2};
  s.inject.extreme_q = true;
  const StepInputs in = make_inputs(cfg, s, 3);
  const StepShared& sh = in.shared;
  int nan = 0, inf = 0, negz = 0;
  for (int k = 0; k < 4; ++k)
    for (int b = 0; b < 24; ++b) {
      const float v = in.ranks[0].index_scores[size_t(k) * sh.score_width + b];
      nan += std::isnan(v);
      inf += std::isinf(v);
      negz += (v == 0.0f && std::signbit(v));
    }
  CHECK(nan >= 3);
  CHECK(inf >= 3);
  CHECK(negz >= 1);
  int nonzero = 0;
  for (int i = 0; i < cfg.hidden; ++i) nonzero += sh.h_in[size_t(2) * cfg.hidden + i] != 0;
  CHECK(nonzero == 0);
  int big = 0;
  for (uint16_t q : in.ranks[0].q) big += std::fabs(bf16_to_f32(q)) >= 448.0f;
  CHECK(big > 0);
  CHECK_NOTHROW(validate_inputs(in, cfg));
}

TEST_CASE("scenario repeated_expert: every token routes to the chosen expert") {
  Config cfg = preset("tiny");
  const LayerWeights w = synth::synthetic_layer(cfg, 4);
  Scenario s = scn(6, {"700"});
  s.inject.repeated_expert = 11;
  const StepInputs in = make_inputs(cfg, s, 8, &w);
  const StepResult res = run_step(w, in);
  for (int k = 0; k < 6; ++k) {
    bool found = false;
    for (int j = 0; j < cfg.top_k; ++j) found = found || res.ranks[0].route.ids[size_t(k) * cfg.moe_slots() + j] == 11;
    CHECK(found);
  }
}

TEST_CASE("scenario JSON: round trip, unknown keys and bad values named") {
  const std::string j =
      R"({"tokens": 6, "q_len": 2, "context": [100, "long", "short"], "pad_rows": [1], "kv_page_stride": 8,
          "inject": {"score_ties": true, "repeated_expert": true, "zero_rows": [0]}})";
  const Scenario s = scenario_from_json(j, "t.json");
  CHECK(s.tokens == 6);
  CHECK(s.context == std::vector<std::string>{"100", "long", "short"});
  CHECK(s.inject.repeated_expert == -2);
  CHECK(s.kv_page_stride == 8);
  const Scenario s2 = scenario_from_json(scenario_to_json(s), "again");
  CHECK(scenario_to_json(s2) == scenario_to_json(s));
  CHECK_THROWS_WITH_AS(scenario_from_json(R"({"tokenz": 3})", "t.json"), "t.json: unknown key 'tokenz'", std::invalid_argument);
  CHECK_THROWS_WITH_AS(scenario_from_json(R"({"inject": {"nan": 1}})", "t.json"),
                       "t.json: unknown inject key 'nan'", std::invalid_argument);
  CHECK_THROWS_WITH_AS(scenario_from_json("{", "t.json"), doctest::Contains("t.json: not valid JSON"), std::invalid_argument);
  const Config cfg = preset("tiny");
  CHECK_THROWS_WITH_AS(validate_scenario(scn(17, {"1"}), cfg), doctest::Contains("tokens 17 is outside 1..16"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(validate_scenario(scn(4, {"1"}, 3), cfg), doctest::Contains("q_len 3 must divide tokens 4"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(validate_scenario(scn(4, {"huge"}), cfg), doctest::Contains("context 'huge'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(validate_scenario(scn(4, {"1", "2"}), cfg), doctest::Contains("context has 2 entries"),
                       std::invalid_argument);
}

TEST_CASE("scenario keys: one table for the JSON and the command line") {
  // A default scenario's JSON is what the goldens of main hold (the keys written only when
  // set stay out of it).
  CHECK(scenario_to_json(Scenario{}) ==
        "{\"tokens\":1,\"q_len\":1,\"context\":[\"short\"],\"pad_rows\":[],\"cache_blocks\":256,\"rank_scores\":\"own\","
        "\"inject\":{\"score_ties\""
        ":false,\"nan_scores\":0,\"neg_zero_scores\":0,\"inf_scores\":0,\"repeated_expert\":false,\"extreme_q\":false,"
        "\"huge_residual\":false,\"extreme_kv\":false,\"zero_rows\":[]}}");
  // Every key set away from its default is written, read back and written the same; each
  // flag is a distinct option.
  Scenario s;
  std::set<std::string> flags, keys;
  for (const ScenarioKey& k : scenario_keys()) {
    CHECK(flags.insert(k.flag).second);
    CHECK(keys.insert(k.key).second);
    const ScenarioField f = k.field(s);
    switch (k.kind) {
      case KeyKind::Int: *std::get<int*>(f) = 3; break;
      case KeyKind::OptInt: *std::get<int*>(f) = 16; break;
      case KeyKind::Flag: *std::get<bool*>(f) = true; break;
      case KeyKind::ConfigFlag: *std::get<int*>(f) = 1; break;
      case KeyKind::Rows: *std::get<std::vector<int>*>(f) = {1}; break;
      case KeyKind::Contexts: *std::get<std::vector<std::string>*>(f) = {"long", "300"}; break;
      case KeyKind::Text: *std::get<std::string*>(f) = k.key == std::string("rank_scores") ? "shared" : "w_o"; break;
      case KeyKind::Expert: *std::get<int*>(f) = 5; break;
    }
  }
  CHECK(scenario_keys().size() == 24);
  const std::string js = scenario_to_json(s);
  for (const std::string& k : keys) CHECK_MESSAGE(js.find("\"" + k + "\":") != std::string::npos, k);
  CHECK(scenario_to_json(scenario_from_json(js, "test")) == js);
  // the text forms of the command line
  Scenario t;
  const auto key = [](const char* name) -> const ScenarioKey& {
    for (const ScenarioKey& k : scenario_keys())
      if (std::string(k.key) == name) return k;
    throw std::logic_error(name);
  };
  set_key_from_text(t, key("repeated_expert"), "any");
  CHECK(t.inject.repeated_expert == -2);
  set_key_from_text(t, key("repeated_expert"), "7");
  CHECK(t.inject.repeated_expert == 7);
  set_key_from_text(t, key("zero_attn_rows"), "0,2");
  CHECK(t.inject.zero_attn_rows == std::vector<int>{0, 2});
  set_key_from_text(t, key("context"), "short,4000");
  CHECK(t.context == std::vector<std::string>{"short", "4000"});
  CHECK_THROWS_WITH_AS(set_key_from_text(t, key("pad_rows"), "1,x"), "--pad-rows: 'x' is not an integer", std::invalid_argument);
  CHECK_THROWS_WITH_AS(set_key_from_text(t, key("repeated_expert"), "1,2"), "--repeated-expert: '1,2' is not one integer",
                       std::invalid_argument);
}

}  // TEST_SUITE scenario
