// test_golden_run_gpu.cpp -- k4_device run's path on the GPU: a golden made here by the
// reference (the synthetic layer, a scenario) -> its inputs and stored weights through every
// stage on the device (gpu::run_golden) -> a dump -> golden::diff_files: every tensor of every
// stage and rank compared, none differing. The scenarios cover what the random sweep does
// not: kv_page_stride 8, one static K / V scale a cache, the selected-pages KV form, and the
// injections (NaN / Inf / -0 scores, extreme q / KV / residual, zero rows, one expert
// for every token, and the special values: NaN / Inf / -0 in q, h_in, the KV caches and
// scales and the weights, a NaN weight, NaN K / V codes a row reads, all-zero attention, a wide
// step's NaN s2 scales meeting other tokens' zero mid rows). A bit flipped in the dump afterwards must be found at its stage.
//
//   k4_gpu_tests -ts=gpu_golden
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "device/tools/golden_run.hpp"
#include "golden/diff/compare.hpp"
#include "golden/io/hdf5.hpp"
#include "golden/inputs/scenario.hpp"
#include "golden/format/schema.hpp"
#include "golden/format/weights_file.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/model.hpp"

namespace fs = std::filesystem;

namespace {

using namespace k4;

struct GoldenCase {
  const char* name;
  const char* preset;
  int tp;
  Scenario scn;
  const char* kv_form = "auto";
  const char* variant = "";  // a variant spec (reference/variant.hpp); empty: the scenario's
  int init_blocks = -1;      // -1: the preset's
};

std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> v;
  auto add = [&](const char* name, const char* preset, int tp, int S, std::vector<std::string> ctx) -> Scenario& {
    GoldenCase c{name, preset, tp, Scenario{}};
    c.scn.tokens = S;
    c.scn.context.clear();
    for (int k = 0; ctx.size() > 1 && k < S; ++k) c.scn.context.push_back(ctx[size_t(k) % ctx.size()]);  // one a row
    if (ctx.size() == 1) c.scn.context = ctx;
    v.push_back(c);
    return v.back().scn;
  };
  add("mixed contexts", "tiny", 2, 5, {"long", "short", "0", "medium", "2000"});
  add("kv_page_stride 8", "tiny", 2, 6, {"long", "short", "medium"}).kv_page_stride = 8;
  add("static kv scale", "tiny", 4, 16, {"long", "medium", "short", "0"}).static_kv_scale = 1;
  {
    Scenario& s = add("stride 8 + static scale, q_len 4", "small", 2, 8, {"long"});
    s.kv_page_stride = 8, s.static_kv_scale = 1, s.q_len = 4;
  }
  {
    Scenario& s = add("special scores", "tiny", 2, 7, {"long", "medium", "short"});
    s.inject.score_ties = true, s.inject.nan_scores = 3, s.inject.neg_zero_scores = 2, s.inject.inf_scores = 2;
  }
  {
    Scenario& s = add("extreme q, kv, residual; zero rows", "tiny", 1, 9, {"long", "short"});
    s.inject.extreme_q = true, s.inject.extreme_kv = true, s.inject.huge_residual = true, s.inject.zero_rows = {2, 5};
  }
  add("one expert for every token", "tiny", 2, 12, {"medium"}).inject.repeated_expert = 3;
  {  // the special-value scenarios of docs/reliability.md, "Values the model defines"
    Scenario& s = add("special q, h_in, kv; zero attention row", "tiny", 2, 6, {"long", "short", "medium"});
    s.inject.special_q = true, s.inject.special_h_in = true, s.inject.special_kv = true, s.inject.zero_attn_rows = {4};
  }
  add("special weights", "tiny", 2, 4, {"short", "medium"}).inject.special_weights = true;
  add("a NaN in w_o", "tiny", 2, 3, {"short"}).inject.nan_weight = "w_o";
  add("a NaN in w_gate", "tiny", 1, 3, {"medium"}).inject.nan_weight = "w_gate";
  add("NaN K and V codes a row reads", "tiny", 2, 4, {"short", "long", "medium", "short"}).inject.nan_kv_rows = {1};
  add("every rank selects a different set", "tiny", 4, 5, {"medium", "long", "2500"}).rank_scores = "distinct";
  add("router.gate f32, logits unrounded (V1)", "tiny", 2, 6, {"medium", "short", "long"});
  v.back().variant = "router.gate=f32,router.round_logit=false";
  add("logits unrounded (V1b)", "tiny", 2, 3, {"medium"});
  v.back().variant = "router.round_logit=false";
  {
    Scenario& sc = add("aiter: F32 gate, pad rows out of the wide MoE (V1, V2)", "tiny", 2, 8, {"medium", "0", "long", "short"});
    sc.pad_rows = {1, 5};
    v.back().variant = "aiter";
  }
  {
    Scenario& sc = add("atom: per-expert wide down, narrow final split, pad rows out (V2, V3, V5.1)", "small", 2, 9, {"medium", "0", "short"});
    sc.pad_rows = {4};
    v.back().variant = "atom";
  }
  add("atom narrow step (V5.1)", "tiny", 2, 4, {"medium", "short"});
  v.back().variant = "atom";
  v.push_back(v[0]);
  v.back().name = "selected KV form";
  v.back().kv_form = "selected";
  add("vLLM static KV path (static448)", "tiny", 2, 6, {"long", "short", "0", "medium"});
  v.back().variant = "split.kv_scale=static448";
  add("ATOM vllm cache split (atom_vllm)", "tiny", 2, 7, {"long", "short", "medium", "0", "2000"});
  v.back().variant = "split.kv_scale=atom_vllm";
  add("MXFP8 experts, narrow", "tiny", 2, 4, {"long", "short", "medium"});
  v.back().variant = "moe.experts=mxfp8";
  add("MXFP8 experts, wide", "small", 2, 9, {"long", "short", "medium"});
  v.back().variant = "moe.experts=mxfp8";
  add("MXFP8 shared expert (shared_fp8), wide", "tiny", 2, 8, {"long", "short", "medium"});
  v.back().variant = "moe.shared_fp8=on";
  // V6.2 indexer context parallelism at TP 4: 287 / 288 blocks short, 289 and more long
  add("index.cp: 287 .. 2000 blocks (V6.2)", "tiny", 4, 6, {"36736", "36864", "36865", "38400", "256000", "0"});
  v.back().variant = "index.cp=on";
  add("index.cp, init_blocks 2, q_len 2 (V6.2)", "tiny", 4, 6, {"36864", "36865", "36000", "36864", "100000", "100001"});
  v.back().scn.q_len = 2;
  v.back().variant = "index.cp=on", v.back().init_blocks = 2;
  add("full preset TP4 S=16 long", "minimax-m3-tp4", 4, 16, {"long"});
  // R5.14: a wide step in which each distinct expert's NaN s2 scale meets the zero mid rows of
  // the tokens not routed to it (those rows NaN for every token; kernel mutant 67 gives +0)
  add("wide step: NaN s2 scales meet zero rows", "tiny", 2, 6, {"long", "short", "medium"}).inject.nan_weight = "s2";
  return v;
}

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() / ("k4_gpu_golden_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string path(const std::string& n) const { return (dir / n).string(); }
};

// weights_file: non-empty gives a golden of `k4 golden --weights-file` (written there first
// when absent): its w_o and expert tables are virtual datasets over that file.
std::string make_golden(const GoldenCase& c, const std::string& path, uint64_t seed, const std::string& weights_file = "") {
  Config cfg = preset(c.preset, c.tp);
  apply_scenario(c.scn, cfg);
  if (*c.variant) cfg.variant = parse_variant(c.variant);
  if (c.init_blocks >= 0) cfg.init_blocks = c.init_blocks;
  validate_scenario(c.scn, cfg);
  const LayerWeights w = synth::synthetic_layer(cfg, seed);
  const StepInputs in = make_inputs(cfg, c.scn, seed, &w);
  const StepResult res = run_step(w, in);
  golden::GoldenMeta meta;
  meta.scenario_json = scenario_to_json(c.scn);
  meta.weight_seed = seed, meta.input_seed = seed;
  meta.kv_form = c.kv_form;
  if (!weights_file.empty()) {
    golden::WeightsSource src;
    src.weight_seed = seed;
    meta.weights_file = weights_file;
    meta.weights_file_hash = fs::exists(weights_file) ? golden::WeightsFile(weights_file).hash()
                                                      : golden::write_weights_file(weights_file, w, src);
  }
  golden::write_golden(path, w, in, res, meta, golden::WriteOptions{});
  return path;
}

// Every output tensor of the schema, a rank.
size_t outputs_a_rank() {
  size_t n = 0;
  for (const golden::TensorSpec& s : golden::tensor_specs()) n += std::string(s.group).find("/outputs") != std::string::npos;
  return n;
}

}  // namespace

TEST_SUITE("gpu_golden") {

TEST_CASE("golden -> device -> dump: every tensor of every stage bit-exact (k4_device run)") {
  TempDir t;
  int n = 0;
  for (const GoldenCase& c : golden_cases()) {
    const std::string name = c.name;
    CAPTURE(name);
    const std::string g = make_golden(c, t.path("g" + std::to_string(n) + ".h5"), 100 + n);
    gpu::GoldenRunOptions o;
    o.golden = g, o.dump = t.path("d" + std::to_string(n) + ".h5");
    const gpu::GoldenRunResult r = gpu::run_golden(o);
    CHECK_MESSAGE(r.moe_skipped.empty(), r.moe_skipped);
    CHECK(r.last_stage == 5);
    const golden::DiffReport rep = golden::diff_files(g, o.dump, golden::DiffOptions{});
    const bool ok = !rep.any_mismatch() && rep.exit_code(true) == 0;
    if (!ok) std::printf("MISMATCH golden case '%s':\n%s\n", c.name, golden::report_text(rep).c_str());
    CHECK_MESSAGE(ok, c.name);
    CHECK(rep.tensors_compared == outputs_a_rank() * size_t(c.tp));
    std::printf("gpu_golden: %-36s %s tp%d S=%2d: %llu tensors bit-exact, device step %.3f s\n", c.name, c.preset, c.tp,
                c.scn.tokens, (unsigned long long)rep.tensors_compared, r.seconds);
    ++n;
  }
}

// k4 golden --weights-file: the device runner reads the golden's virtual w_o and expert rows
// through the weights file beside it (issue 13); moved without it, the run is refused naming
// both files, before the device runs and with no dump written.
TEST_CASE("golden with a weights file -> device -> dump: bit-exact; moved without its weights file: refused") {
  TempDir t;
  GoldenCase c{"weights file, wide", "tiny", 2, Scenario{}};
  c.scn.tokens = 7;
  c.scn.context = {"long", "short", "medium", "long", "0", "short", "2000"};  // one a row
  const std::string wf = t.path("layer.weights.h5");
  const std::string g = make_golden(c, t.path("g.h5"), 41, wf);
  {
    h5::File f(g, h5::File::Mode::ReadOnly);
    REQUIRE(f.root().open_dataset("/rank1/moe/inputs/w13").is_virtual());
    REQUIRE(f.root().open_dataset("/rank0/oproj/inputs/w_o").is_virtual());
  }
  gpu::GoldenRunOptions o;
  o.golden = g, o.dump = t.path("d.h5");
  const gpu::GoldenRunResult r = gpu::run_golden(o);
  CHECK_MESSAGE(r.moe_skipped.empty(), r.moe_skipped);
  CHECK(r.last_stage == 5);
  const golden::DiffReport rep = golden::diff_files(g, o.dump, golden::DiffOptions{});
  if (rep.any_mismatch()) std::printf("MISMATCH weights-file golden:\n%s\n", golden::report_text(rep).c_str());
  CHECK(rep.exit_code(true) == 0);
  CHECK(rep.tensors_compared == outputs_a_rank() * size_t(c.tp));
  // the same step's self-contained golden: the device's dump is the same one
  const std::string g2 = make_golden(c, t.path("self.h5"), 41);
  CHECK(golden::diff_files(g2, o.dump, golden::DiffOptions{}).exit_code(true) == 0);
  std::printf("gpu_golden: %-36s %s tp%d S=%2d: %llu tensors bit-exact, device step %.3f s\n", c.name, c.preset, c.tp,
              c.scn.tokens, (unsigned long long)rep.tensors_compared, r.seconds);
  // moved without its weights file
  fs::create_directories(t.dir / "moved");
  const std::string mg = (t.dir / "moved" / "g.h5").string();
  fs::copy_file(g, mg);
  gpu::GoldenRunOptions m;
  m.golden = mg, m.dump = t.path("moved/d.h5");
  const std::string named_golden = mg + ": its weights are in the weights file 'layer.weights.h5'";
  const std::string named_file = (t.dir / "moved" / "layer.weights.h5").string();
  CHECK_THROWS_WITH_AS(gpu::run_golden(m), doctest::Contains(named_golden.c_str()), golden::FormatError);
  CHECK_THROWS_WITH_AS(gpu::run_golden(m), doctest::Contains(named_file.c_str()), golden::FormatError);
  CHECK(!fs::exists(m.dump));
}

TEST_CASE("golden -> dump: a bit flipped in the dump is found at its stage; an existing dump is kept") {
  TempDir t;
  const GoldenCase c = golden_cases()[0];
  const std::string g = make_golden(c, t.path("g.h5"), 7);
  gpu::GoldenRunOptions o;
  o.golden = g, o.dump = t.path("d.h5");
  gpu::run_golden(o);
  {  // flip bit 0 of merge/outputs/attn8[0] on rank 1
    h5::File f(o.dump, h5::File::Mode::ReadWrite);
    h5::Dataset d = f.root().open_dataset("/rank1/merge/outputs/attn8");
    std::vector<uint8_t> v = d.read<uint8_t>();
    v[0] ^= 1;
    d.write_raw(v.data(), h5::Elem::U8);
  }
  const golden::DiffReport rep = golden::diff_files(g, o.dump, golden::DiffOptions{});
  CHECK(rep.exit_code() == 1);
  CHECK(rep.first.found);
  CHECK(rep.first.stage == "merge");
  CHECK(rep.first.rank == 1);
  CHECK(rep.first.tensor == "attn8");
  CHECK(rep.first.flat == 0);
  // the dump exists: a second run without overwrite refuses before the device runs
  CHECK_THROWS_WITH_AS(gpu::run_golden(o), doctest::Contains("exists"), std::invalid_argument);
  o.overwrite = true;
  gpu::run_golden(o);
  CHECK(golden::diff_files(g, o.dump, golden::DiffOptions{}).exit_code(true) == 0);
}

TEST_CASE("golden -> dump: routing to an expert the golden does not store stops after the router") {
  TempDir t;
  const GoldenCase c = golden_cases()[0];
  const std::string g = make_golden(c, t.path("g.h5"), 9);
  int unrouted = -1;
  {  // rank 0's bias of an expert the golden does not store raised: every token picks it
    h5::File f(g, h5::File::Mode::ReadWrite);
    const std::vector<int32_t> ids = f.root().open_dataset("/rank0/moe/inputs/expert_ids").read<int32_t>();
    for (int e = 0; unrouted < 0; ++e)
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) unrouted = e;
    h5::Dataset d = f.root().open_dataset("/rank0/router/inputs/bias");
    std::vector<uint32_t> b = d.read<uint32_t>();  // f32 bits
    b[size_t(unrouted)] = 0x42C80000u;                // 100.0f
    d.write_raw(b.data(), h5::Elem::U32);
  }
  gpu::GoldenRunOptions o;
  o.golden = g, o.dump = t.path("d.h5");
  const gpu::GoldenRunResult r = gpu::run_golden(o);
  CHECK(r.last_stage == 4);
  CHECK_MESSAGE(r.moe_skipped.find("expert " + std::to_string(unrouted) + " of rank 0") != std::string::npos,
                r.moe_skipped);
  const golden::DiffReport rep = golden::diff_files(g, o.dump, golden::DiffOptions{});
  CHECK(rep.exit_code() == 1);  // the golden's router outputs came from the old bias
  CHECK(rep.first.stage == "router");
  CHECK(rep.first.rank == 0);
  CHECK(rep.first.tensor == "key");
  bool moe_missing = false;
  for (const golden::NotCompared& nc : rep.not_compared) moe_missing |= nc.stage == "moe";
  for (const golden::StageDiff& sd : rep.stages) moe_missing |= sd.stage == "moe" && sd.status == golden::StageDiff::Status::Missing;
  CHECK(moe_missing);
}

}  // TEST_SUITE
