// test_variant.cpp -- the variant framework (reference/variant.hpp): the switch table, the
// presets of VARIANTS.md §1, the spec syntax and its canonical name, the refusal of values
// not modelled yet, the config JSON round trip, and the k4 command: --variant, the golden's
// variant attribute, k4 inspect, and k4 diff refusing goldens of different variants.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "golden/format/schema.hpp"
#include "reference/config.hpp"
#include "reference/model.hpp"
#include "reference/numerics/bf16.hpp"
#include "tests/cpu/float64_model.hpp"
#include "reference/variant.hpp"
#include "tests/cpu/cli_run.hpp"
#include "tests/cpu/fixtures.hpp"

using namespace k4;

TEST_SUITE("variant") {

TEST_CASE("the switch table: names unique, the seed's value first and modelled, get / set agree") {
  std::set<std::string> names;
  for (const VariantSwitch& s : variant_switches()) {
    CAPTURE(s.name);
    CHECK(names.insert(s.name).second);
    REQUIRE(s.values.size() >= 2);
    REQUIRE(s.modelled.size() == s.values.size());
    CHECK(s.modelled[0]);
    CHECK(s.get(Variant{}) == 0);  // the default Variant is the seed
    for (size_t i = 0; i < s.values.size(); ++i) {
      Variant v;
      set_switch(v, s, s.values[i]);
      CHECK(s.get(v) == int(i));
      CHECK(switch_value(v, s) == s.values[i]);
      // one switch changes one switch
      for (const VariantSwitch& o : variant_switches())
        if (std::string(o.name) != s.name) CHECK(o.get(v) == 0);
      CHECK((v == Variant{}) == (i == 0));
    }
  }
  CHECK(names == std::set<std::string>{"router.gate", "router.round_logit", "moe.wide_live_rows", "moe.wide_down_order",
                                       "split.kv_scale", "moe.narrow_final", "moe.shared_fp8", "index.cp", "moe.experts"});
}

TEST_CASE("presets are VARIANTS.md §1's sets") {
  CHECK(variant_preset("seed") == Variant{});
  CHECK(variant_diff(Variant{}, variant_preset("vllm-mono")) == std::vector<std::string>{"split.kv_scale=static448"});
  CHECK(variant_diff(Variant{}, variant_preset("aiter")) ==
        std::vector<std::string>{"router.gate=f32", "router.round_logit=false", "moe.wide_live_rows=exclude_pad"});
  CHECK(variant_diff(Variant{}, variant_preset("atom")) ==
        std::vector<std::string>{"moe.wide_live_rows=exclude_pad", "moe.wide_down_order=per_expert", "moe.narrow_final=split"});
  CHECK_THROWS_WITH_AS(variant_preset("sglang"), "unknown variant preset 'sglang' (known: seed, vllm-mono, aiter, atom)",
                       std::invalid_argument);
}

TEST_CASE("spec syntax: presets and switches left to right; the canonical name parses back") {
  CHECK(parse_variant("seed") == Variant{});
  Variant v = parse_variant("atom,router.round_logit=false");
  CHECK(v.wide_down_order == WideDownOrder::per_expert);
  CHECK(!v.round_logit);
  CHECK(variant_name(v) == "atom,router.round_logit=false");
  CHECK(parse_variant("router.gate=f32,seed") == Variant{});  // a preset resets
  CHECK(variant_name(parse_variant("router.gate=f32,router.round_logit=false,moe.wide_live_rows=exclude_pad")) == "aiter");
  // the nearest preset, earlier ones first on a tie
  CHECK(variant_name(parse_variant("moe.wide_live_rows=exclude_pad")) == "seed,moe.wide_live_rows=exclude_pad");
  CHECK(variant_name(parse_variant("aiter,moe.wide_live_rows=all")) == "aiter,moe.wide_live_rows=all");
  for (const std::string& p : variant_preset_names()) {
    CHECK(variant_name(variant_preset(p)) == p);
    for (const VariantSwitch& s : variant_switches())
      for (const char* val : s.values) {
        Variant x = variant_preset(p);
        set_switch(x, s, val);
        CAPTURE(variant_name(x));
        CHECK(parse_variant(variant_name(x)) == x);
      }
  }
  CHECK_THROWS_WITH_AS(parse_variant(""), "variant '': expected a preset or SWITCH=VALUE items", std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_variant("aiter,"), "variant 'aiter,': an empty item", std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_variant("router.gate=fp16"),
                       "variant 'router.gate=fp16': variant switch router.gate: unknown value 'fp16' (values: bf16, f32)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_variant("moe.order=flat"), doctest::Contains("unknown variant switch 'moe.order' (known: router.gate,"),
                       std::invalid_argument);
}

TEST_CASE("a value declared but not modelled is refused by name; Config::validate refuses it too") {
  CHECK_NOTHROW(check_variant(Variant{}));
  for (const VariantSwitch& s : variant_switches())
    for (size_t i = 0; i < s.values.size(); ++i) {
      Variant v;
      s.set(v, int(i));
      const std::string what = std::string(s.name) + " = " + s.values[i];
      CAPTURE(what);
      if (s.modelled[i]) {
        CHECK_NOTHROW(check_variant(v));
      } else {
        CHECK_THROWS_WITH_AS(check_variant(v),
                             doctest::Contains(("declared but not modelled yet: " + what + " (VARIANTS.md " + s.rule + ")").c_str()),
                             std::invalid_argument);
        Config c = preset("tiny");
        c.variant = v;
        CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("config 'tiny': variant "), std::invalid_argument);
      }
    }
}

TEST_CASE("config JSON carries every switch and round-trips each modelled variant") {
  const std::string seed_json = golden::config_to_json(preset("tiny"));
  for (const VariantSwitch& s : variant_switches())
    CHECK(seed_json.find("\"" + std::string(s.name) + "\":\"" + s.values[0] + "\"") != std::string::npos);
  for (const VariantSwitch& s : variant_switches())
    for (size_t i = 0; i < s.values.size(); ++i) {
      if (!s.modelled[i]) continue;
      Config c = preset("tiny");
      s.set(c.variant, int(i));
      const Config back = golden::config_from_json(golden::config_to_json(c), "c");
      CHECK(back.variant == c.variant);
      CHECK(golden::config_to_json(back) == golden::config_to_json(c));
    }
  {  // moe.experts came after the other switches: a variant object without it is mxfp4
    std::string j = golden::config_to_json(preset("tiny"));
    const std::string item = ",\"moe.experts\":\"mxfp4\"";
    REQUIRE(j.find(item) != std::string::npos);
    j.erase(j.find(item), item.size());
    CHECK(golden::config_from_json(j, "c").variant == Variant{});
  }
  CHECK(preset("tiny").one_kv_scale() == false);
  Config c = preset("tiny");
  c.variant.kv_scale = KvScale::scalar;
  CHECK(c.one_kv_scale());
}

// V1 (docs/numerics.md §13): the router's gate variants change stage 4's logits, sigmoids and
// keys (and through them stage 5) and nothing upstream.
TEST_CASE("router.gate = f32 / round_logit = false change the router and nothing upstream") {
  Config c = preset("tiny", 2);
  const LayerWeights w0 = test::random_layer(c, 5);
  const StepInputs in = test::random_step(c, {6, {3000, 900, 0, 5000, 20, 2500}, 1, 8});
  const StepResult seed = run_step(w0, in);
  for (const char* spec : {"router.gate=f32,router.round_logit=false", "router.round_logit=false", "router.gate=f32"}) {
    CAPTURE(spec);
    LayerWeights w = w0;
    w.cfg.variant = parse_variant(spec);
    const StepResult v = run_step(w, in);
    for (int r = 0; r < c.tp; ++r) {
      const RankResult &a = seed.ranks[size_t(r)], &b = v.ranks[size_t(r)];
      CHECK(a.index.sparse_table == b.index.sparse_table);
      CHECK(a.split.o == b.split.o);
      CHECK(a.merge.attn8 == b.merge.attn8);
      CHECK(a.oproj.partial == b.oproj.partial);
      CHECK(a.h_mid == b.h_mid);
      CHECK(a.router.xn == b.router.xn);
      CHECK(a.router.xn8 == b.router.xn8);
      CHECK(a.router.xsc == b.router.xsc);
      CHECK(a.router.rstd == b.router.rstd);
      // the fixture's F32 gate has low bits below the bf16 copy: the logits move under f32,
      // the sigmoids under either switch
      if (w.cfg.variant.router_gate == RouterGate::f32) CHECK(a.router.logit != b.router.logit);
      else CHECK(a.router.logit == b.router.logit);
      CHECK(a.router.sig != b.router.sig);
      CHECK(a.router.key != b.router.key);
    }
  }
}

// Experts 20 and 21 share their weights, 21's down nibbles negated, every down scale 2^12
// higher, and every token routed to both (bias +10): a row sums a large down unit and its
// negative, so the order of the down sum shows in the bf16 partial. (With a plain random layer
// most order changes stay below bf16's rounding: an invariance would pass for the wrong rule.)
class CancellingExperts : public ExpertSource {
 public:
  explicit CancellingExperts(std::shared_ptr<const ExpertSource> b) : b_(std::move(b)) {}
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    auto w = std::make_shared<ExpertWeights>(*b_->expert(rank, e == 21 ? 20 : e));
    if (e == 21)
      for (uint8_t& x : w->w2) x ^= 0x88;  // both nibbles' signs
    for (uint8_t& sc : w->s2) sc = uint8_t(std::min(254, int(sc) + 12));
    return w;
  }

 private:
  std::shared_ptr<const ExpertSource> b_;
};

LayerWeights cancelling_layer(const Config& c, uint64_t seed) {
  LayerWeights w = test::random_layer(c, seed);
  w.experts = std::make_shared<CancellingExperts>(w.experts);
  for (RankWeights& r : w.ranks) r.bias[20] = r.bias[21] = 10.0f;
  return w;
}

// V2 (docs/numerics.md §13): pad rows join no expert of the wide MoE.
TEST_CASE("moe.wide_live_rows = exclude_pad: with no pad rows the seed's bits; a pad row's inputs move no live row") {
  Config c = preset("tiny", 2);
  const LayerWeights w0 = cancelling_layer(c, 6);
  LayerWeights w2 = w0;
  w2.cfg.variant.wide_live_rows = WideRows::exclude_pad;
  // no pad row, narrow and wide steps: bit for bit the seed
  for (int S : {3, 6, 13}) {
    std::vector<int> lens;
    for (int k = 0; k < S; ++k) lens.push_back(200 + 700 * k);
    const StepInputs in = test::random_step(c, {S, lens, 1, uint64_t(S)});
    const std::string d = f64::diff_step(run_step(w0, in), run_step(w2, in));
    CHECK_MESSAGE(d.empty(), "S = " << S << ": " << d);
  }
  // a wide step with a pad row (row 2): its routed slots are no expert's use
  StepInputs in = test::random_step(c, {7, {3000, 900, 0, 5000, 20, 2500, 400}, 1, 9});
  const StepResult a = run_step(w2, in);
  StepInputs in_b = in;
  for (int i = 0; i < c.hidden; ++i) in_b.shared.h_in[size_t(2) * c.hidden + i] ^= uint16_t(0x0100 * (i % 3));  // its residual
  for (StepRank& R : in_b.ranks)
    for (int i = 0; i < c.o_k(); ++i) R.q[size_t(2) * c.o_k() + i] ^= 0x0080;  // its q
  const StepResult b = run_step(w2, in_b);
  const int SL = c.moe_slots(), I = c.inter;
  for (int r = 0; r < c.tp; ++r) {
    const RankResult &A = a.ranks[size_t(r)], &B = b.ranks[size_t(r)];
    CHECK(std::vector<int32_t>(A.route.ids.begin() + 2 * SL, A.route.ids.begin() + 3 * SL) !=
          std::vector<int32_t>(B.route.ids.begin() + 2 * SL, B.route.ids.begin() + 3 * SL));  // its routing moved
    for (int k = 0; k < 7; ++k) {
      if (k == 2) continue;
      CAPTURE(k);
      const size_t H = size_t(c.hidden);
      CHECK(std::equal(A.ar_out.begin() + k * H, A.ar_out.begin() + (k + 1) * H, B.ar_out.begin() + k * H));
      CHECK(std::equal(A.moe.partial.begin() + k * H, A.moe.partial.begin() + (k + 1) * H, B.moe.partial.begin() + k * H));
    }
    // the pad row's routed slots: not computed; its shared slot is
    for (int s = 0; s < SL; ++s) {
      const size_t o = (size_t(2) * SL + s) * I;
      const bool any = std::any_of(A.moe.mid.begin() + o, A.moe.mid.begin() + o + I, [](uint16_t m) { return m != 0; });
      CHECK(any == (s == c.top_k));
    }
  }
  // under the seed's rule a pad row's experts join the union: routed to 0, 1, 2 (below the
  // live rows' 20 and 21), they shift the live experts' ranks, hence their quarters
  {
    const RankResult& A0 = a.ranks[0];
    RouteOut rt = A0.route;
    for (int s = 0; s < c.top_k; ++s) rt.ids[size_t(2) * SL + s] = s < 3 ? s : 31;
    auto partials = [&](const Config& cc, RouteOut route) {
      route.live = live_rows(cc, in.shared.seq_lens);
      MoeOut m;
      experts_up_gate(m, route, A0.router, *w0.experts, 0, 7, cc);
      experts_down(m, route, *w0.experts, 0, 7, cc);
      return m.partial;
    };
    const std::vector<uint16_t> s0 = partials(w0.cfg, A0.route), s1 = partials(w0.cfg, rt);
    const std::vector<uint16_t> v0 = partials(w2.cfg, A0.route), v1 = partials(w2.cfg, rt);
    bool seed_moved = false;
    for (int k = 0; k < 7; ++k) {
      if (k == 2) continue;
      const size_t H = size_t(c.hidden);
      CHECK(std::equal(v0.begin() + k * H, v0.begin() + (k + 1) * H, v1.begin() + k * H));
      seed_moved = seed_moved || !std::equal(s0.begin() + k * H, s0.begin() + (k + 1) * H, s1.begin() + k * H);
    }
    CHECK_MESSAGE(seed_moved, "the seed's union did not move a live row: the case does not tell the rules apart");
  }
}

// V3 (docs/numerics.md §13): ATOM's per-expert wide down. A row's partial depends on its own
// experts only: batch invariant across wide steps whose other rows route elsewhere.
TEST_CASE("moe.wide_down_order = per_expert: a row's partial is the same whatever the other rows route to") {
  Config c = preset("tiny", 1);  // inter 128: one chunk a unit; the flat order puts rank u in quarter u % 4
  const LayerWeights w0 = cancelling_layer(c, 7);
  LayerWeights w3 = w0;
  w3.cfg.variant.wide_down_order = WideDownOrder::per_expert;
  const StepInputs a = test::random_step(c, {6, {3000, 900, 5000, 20, 2500, 400}, 1, 10});
  int seed_moved = 0;
  for (int t = 1; t <= 4; ++t) {
    StepInputs b = a;
    // the other rows' residual scaled and shifted: their routing (and the union) changes
    for (int k = 1; k < 6; ++k)
      for (int i = 0; i < c.hidden; ++i) b.shared.h_in[size_t(k) * c.hidden + i] ^= uint16_t((i * t + k) % 5 == 0 ? 0x8000 : 0);
    const StepResult ra = run_step(w3, a), rb = run_step(w3, b);
    REQUIRE(ra.ranks[0].route.ids != rb.ranks[0].route.ids);
    const size_t H = size_t(c.hidden);
    CAPTURE(t);
    CHECK(std::equal(ra.ranks[0].moe.partial.begin(), ra.ranks[0].moe.partial.begin() + H, rb.ranks[0].moe.partial.begin()));
    const StepResult sa = run_step(w0, a), sb = run_step(w0, b);
    seed_moved += !std::equal(sa.ranks[0].moe.partial.begin(), sa.ranks[0].moe.partial.begin() + H, sb.ranks[0].moe.partial.begin());
  }
  CHECK_MESSAGE(seed_moved > 0, "the seed's flat order never moved row 0: the case does not tell the orders apart");
  // narrow steps are not the wide down: the seed's bits
  const StepInputs n = test::random_step(c, {3, {3000, 900, 5000}, 1, 11});
  CHECK(f64::diff_step(run_step(w0, n), run_step(w3, n)).empty());
}

// V5.1: ATOM's narrow final sum (routed chain + shared chain) against the seed's one chain.
TEST_CASE("moe.narrow_final = split: VARIANTS.md's example, and only narrow steps change") {
  // R0 = 1 + 2^-8, S0 = S1 = 2^-24: one chain drops each 2^-24 (half an ulp, to even), bf16
  // of the tie 0x3F808000 is 0x3F80; split adds 2^-23 to R0: 0x3F808001 -> bf16 0x3F81
  const float r0 = 1.0f + 0x1p-8f, s0 = 0x1p-24f;
  float one = 0.0f;
  for (float x : {r0, 0.0f, 0.0f, 0.0f, s0, s0, 0.0f, 0.0f}) one = one + x;
  const float split = (((0.0f + r0) + 0.0f) + 0.0f + 0.0f) + (((0.0f + s0) + s0) + 0.0f + 0.0f);
  CHECK(bf16_bits_rne(one) == 0x3F80);
  CHECK(bf16_bits_rne(split) == 0x3F81);
  Config c = preset("tiny", 2);
  const LayerWeights w0 = test::random_layer(c, 8);
  LayerWeights w5 = w0;
  w5.cfg.variant.narrow_final = NarrowFinal::split;
  const StepInputs wide = test::random_step(c, {6, {3000, 900, 5000, 20, 2500, 400}, 1, 12});
  CHECK(f64::diff_step(run_step(w0, wide), run_step(w5, wide)).empty());
  // narrow steps: the routing is the seed's; the partials may differ only where the two sums
  // round apart (rare at bf16: the worked example above is the case that shows it)
  const StepInputs nar = test::random_step(c, {4, {3000, 900, 5000, 20}, 1, 3});
  const StepResult na = run_step(w0, nar), nb = run_step(w5, nar);
  CHECK(na.ranks[0].router.key == nb.ranks[0].router.key);
  CHECK(na.ranks[0].moe.mid8 == nb.ranks[0].moe.mid8);
}

TEST_CASE("k4 golden --variant; the golden's variant attribute; inspect shows it; diff refuses another variant") {
  REQUIRE_K4();
  cli::TempDir t("variant");
  const std::string seed = t.path("seed.h5"), scalar = t.path("scalar.h5");
  cli::Run r = cli::run(t, "golden --preset tiny --tp 1 --tokens 2 --context 300 --out " + seed);
  REQUIRE(r.rc == 0);
  r = cli::run(t, "golden --preset tiny --tp 1 --tokens 2 --context 300 --variant split.kv_scale=scalar --out " + scalar);
  REQUIRE(r.rc == 0);
  r = cli::run(t, "inspect " + scalar);
  CHECK(r.rc == 0);
  CHECK(r.out.find("@variant = seed,split.kv_scale=scalar") != std::string::npos);
  CHECK(r.out.find("variant (from the config): seed,split.kv_scale=scalar\n") != std::string::npos);
  r = cli::run(t, "inspect " + seed);
  CHECK(r.out.find("@variant = seed\n") != std::string::npos);
  r = cli::run(t, "diff " + seed + " " + scalar);
  CHECK(r.rc == 2);
  CHECK(r.err.find("it is of variant seed,split.kv_scale=scalar, the golden of variant seed") != std::string::npos);
  r = cli::run(t, "diff " + seed + " " + seed);
  CHECK(r.rc == 0);
  r = cli::run(t, "golden --preset tiny --tokens 2 --context 300 --variant aiter,bogus --out " + t.path("x.h5"));
  CHECK(r.rc == 2);
  CHECK(r.err.find("variant 'aiter,bogus': unknown variant preset 'bogus'") != std::string::npos);
  for (const char* kv : {"vllm-mono", "split.kv_scale=atom_vllm"}) {  // the KV-scale modes (V4) make goldens
    const std::string out = t.path(std::string(kv).substr(0, 4) + ".h5");
    r = cli::run(t, std::string("golden --preset tiny --tp 1 --tokens 2 --context 300 --variant ") + kv + " --out " + out);
    CHECK(r.rc == 0);
    r = cli::run(t, "inspect " + out);
    CHECK(r.out.find(std::string("@variant = ") + (kv[0] == 'v' ? "vllm-mono\n" : "seed,split.kv_scale=atom_vllm\n")) != std::string::npos);
  }
  // index.cp = on (V6.2): a golden at TP 4 whose 300-block row is long (> 288); refused at TP 2
  r = cli::run(t, "golden --preset tiny --tokens 2 --context 38400,1000 --variant index.cp=on --out " + t.path("cp.h5"));
  CHECK(r.rc == 0);
  r = cli::run(t, "golden --preset tiny --tokens 2 --context 38400,1000 --out " + t.path("one.h5"));
  CHECK(r.rc == 0);
  {
    golden::GoldenReader cp(t.path("cp.h5")), one(t.path("one.h5"));
    CHECK(cp.config().variant.index_cp);
    CHECK(cp.rank_result(3).index.long_row == std::vector<uint8_t>{1, 0});
    CHECK(one.rank_result(3).index.long_row == std::vector<uint8_t>{0, 0});
    CHECK(cp.rank_result(3).index.sparse_table == one.rank_result(3).index.sparse_table);  // init_blocks = 0
  }
  r = cli::run(t, "golden --preset tiny --tp 2 --tokens 2 --context 300 --variant index.cp=on --out " + t.path("x.h5"));
  CHECK(r.rc == 2);
  CHECK(r.err.find("index.cp = on (VARIANTS.md V6.2) needs N_SPLIT = 2 TP") != std::string::npos);
  // router.gate = f32: the golden stores the F32 gate; replayed from the golden, the same bits
  const std::string f32g = t.path("f32.h5");
  r = cli::run(t, "golden --preset tiny --tp 2 --tokens 2 --context 3000 --variant router.gate=f32,router.round_logit=false --out " + f32g);
  REQUIRE(r.rc == 0);
  {
    golden::GoldenReader g(f32g);
    CHECK(g.config().variant.router_gate == RouterGate::f32);
    const LayerWeights lw = g.weights();
    REQUIRE(lw.ranks[1].w_gate_f32.size() == size_t(g.config().n_routed) * g.config().hidden);
    const StepResult again = run_step(lw, g.inputs());
    CHECK(again.ranks[1].router.key == g.rank_result(1).router.key);
    CHECK(again.ranks[1].moe.partial == g.rank_result(1).moe.partial);
  }
  r = cli::run(t, "inspect " + f32g + " --no-stats");
  CHECK(r.out.find("/rank0/router/inputs/w_gate_f32") != std::string::npos);
  r = cli::run(t, "inspect " + seed + " --no-stats");
  CHECK(r.out.find("w_gate_f32") == std::string::npos);  // the seed's golden has no F32 gate
  r = cli::run(t, "golden --help");
  CHECK(r.out.find("moe.wide_down_order=flat|per_expert") != std::string::npos);
  CHECK(r.out.find("aiter  = seed,router.gate=f32,router.round_logit=false,moe.wide_live_rows=exclude_pad") != std::string::npos);
}

}  // TEST_SUITE
