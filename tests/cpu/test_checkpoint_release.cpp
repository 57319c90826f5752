// test_checkpoint_release.cpp -- checkpoints in the published releases' layout
// (../shared/design/CHECKPOINTS.md), written by `k4 synth --layout`: names resolved through
// the index with the releases' prefixes and suffixes, the shape from config.json, the first K4
// layer by default, only the layer's shards opened, the deployment's weight preparation bit for
// bit (VARIANTS.md §8, checked against implementations written here), and every bad input
// named with exit 2 and nothing left at --out.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "golden/format/schema.hpp"
#include "golden/inputs/checkpoint.hpp"
#include "golden/inputs/hf_config.hpp"
#include "golden/inputs/hf_names.hpp"
#include "golden/inputs/synth_release.hpp"
#include "golden/inputs/weight_prep.hpp"
#include "golden/io/safetensors.hpp"
#include "reference/numerics/bf16.hpp"
#include "tests/cpu/cli_run.hpp"

namespace fs = std::filesystem;
using namespace k4;
using cli::Run;
using cli::TempDir;

namespace {

const char* kShard2 = "model-00002-of-00004.safetensors";
const char* kShard4 = "model-00004-of-00004.safetensors";

// One small release directory of each layout, made once for the suite.
struct Releases {
  TempDir t{"releases"};
  bool ok = false;
  std::string dir(const std::string& layout) const { return t.path(layout); }
};
const Releases& releases() {
  static Releases R;
  static bool made = false;
  if (!made) {
    made = true;
    R.ok = true;
    for (const char* l : {"bf16", "mxfp8", "mxfp4"}) {
      synth::ReleaseOptions o;
      o.layout = synth::layout_from(l);
      o.seed = 7;
      synth::write_release(R.dir(l), o, false);
    }
  }
  return R;
}

// A copy of a release directory to damage.
std::string copy_release(const TempDir& t, const std::string& layout) {
  const std::string d = t.path(layout);
  fs::copy(releases().dir(layout), d, fs::copy_options::recursive);
  return d;
}

void expect_bad(const Run& r, std::initializer_list<std::string> want) {
  CAPTURE(r.err);
  CHECK(r.signal == 0);
  CHECK(r.rc == 2);
  for (const std::string& w : want) CHECK_MESSAGE(r.err.find(w) != std::string::npos, "stderr lacks: " << w);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

std::string golden_cmd(const std::string& ck, const std::string& out) {
  return "golden --tokens 3 --context 900 --checkpoint " + ck + " --out " + out;
}

// Rewrites a shard's JSON header with `from` replaced by `to` (the data stays).
void edit_header(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream f(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(all[size_t(i)]);
  std::string h = all.substr(8, n);
  const size_t p = h.find(from);
  REQUIRE(p != std::string::npos);
  h.replace(p, from.size(), to);
  while ((8 + h.size()) % 8) h.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint8_t(uint64_t(h.size()) >> (8 * i)));
  out += h + all.substr(8 + n);
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  o << out;
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& fn) {
  std::ifstream f(dir + "/config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  fn(j);
  std::ofstream(dir + "/config.json", std::ios::trunc) << j.dump(2);
}

// E4M3 (OCP, max 448) by search: the nearest of the 254 finite codes, ties to the even code.
uint8_t e4m3_nearest(float x) {
  auto value = [](int c) {
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
  };
  int best = 0;
  double bd = 1e300;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    const double d = std::fabs(value(c) - double(x));
    if (d < bd || (d == bd && (c & 1) == 0 && (std::signbit(value(c)) == std::signbit(x)))) bd = d, best = c;
  }
  return uint8_t(best);
}

}  // namespace

TEST_SUITE("checkpoint_release") {

TEST_CASE("hf names: the releases' forms first, then k4's") {
  const auto c = hf::candidates(hf::Tensor::W1Scale, 3, 128, true);
  REQUIRE(c.size() == 8);
  CHECK(c[0] == "language_model.model.layers.3.block_sparse_moe.shared_experts.gate_proj.weight_scale_inv");
  CHECK(c[1] == "language_model.model.layers.3.block_sparse_moe.shared_experts.gate_proj.weight_scale");
  CHECK(c[7] == "model.layers.3.block_sparse_moe.shared_experts.w1.weight_scale");
  CHECK(hf::candidates(hf::Tensor::OProj, 5).size() == 2);
  CHECK(hf::release_name(hf::Tensor::W2, 4, 128, true, false) ==
        "language_model.model.layers.4.block_sparse_moe.shared_experts.down_proj.weight");
  CHECK(hf::release_name(hf::Tensor::W3Scale, 4, 9, false, true) ==
        "language_model.model.layers.4.block_sparse_moe.experts.9.w3.weight_scale_inv");
}

TEST_CASE("weight prep: Quark's even MXFP4 scale, the OCP floor, the PTPC floor (VARIANTS.md 8.1, 8.3 tables)") {
  using prep::MxScale;
  float blk[32] = {};
  uint8_t nib[32];
  const std::pair<float, std::pair<int, int>> table[] = {{1.7f, {125, 125}}, {1.75f, {126, 125}}, {7.0f, {128, 127}}, {6.0f, {127, 127}}};
  for (const auto& row : table) {
    const float amax = row.first;  // not a structured binding: clang's C++17 lambdas (CAPTURE) cannot capture those
    const auto& bytes = row.second;
    CAPTURE(amax);
    blk[0] = amax;
    CHECK(prep::mxfp4_block(blk, MxScale::Even, nib) == bytes.first);
    CHECK(prep::mxfp4_block(blk, MxScale::Floor, nib) == bytes.second);
  }
  blk[0] = 7.0f;
  prep::mxfp4_block(blk, MxScale::Even, nib);
  CHECK(nib[0] == 6);  // 3.5 ties to 4 -> 8.0
  prep::mxfp4_block(blk, MxScale::Floor, nib);
  CHECK(nib[0] == 7);  // saturates to 6 -> 6.0
  std::fill(blk, blk + 32, 0.0f);
  blk[3] = -0.0f;
  CHECK(prep::mxfp4_block(blk, MxScale::Even, nib) == 0);
  CHECK(nib[3] == 0x8);
  // PTPC: amax 2^-10 -> the floor 0x36924925, x = amax -> 0x76 (about 224)
  float row[4] = {std::ldexp(1.0f, -10), 0.0f, -std::ldexp(1.0f, -11), 0.0f};
  uint8_t codes[4];
  CHECK(f32_bits(prep::ptpc_fp8_row(row, 4, codes)) == 0x36924925u);
  CHECK(codes[0] == 0x76);
  CHECK(f32_bits(1.0f / (448.0f * 512.0f)) == prep::kPtpcMinScaleBits);
  CHECK(prep::mxfp8_value(0x38, 127 + 3) == 8.0f);  // 1.0 * 2^3
}

TEST_CASE("config.json: the shape, the K4 layers, the rules named, --preset agreement") {
  synth::ReleaseOptions o;
  const Config want = synth::release_config(o);
  std::ifstream f(releases().dir("mxfp4") + "/config.json");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const HfModel m = hf_model_from_config(text, "cfg");
  CHECK(golden::config_to_json(m.cfg) == golden::config_to_json([&] { Config c = want; c.name = m.cfg.name; return c; }()));
  CHECK(m.cfg.tp == 2);
  CHECK(m.k4_layers == std::vector<int>{3, 4});
  CHECK(choose_k4_layer(m, -1, "cfg") == 3);
  CHECK_THROWS_WITH_AS(choose_k4_layer(m, 1, "cfg"),
                       "cfg: layer 1 is not a K4 layer (dense MLP or not sparse); the K4 layers (MoE and sparse) are 3, 4",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(choose_k4_layer(m, 5, "cfg"), doctest::Contains("layer 5 is past the last layer (5 layers)"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(require_preset_agrees(m.cfg, preset("tiny", 2), "cfg"),
                       "cfg disagrees with --preset tiny (tp 2): n_routed 8 (preset 32)", std::invalid_argument);
  CHECK_NOTHROW(require_preset_agrees(m.cfg, m.cfg, "cfg"));
  // the full size is the preset
  synth::ReleaseOptions full;
  full.full = true;
  CHECK(golden::config_to_json(synth::release_config(full)) == golden::config_to_json(preset("minimax-m3-tp4")));
  nlohmann::json j = nlohmann::json::parse(text);
  j["text_config"]["swiglu_alpha"] = 1.5;
  CHECK_THROWS_WITH_AS(hf_model_from_config(j.dump(), "cfg"),
                       "cfg: text_config.swiglu_alpha = 1.5 is not the seed's swiglu constant 1.702", std::invalid_argument);
  j = nlohmann::json::parse(text);
  j["text_config"]["hidden_size"] = 3072;
  CHECK_THROWS_WITH_AS(hf_model_from_config(j.dump(), "cfg"), doctest::Contains("cfg: the model cannot run this config: "),
                       std::invalid_argument);
  j = nlohmann::json::parse(text);
  j["text_config"].erase("rms_norm_eps");
  CHECK_THROWS_WITH_AS(hf_model_from_config(j.dump(), "cfg"), "cfg: text_config.rms_norm_eps is missing", std::invalid_argument);
}

TEST_CASE("each layout, small: loads with no --preset and no --layer; the golden replays clean; MXFP8 experts refused") {
  REQUIRE_K4();
  const Releases& R = releases();
  REQUIRE(R.ok);
  TempDir t;
  for (const char* l : {"bf16", "mxfp4"}) {
    CAPTURE(l);
    const std::string g = t.path(std::string(l) + ".h5");
    const Run r = cli::run(t, golden_cmd(R.dir(l), g));
    CAPTURE(r.err);
    REQUIRE(r.rc == 0);
    golden::GoldenReader gr(g);
    CHECK(gr.config().hidden == 2048);
    CHECK(gr.config().tp == 2);
    const std::string prep = gr.root_attr("weight_prep");
    CHECK(prep.find("ptpc-fp8-vllm per rank") != std::string::npos);
    CHECK(prep.find("f32-to-bf16-rne") != std::string::npos);
    CHECK(prep.find(std::string(l) == "bf16" ? "mxfp4-even" : "mxfp4-stored") != std::string::npos);
    const Run rep = cli::run(t, "replay " + g + " " + g);
    CAPTURE(rep.out);
    CHECK(rep.rc == 0);
  }
  expect_bad(cli::run(t, golden_cmd(R.dir("mxfp8"), t.path("x.h5"))),
             {"is F8_E4M3 (MXFP8 experts, the MiniMax-M3-MXFP8 release)", "MXFP8-experts variant", "amd/MiniMax-M3-MXFP4"});
  CHECK(!fs::exists(t.path("x.h5")));
}

TEST_CASE("loading shows progress: o_proj rows, then the experts as the model routes to them") {
  REQUIRE_K4();
  const Releases& R = releases();
  REQUIRE(R.ok);
  TempDir t;
  const Run r = cli::run(t, golden_cmd(R.dir("mxfp4"), t.path("p.h5")) + " --progress");
  CAPTURE(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.find("load layer 3 o_proj [") != std::string::npos);
  CHECK(r.err.find("2048/2048 rows") != std::string::npos);
  // the experts' count: every (rank, expert) shard the step prepared, the last drawn when
  // run_step ends (TP 2: at least the shared expert's two shards), then the golden's bar
  const size_t e = r.err.rfind("load layer 3 experts: ");
  REQUIRE(e != std::string::npos);
  const unsigned long n = std::stoul(r.err.substr(e + std::strlen("load layer 3 experts: ")));
  CHECK(n >= 2);
  CHECK(r.err.find(" (rank, expert) shards", e) != std::string::npos);
  CHECK(r.err.find("golden [", e) != std::string::npos);
  CHECK(r.err.find("% ") != std::string::npos);
  CHECK(r.err.find("103%") == std::string::npos);
  // not a terminal and no --progress: no bar at all
  const Run q = cli::run(t, golden_cmd(R.dir("mxfp4"), t.path("q.h5")));
  REQUIRE(q.rc == 0);
  CHECK(q.err.find('\r') == std::string::npos);
}

TEST_CASE("BF16 and MXFP4 forms of the same values: the same weights and bit-identical golden tensors") {
  REQUIRE_K4();
  const Releases& R = releases();
  TempDir t;
  Checkpoint a(R.dir("bf16")), b(R.dir("mxfp4"));
  const CheckpointShape s = checkpoint_shape(b, "", -1, -1);
  CHECK(s.layer == 3);
  const LayerWeights x = load_checkpoint_layer(std::make_shared<Checkpoint>(R.dir("bf16")), s.cfg, 3);
  const LayerWeights y = load_checkpoint_layer(std::make_shared<Checkpoint>(R.dir("mxfp4")), s.cfg, 3);
  for (int r = 0; r < s.cfg.tp; ++r) {
    CHECK(x.ranks[r].w_o == y.ranks[r].w_o);
    CHECK(x.ranks[r].s_o == y.ranks[r].s_o);
    for (int e : {0, 5, s.cfg.shared_expert()}) {
      const auto p = x.experts->expert(r, e), q = y.experts->expert(r, e);
      CHECK(p->w13 == q->w13);  // the writer's nibble order is the stored one
      CHECK(p->s13 == q->s13);
      CHECK(p->w2 == q->w2);
      CHECK(p->s2 == q->s2);
    }
  }
  // and under the floor rule too (every block holds a 4 or a 6)
  const LayerWeights z = load_checkpoint_layer(std::make_shared<Checkpoint>(R.dir("bf16")), s.cfg, 3, prep::MxScale::Floor);
  CHECK(z.experts->expert(1, 2)->s2 == y.experts->expert(1, 2)->s2);
  // the whole golden
  REQUIRE(cli::run(t, golden_cmd(R.dir("bf16"), t.path("a.h5"))).rc == 0);
  REQUIRE(cli::run(t, golden_cmd(R.dir("mxfp4"), t.path("b.h5"))).rc == 0);
  golden::GoldenReader ga(t.path("a.h5")), gb(t.path("b.h5"));
  for (int r = 0; r < 2; ++r) {
    const RankResult p = ga.rank_result(r), q = gb.rank_result(r);
    CHECK(p.ar_out == q.ar_out);
    CHECK(p.moe.mid == q.moe.mid);
    CHECK(p.a == q.a);
    CHECK(p.h_mid == q.h_mid);
  }
  const LayerWeights wa = ga.weights(), wb = gb.weights();
  for (int r = 0; r < 2; ++r) CHECK(wa.ranks[r].s_o == wb.ranks[r].s_o);
  // not trivially equal: the ranks' o_proj scales differ, the outputs are not zero
  CHECK(wa.ranks[0].s_o != wa.ranks[1].s_o);
  const RankResult p = ga.rank_result(0);
  CHECK(std::any_of(p.ar_out.begin(), p.ar_out.end(), [](uint16_t v) { return (v & 0x7FFF) != 0; }));
}

TEST_CASE("o_proj per rank: the deployment's PTPC rule recomputed here from the BF16 tensor") {
  const Releases& R = releases();
  auto ck = std::make_shared<Checkpoint>(R.dir("bf16"));
  const CheckpointShape s = checkpoint_shape(*ck, "", -1, -1);
  const Config& c = s.cfg;
  const LayerWeights w = load_checkpoint_layer(ck, c, 3);
  const st::TensorView& o = ck->at("language_model.model.layers.3.self_attn.o_proj.weight");
  REQUIRE(o.dtype == st::SafetensorsDtype::BF16);
  const int64_t H = c.hidden, OK = c.o_k(), TOK = int64_t(c.tp) * OK;
  int floored = 0, checked = 0;
  for (int64_t i = 0; i < H; i += 13) {
    for (int r = 0; r < c.tp; ++r) {
      std::vector<float> x(static_cast<size_t>(OK));
      for (int64_t j = 0; j < OK; ++j) {
        uint16_t b;
        std::memcpy(&b, o.data + 2 * (i * TOK + r * OK + j), 2);
        uint32_t u = uint32_t(b) << 16;
        std::memcpy(&x[size_t(j)], &u, 4);
      }
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      const float floor_ = 1.0f / 229376.0f;
      const float scale = std::max(amax / 448.0f, floor_);
      floored += scale == floor_;
      CHECK(w.ranks[r].s_o[size_t(i)] == scale);
      for (int64_t j = 0; j < OK; j += 61) {
        const float q = std::min(std::max(x[size_t(j)] / scale, -448.0f), 448.0f);
        CHECK(w.ranks[r].w_o[size_t(i * OK + j)] == e4m3_nearest(q));
        ++checked;
      }
    }
  }
  CHECK(floored > 0);  // rows i % 97 == 5 are tiny: the floor binds
  CHECK(checked > 1000);
  // the gate: the F32 kept, its bf16 copy RNE
  REQUIRE(w.ranks[1].w_gate_f32.size() == w.ranks[1].w_gate.size());
  for (size_t i = 0; i < w.ranks[1].w_gate_f32.size(); i += 101) CHECK(w.ranks[1].w_gate[i] == bf16_bits_rne(w.ranks[1].w_gate_f32[i]));
}

TEST_CASE("o_proj from the MXFP8 release: exact dequantization, then the PTPC rule per rank (recomputed here)") {
  const Releases& R = releases();
  const Checkpoint ck(R.dir("mxfp8"));
  const CheckpointShape s = checkpoint_shape(ck, "", -1, -1);
  const Config& c = s.cfg;
  const std::vector<RankWeights> w = load_o_proj_ranks(ck, c, 3);
  const std::string base = "language_model.model.layers.3.self_attn.o_proj.";
  const st::TensorView& o = ck.at(base + "weight");
  const st::TensorView& sc = ck.at(base + "weight_scale_inv");
  REQUIRE(o.dtype == st::SafetensorsDtype::F8_E4M3);
  REQUIRE(sc.shape == std::vector<int64_t>{c.hidden, int64_t(c.tp) * c.o_k() / 32});
  const int64_t OK = c.o_k(), TOK = int64_t(c.tp) * OK;
  auto e4m3 = [](uint8_t b) {  // OCP E4M3 decoded here (no NaN codes in the fixture)
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    return (b & 0x80) ? -v : v;
  };
  int checked = 0;
  for (int64_t i = 0; i < c.hidden; i += 29)
    for (int r = 0; r < c.tp; ++r) {
      std::vector<float> x(static_cast<size_t>(OK));
      float amax = 0;
      for (int64_t j = 0; j < OK; ++j) {
        const int64_t col = r * OK + j;
        x[size_t(j)] = float(std::ldexp(e4m3(o.data[i * TOK + col]), int(sc.data[i * (TOK / 32) + col / 32]) - 127));
        amax = std::max(amax, std::fabs(x[size_t(j)]));
      }
      const float scale = std::max(amax / 448.0f, 1.0f / 229376.0f);
      CHECK(w[size_t(r)].s_o[size_t(i)] == scale);
      for (int64_t j = 0; j < OK; j += 37, ++checked)
        CHECK(w[size_t(r)].w_o[size_t(i * OK + j)] == e4m3_nearest(std::min(std::max(x[size_t(j)] / scale, -448.0f), 448.0f)));
    }
  CHECK(checked > 1000);
  CHECK(w[0].s_o != w[1].s_o);
}

TEST_CASE("MXFP8 experts (moe.experts = mxfp8, V7): the release's E4M3 codes and E8M0 scales as stored, byte for byte") {
  REQUIRE_K4();
  const Releases& R = releases();
  const auto ck = std::make_shared<Checkpoint>(R.dir("mxfp8"));
  CheckpointShape s = checkpoint_shape(*ck, "", -1, -1);
  Config c = s.cfg;
  c.variant.experts = ExpertFormat::mxfp8;
  const LayerWeights w = load_checkpoint_layer(ck, c, 3);
  const int64_t H = c.hidden, I = c.inter, TI = int64_t(c.tp) * I;
  // rank r's slice of the fixture's tensors, cut here: w1 / w3 rows [r I, (r+1) I), w2 columns
  const char* proj[3] = {"w1", "w3", "w2"};
  auto name = [&](int e, int p, bool scale) {
    const std::string sh[3] = {"gate_proj", "up_proj", "down_proj"};
    const std::string b = e == c.shared_expert() ? "language_model.model.layers.3.block_sparse_moe.shared_experts." + sh[p]
                                                 : "language_model.model.layers.3.block_sparse_moe.experts." +
                                                       std::to_string(e) + "." + proj[p];
    return b + (scale ? ".weight_scale_inv" : ".weight");
  };
  int compared = 0;
  for (int r = 0; r < c.tp; ++r)
    for (int e : {0, 3, c.n_routed - 1, c.shared_expert()}) {
      CAPTURE(r);
      CAPTURE(e);
      const auto x = w.experts->expert(r, e);
      REQUIRE(x->w13.size() == size_t(2 * I * H));  // one byte an element
      REQUIRE(x->w2.size() == size_t(H * I));
      std::vector<uint8_t> w13, s13, w2, s2;
      for (int p = 0; p < 2; ++p) {
        const st::TensorView& a = ck->at(name(e, p, false));
        const st::TensorView& b = ck->at(name(e, p, true));
        REQUIRE(a.dtype == st::SafetensorsDtype::F8_E4M3);
        REQUIRE(a.shape == std::vector<int64_t>{TI, H});
        w13.insert(w13.end(), a.data + r * I * H, a.data + (r + 1) * I * H);
        s13.insert(s13.end(), b.data + r * I * (H / 32), b.data + (r + 1) * I * (H / 32));
      }
      const st::TensorView& a = ck->at(name(e, 2, false));
      const st::TensorView& b = ck->at(name(e, 2, true));
      REQUIRE(a.shape == std::vector<int64_t>{H, TI});
      for (int64_t i = 0; i < H; ++i) {
        w2.insert(w2.end(), a.data + i * TI + r * I, a.data + i * TI + (r + 1) * I);
        s2.insert(s2.end(), b.data + i * (TI / 32) + r * (I / 32), b.data + i * (TI / 32) + (r + 1) * (I / 32));
      }
      CHECK(x->w13 == w13);
      CHECK(x->s13 == s13);
      CHECK(x->w2 == w2);
      CHECK(x->s2 == s2);
      compared += 4;
      // not trivially equal: codes of both signs and several exponents, scales that differ
      CHECK(std::set<uint8_t>(w13.begin(), w13.end()).size() > 8);
      CHECK(std::set<uint8_t>(s2.begin(), s2.end()).size() > 1);
    }
  CHECK(compared == 4 * 4 * c.tp);
  // the ranks' slices differ (a planted wrong slice, rank 0's bytes for rank 1, is caught above)
  CHECK(w.experts->expert(0, 3)->w13 != w.experts->expert(1, 3)->w13);
  // the golden: written with the variant, its stored experts the fixture's bytes, replays clean
  TempDir t;
  const std::string g = t.path("m8.h5");
  const Run r = cli::run(t, golden_cmd(R.dir("mxfp8"), g) + " --variant moe.experts=mxfp8");
  CAPTURE(r.err);
  REQUIRE(r.rc == 0);
  golden::GoldenReader gr(g);
  CHECK(gr.config().variant.experts == ExpertFormat::mxfp8);
  const std::string prep = gr.root_attr("weight_prep");
  CHECK(prep.find("\"experts\":\"mxfp8-stored\"") != std::string::npos);
  CHECK(prep.find("\"shared_expert\":\"mxfp8-stored\"") != std::string::npos);
  CHECK(prep.find("mxfp8-dequant + ptpc-fp8-vllm per rank") != std::string::npos);  // o_proj
  const LayerWeights gw = gr.weights();
  int stored = 0;
  for (int rr = 0; rr < c.tp; ++rr)
    for (int e = 0; e <= c.n_routed; ++e) {
      std::shared_ptr<const ExpertWeights> q;
      try {
        q = gw.experts->expert(rr, e);
      } catch (const std::exception&) {
        continue;  // not routed to: not stored
      }
      const auto p = w.experts->expert(rr, e);
      CHECK(q->w13 == p->w13);
      CHECK(q->s13 == p->s13);
      CHECK(q->w2 == p->w2);
      CHECK(q->s2 == p->s2);
      ++stored;
    }
  CHECK(stored >= c.tp);  // at least the shared expert of each rank
  const Run rep = cli::run(t, "replay " + g + " " + g);
  CAPTURE(rep.out);
  CHECK(rep.rc == 0);
  // the seed build still refuses them, naming the variant
  expect_bad(cli::run(t, golden_cmd(R.dir("mxfp8"), t.path("x.h5"))), {"--variant moe.experts=mxfp8"});
  // and the variant refuses a release whose experts are not MXFP8
  expect_bad(cli::run(t, golden_cmd(R.dir("mxfp4"), t.path("x.h5")) + " --variant moe.experts=mxfp8"),
             {"experts.0.w1.weight' is U8, expected F8_E4M3: moe.experts = mxfp8 (V7) reads the expert 0 as MXFP8"});
  CHECK(!fs::exists(t.path("x.h5")));
}

TEST_CASE("bad input: MXFP8 experts' scale tensors (file, tensor, expectation; exit 2, nothing at --out)") {
  REQUIRE_K4();
  TempDir t;
  const std::string out = t.path("x.h5");
  const std::string d = copy_release(t, "mxfp8");
  const std::string shard = d + "/" + kShard2;
  const std::string n = "language_model.model.layers.3.block_sparse_moe.experts.0.w2.weight_scale_inv";
  SUBCASE("wrong dtype") {
    edit_header(shard, "\"" + n + "\":{\"dtype\":\"U8\"", "\"" + n + "\":{\"dtype\":\"I8\"");
    expect_bad(cli::run(t, golden_cmd(d, out) + " --variant moe.experts=mxfp8"),
               {"safetensors " + shard, "tensor '" + n + "' has dtype I8, expected U8 or F8_E8M0"});
  }
  SUBCASE("wrong shape") {  // [2048, 8] -> [1024, 16]: the same bytes
    edit_header(shard, "\"" + n + "\":{\"dtype\":\"U8\",\"shape\":[2048,8]", "\"" + n + "\":{\"dtype\":\"U8\",\"shape\":[1024,16]");
    expect_bad(cli::run(t, golden_cmd(d, out) + " --variant moe.experts=mxfp8"),
               {"safetensors " + shard, "tensor '" + n + "' has shape [1024, 16], expected [2048, 8]"});
  }
  CHECK(!fs::exists(out));
}

TEST_CASE("only the layer's shards are needed: the index may name shards that are not on disk") {
  REQUIRE_K4();
  TempDir t;
  const std::string d = copy_release(t, "mxfp4");
  fs::remove(d + "/" + kShard4);  // layer 4's
  const Run r = cli::run(t, golden_cmd(d, t.path("ok.h5")));
  CAPTURE(r.err);
  CHECK(r.rc == 0);
  expect_bad(cli::run(t, golden_cmd(d, t.path("x.h5")) + " --layer 4"),
             {"checkpoint " + d + ": shard " + kShard4 + " is not in the directory",
              "language_model.model.layers.4.block_sparse_moe.e_score_correction_bias"});
  CHECK(!fs::exists(t.path("x.h5")));
}

TEST_CASE("bad input: release directories (message, exit 2, nothing at --out)") {
  REQUIRE_K4();
  TempDir t;
  const std::string out = t.path("x.h5");
  SUBCASE("config.json missing") {
    const std::string d = copy_release(t, "mxfp4");
    fs::remove(d + "/config.json");
    expect_bad(cli::run(t, golden_cmd(d, out)), {"checkpoint " + d + ": config.json is missing"});
  }
  SUBCASE("the index names a shard that is not there") {
    const std::string d = copy_release(t, "mxfp4");
    fs::remove(d + "/" + kShard2);
    expect_bad(cli::run(t, golden_cmd(d, out)),
               {"shard " + std::string(kShard2) + " is not in the directory", "tensors the layer reads in it",
                "language_model.model.layers.3."});
  }
  SUBCASE("config.json the model cannot run") {
    const std::string d = copy_release(t, "mxfp4");
    edit_config(d, [](nlohmann::json& j) { j["text_config"]["num_experts_per_tok"] = 2; });
    expect_bad(cli::run(t, golden_cmd(d, out)),
               {"config.json: the model cannot run this config: ", "top_k must be 4"});
  }
  SUBCASE("--preset that disagrees") {
    const std::string d = copy_release(t, "mxfp4");
    expect_bad(cli::run(t, golden_cmd(d, out) + " --preset tiny"),
               {"config.json disagrees with --preset tiny", "n_routed 8 (preset 32)", "tp 2 (preset 4)"});
  }
  SUBCASE("a tensor of the wrong dtype") {
    const std::string d = copy_release(t, "mxfp4");
    // the gate F32 -> I32 (same bytes)
    edit_header(d + "/" + kShard2, R"("language_model.model.layers.3.block_sparse_moe.gate.weight":{"dtype":"F32")",
                R"("language_model.model.layers.3.block_sparse_moe.gate.weight":{"dtype":"I32")");
    expect_bad(cli::run(t, golden_cmd(d, out)),
               {"tensor 'language_model.model.layers.3.block_sparse_moe.gate.weight' has dtype I32, expected BF16 or F32"});
  }
  SUBCASE("a tensor of the wrong shape") {
    const std::string d = copy_release(t, "mxfp4");
    edit_header(d + "/" + kShard2, R"("language_model.model.layers.3.block_sparse_moe.gate.weight":{"dtype":"F32","shape":[8,2048])",
                R"("language_model.model.layers.3.block_sparse_moe.gate.weight":{"dtype":"F32","shape":[16,1024])");
    expect_bad(cli::run(t, golden_cmd(d, out)),
               {"tensor 'language_model.model.layers.3.block_sparse_moe.gate.weight' has shape [16, 1024], expected [8, 2048]"});
  }
  SUBCASE("a dense layer, a layer past the last") {
    const std::string d = releases().dir("mxfp4");
    expect_bad(cli::run(t, golden_cmd(d, out) + " --layer 1"),
               {"layer 1 is not a K4 layer (dense MLP or not sparse); the K4 layers (MoE and sparse) are 3, 4"});
    expect_bad(cli::run(t, golden_cmd(d, out) + " --layer 9"), {"layer 9 is past the last layer (5 layers)", "are 3, 4"});
  }
  SUBCASE("a truncated shard") {
    const std::string d = copy_release(t, "mxfp4");
    const std::string s = d + "/model-00003-of-00004.safetensors";
    fs::resize_file(s, fs::file_size(s) - 1000);
    expect_bad(cli::run(t, golden_cmd(d, out)), {"safetensors " + s, "run past the end of the file"});
  }
  SUBCASE("an unknown dtype elsewhere in a needed shard is fine; in a tensor K4 reads it is named") {
    const std::string d = copy_release(t, "mxfp4");
    edit_header(d + "/" + kShard2, R"("language_model.model.layers.3.self_attn.q_proj.weight":{"dtype":"BF16")",
                R"("language_model.model.layers.3.self_attn.q_proj.weight":{"dtype":"C64")");
    const Run r = cli::run(t, golden_cmd(d, t.path("ok.h5")));
    CAPTURE(r.err);
    CHECK(r.rc == 0);
    edit_header(d + "/" + kShard2, R"("language_model.model.layers.3.block_sparse_moe.gate.weight":{"dtype":"F32")",
                R"("language_model.model.layers.3.block_sparse_moe.gate.weight":{"dtype":"F8_E4M3FNUZ")");
    expect_bad(cli::run(t, golden_cmd(d, out)), {"gate.weight' has dtype F8_E4M3FNUZ, expected BF16 or F32"});
  }
  CHECK(!fs::exists(out));
}

}  // TEST_SUITE checkpoint_release
