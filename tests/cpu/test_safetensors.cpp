// test_safetensors.cpp -- the safetensors reader's validation messages, the streaming writer,
// the synthetic checkpoint == SyntheticExpertSource / synthetic_layer bit for bit, and the
// BF16 forms quantized on load with the documented rules and TP sharding.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "golden/inputs/checkpoint.hpp"
#include "golden/inputs/weight_prep.hpp"
#include "golden/inputs/hf_names.hpp"
#include "golden/io/safetensors.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/mx.hpp"

namespace fs = std::filesystem;
using namespace k4;

namespace {

struct TempDir {
  fs::path dir;
  TempDir() {
    static int n = 0;
    dir = fs::temp_directory_path() / ("k4_test_st_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  size_t entries() const { return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator())); }
};

// A raw file: 8-byte length, header text, data bytes.
void write_raw(const std::string& p, const std::string& header, const std::string& data, int64_t len = -1) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  uint64_t n = len < 0 ? header.size() : uint64_t(len);
  for (int i = 0; i < 8; ++i) f.put(char(n >> (8 * i)));
  f << header << data;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace

TEST_SUITE("safetensors") {

TEST_CASE("safetensors writer and reader round trip: dtypes, shapes, metadata, 8-byte aligned data") {
  TempDir t;
  const std::string p = t.path("a.safetensors");
  st::Writer w(p, false);
  w.declare("x.bf16", st::SafetensorsDtype::BF16, {2, 3});
  w.declare("y.u8", st::SafetensorsDtype::U8, {5});
  w.declare("z.f32", st::SafetensorsDtype::F32, {1});
  w.declare("empty", st::SafetensorsDtype::F8_E4M3, {0, 4});
  w.set_metadata("format", "test");
  w.begin();
  const uint16_t x[6] = {1, 2, 3, 4, 5, 0xFFFF};
  w.write(x, 4);  // split writes cross nothing but must accumulate
  w.write(reinterpret_cast<const uint8_t*>(x) + 4, 8);
  const uint8_t y[5] = {9, 8, 7, 6, 5};
  const float z = -1.5f;
  w.write(y, 5);
  w.write(&z, 4);
  w.finish();
  st::File f(p);
  CHECK(f.metadata().at("format") == "test");
  CHECK(f.names().size() == 4);
  const st::TensorView& a = f.get("x.bf16", {st::SafetensorsDtype::BF16}, {2, 3});
  CHECK(std::memcmp(a.data, x, 12) == 0);
  CHECK((a.data - f.at("x.bf16").data) == 0);
  const st::TensorView& b = f.get("y.u8", {st::SafetensorsDtype::U8, st::SafetensorsDtype::F8_E8M0}, {5});
  CHECK(std::memcmp(b.data, y, 5) == 0);
  float zz;
  std::memcpy(&zz, f.at("z.f32").data, 4);
  CHECK(zz == -1.5f);
  CHECK(f.at("empty").nbytes == 0);
  // the data section starts 8-aligned
  std::ifstream in(p, std::ios::binary);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(in.get())) << (8 * i);
  CHECK((8 + n) % 8 == 0);
}

TEST_CASE("safetensors writer: refuses to overwrite, removes its temporary when not finished") {
  TempDir t;
  const std::string p = t.path("a.safetensors");
  {
    st::Writer w(p, false);
    w.declare("a", st::SafetensorsDtype::U8, {4});
    w.begin();
    const uint8_t b[2] = {1, 2};
    w.write(b, 2);
    CHECK_THROWS_AS(w.finish(), std::logic_error);  // 2 of 4 bytes
  }
  CHECK(t.entries() == 0);
  {
    st::Writer w(p, false);
    w.declare("a", st::SafetensorsDtype::U8, {1});
    w.begin();
    const uint8_t b = 1;
    w.write(&b, 1);
    w.finish();
  }
  CHECK_THROWS_WITH_AS(st::Writer(p, false), doctest::Contains("exists"), std::invalid_argument);
  CHECK_NOTHROW(st::Writer(p, true));
  CHECK(t.entries() == 1);
}

TEST_CASE("safetensors reader: each header corruption gives its message") {
  TempDir t;
  const std::string p = t.path("bad.safetensors");
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  SUBCASE("truncated before the length") {
    std::ofstream(p, std::ios::binary) << "abc";
    CHECK_THROWS_WITH_AS(st::File{p}, doctest::Contains("shorter than the 8-byte header length"), std::invalid_argument);
  }
  SUBCASE("header length past the end") {
    write_raw(p, ok, std::string(8, '\0'), 4096);
    CHECK_THROWS_WITH_AS(st::File{p}, doctest::Contains("header length 4096 runs past the end of the file"),
                         std::invalid_argument);
  }
  SUBCASE("absurd header length") {
    write_raw(p, ok, "", int64_t(1) << 40);
    CHECK_THROWS_WITH_AS(st::File{p}, doctest::Contains("exceeds the 100 MiB limit"), std::invalid_argument);
  }
  SUBCASE("bad JSON") {
    write_raw(p, R"({"a":{"dtype":"F32",)", std::string(8, '\0'));
    CHECK_THROWS_WITH_AS(st::File{p}, doctest::Contains("header is not valid JSON"), std::invalid_argument);
  }
  SUBCASE("offsets past the end") {
    write_raw(p, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0'));
    CHECK_THROWS_WITH_AS(st::File{p}, doctest::Contains("tensor 'a': data_offsets [0,16] run past the end of the file"),
                         std::invalid_argument);
  }
  SUBCASE("byte count does not match dtype and shape") {
    write_raw(p, R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'));
    CHECK_THROWS_WITH_AS(st::File{p}, doctest::Contains("tensor 'a': holds 8 bytes, but BF16 [3] needs 6"),
                         std::invalid_argument);
  }
  SUBCASE("unknown dtype: kept by name, refused only when read (a shard's vision tensors)") {
    write_raw(p, R"({"a":{"dtype":"F8_E4M3FNUZ","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
              std::string(8, '\0'));
    st::File f(p);
    CHECK(f.has("a"));
    CHECK(f.unknown_dtype("a") == "F8_E4M3FNUZ");
    CHECK(f.unknown_dtype("b").empty());
    CHECK(f.names() == std::vector<std::string>{"a", "b"});
    CHECK(f.get("b", {st::SafetensorsDtype::U8}, {8}).nbytes == 8);
    CHECK_THROWS_WITH_AS(f.get("a", {st::SafetensorsDtype::U8}, {8}),
                         ("safetensors " + p + ": tensor 'a' has dtype F8_E4M3FNUZ, expected U8").c_str(), std::invalid_argument);
    CHECK_THROWS_WITH_AS(f.at("a"), doctest::Contains("has dtype F8_E4M3FNUZ, which this reader does not know"),
                         std::invalid_argument);
  }
  SUBCASE("unknown dtype: its offsets are still checked") {
    write_raw(p, R"({"a":{"dtype":"F4","shape":[8],"data_offsets":[0,9]}})", std::string(8, '\0'));
    CHECK_THROWS_WITH_AS(st::File{p}, doctest::Contains("tensor 'a': data_offsets [0,9] run past the end"), std::invalid_argument);
  }
  SUBCASE("begin after end") {
    write_raw(p, R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", std::string(8, '\0'));
    CHECK_THROWS_WITH_AS(st::File{p}, doctest::Contains("begin after end"), std::invalid_argument);
  }
  SUBCASE("wrong dtype, wrong shape, missing tensor at get()") {
    write_raw(p, ok, std::string(8, '\0'));
    st::File f(p);
    CHECK_THROWS_WITH_AS(f.get("a", {st::SafetensorsDtype::BF16}, {2}),
                         ("safetensors " + p + ": tensor 'a' has dtype F32, expected BF16").c_str(), std::invalid_argument);
    CHECK_THROWS_WITH_AS(f.get("a", {st::SafetensorsDtype::F32}, {1, 2}),
                         ("safetensors " + p + ": tensor 'a' has shape [2], expected [1, 2]").c_str(), std::invalid_argument);
    CHECK_THROWS_WITH_AS(f.get("b", {st::SafetensorsDtype::F32}, {2}), doctest::Contains("tensor 'b' is missing"),
                         std::invalid_argument);
  }
}

TEST_CASE("synthetic checkpoint file == synthetic_layer and SyntheticExpertSource, bit for bit") {
  TempDir t;
  for (int tp : {2, 4}) {
    CAPTURE(tp);
    const Config cfg = preset("tiny", tp);
    const std::string p = t.path("synth" + std::to_string(tp) + ".safetensors");
    synth::write_checkpoint(p, cfg, 42, 0, false);
    CHECK(fs::file_size(p) > synth::checkpoint_bytes(cfg));
    CHECK(fs::file_size(p) < synth::checkpoint_bytes(cfg) + 65536);
    const LayerWeights a = load_checkpoint_layer(p, cfg, 0);
    const LayerWeights b = synth::synthetic_layer(cfg, 42);
    for (int r = 0; r < tp; ++r) {
      CHECK(same_bits(a.ranks[r].w_o, b.ranks[r].w_o));
      CHECK(same_bits(a.ranks[r].s_o, b.ranks[r].s_o));
      CHECK(same_bits(a.ranks[r].g_post, b.ranks[r].g_post));
      CHECK(same_bits(a.ranks[r].w_gate, b.ranks[r].w_gate));
      CHECK(same_bits(a.ranks[r].bias, b.ranks[r].bias));
      for (int e : {0, 5, cfg.n_routed - 1, cfg.shared_expert()}) {
        auto x = a.experts->expert(r, e), y = b.experts->expert(r, e);
        CHECK(same_bits(x->w13, y->w13));
        CHECK(same_bits(x->s13, y->s13));
        CHECK(same_bits(x->w2, y->w2));
        CHECK(same_bits(x->s2, y->s2));
      }
    }
    // ranks and experts differ from one another (the slices are not all the same bytes)
    CHECK(!same_bits(b.ranks[0].w_o, b.ranks[1].w_o));
    CHECK(!same_bits(b.experts->expert(0, 1)->w13, b.experts->expert(1, 1)->w13));
    CHECK(!same_bits(b.experts->expert(0, 1)->w2, b.experts->expert(0, 2)->w2));
  }
  // another seed, another layer
  const Config cfg = preset("tiny", 2);
  CHECK(!same_bits(synth::synthetic_layer(cfg, 1).ranks[0].w_gate, synth::synthetic_layer(cfg, 2).ranks[0].w_gate));
}

TEST_CASE("synthetic weights have the documented magnitudes") {
  const Config cfg = preset("tiny", 2);
  const LayerWeights w = synth::synthetic_layer(cfg, 9);
  auto ew = w.experts->expert(0, 3);
  int lo = 255, hi = 0;
  for (uint8_t s : ew->s13) lo = std::min<int>(lo, s), hi = std::max<int>(hi, s);
  CHECK(lo == 121);  // 2^-6
  CHECK(hi == 124);  // 2^-3
  double ss = 0;
  for (uint16_t g : w.ranks[0].w_gate) ss += double(bf16_to_f32(g)) * bf16_to_f32(g);
  const double sd = std::sqrt(ss / double(w.ranks[0].w_gate.size()));
  CHECK(sd > 0.018);
  CHECK(sd < 0.022);
  int nan = 0, out_of_range = 0;
  for (uint8_t c : w.ranks[0].w_o) nan += e4m3_is_nan(c);
  for (float s : w.ranks[0].s_o) out_of_range += !(s >= 0.5e-3f && s <= 1.5e-3f);
  CHECK(nan == 0);
  CHECK(out_of_range == 0);
}

TEST_CASE("BF16 checkpoint forms are quantized on load by the documented rules, sharded by rank") {
  TempDir t;
  const Config cfg = preset("tiny", 2);
  const int64_t H = cfg.hidden, TOK = int64_t(cfg.tp) * cfg.o_k(), E = cfg.n_routed, TI = int64_t(cfg.tp) * cfg.inter;
  const std::string p = t.path("bf16.safetensors");
  // values: a deterministic spread, exact in bf16
  auto val = [](uint64_t tensor, uint64_t i) {
    const uint64_t h = synth::word(tensor * 7919 + 1, i);
    return bf16_round(float(int64_t(h % 2001) - 1000) * 0.0007f);
  };
  using T = hf::Tensor;
  struct Item {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t id;
  };
  std::vector<Item> items = {{hf::name(T::PostNorm, 0), {H}, 1},
                             {hf::name(T::OProj, 0), {H, TOK}, 2},
                             {hf::name(T::Gate, 0), {E, H}, 3}};
  for (int e = 0; e <= cfg.n_routed; ++e) {
    const bool sh = e == cfg.shared_expert();
    items.push_back({hf::name(T::W1, 0, e, sh), {TI, H}, 100 + uint64_t(e) * 3});
    items.push_back({hf::name(T::W3, 0, e, sh), {TI, H}, 101 + uint64_t(e) * 3});
    items.push_back({hf::name(T::W2, 0, e, sh), {H, TI}, 102 + uint64_t(e) * 3});
  }
  {
    st::Writer w(p, false);
    for (const Item& it : items) w.declare(it.name, st::SafetensorsDtype::BF16, it.shape);
    w.declare(hf::name(T::Bias, 0), st::SafetensorsDtype::F32, {E});
    w.begin();
    for (const Item& it : items) {
      uint64_t n = 1;
      for (int64_t d : it.shape) n *= uint64_t(d);
      std::vector<uint16_t> v(n);
      for (uint64_t i = 0; i < n; ++i) v[i] = bf16_bits_rne(val(it.id, i));
      w.write(v.data(), n * 2);
    }
    std::vector<float> bias(static_cast<size_t>(E), 0.25f);
    w.write(bias.data(), bias.size() * 4);
    w.finish();
  }
  const LayerWeights lw = load_checkpoint_layer(p, cfg, 0);
  // o_proj: per row of each rank's own columns (ptpc-fp8-vllm), scale = max(amax / 448, floor),
  // E4M3 of x / scale (tests/cpu/test_checkpoint_release.cpp checks the rule on every case)
  for (int64_t i : {int64_t(0), H / 2, H - 1}) {
    for (int r = 0; r < cfg.tp; ++r) {
      float amax = 0;
      for (int64_t j = 0; j < cfg.o_k(); ++j) amax = std::max(amax, std::fabs(val(2, uint64_t(i * TOK + r * cfg.o_k() + j))));
      const float scale = std::max(amax / 448.0f, 1.0f / 229376.0f);
      CHECK(lw.ranks[r].s_o[size_t(i)] == scale);
      for (int64_t j = 0; j < cfg.o_k(); j += 97) {
        const float x = val(2, uint64_t(i * TOK + r * cfg.o_k() + j));
        CHECK(lw.ranks[r].w_o[size_t(i * cfg.o_k() + j)] == e4m3_bits(x / scale, Fp8Overflow::Saturate));
      }
    }
  }
  // experts: MXFP4 (the even rule by default) of each 32-block along the input dimension, rank slices
  for (int r = 0; r < cfg.tp; ++r)
    for (int e : {0, cfg.shared_expert()}) {
      auto ew = lw.experts->expert(r, e);
      const uint64_t id1 = 100 + uint64_t(e) * 3, id2 = id1 + 2;
      for (int64_t row : {int64_t(0), int64_t(cfg.inter - 1)}) {
        float blk[32];
        uint8_t nib[32];
        for (int k = 0; k < 32; ++k) blk[k] = val(id1, uint64_t((r * cfg.inter + row) * H + 32 + k));  // block 1
        const uint8_t s = prep::mxfp4_block(blk, prep::MxScale::Even, nib);
        CHECK(ew->s13[size_t(row * (H / 32) + 1)] == s);
        for (int k = 0; k < 16; ++k) CHECK(ew->w13[size_t(row * (H / 2) + 16 + k)] == fp4_pack2(nib[2 * k], nib[2 * k + 1]));
        // w2 row `row`: columns [r*inter, ...), block 0
        for (int k = 0; k < 32; ++k) blk[k] = val(id2, uint64_t(row * TI + r * cfg.inter + k));
        const uint8_t s2 = prep::mxfp4_block(blk, prep::MxScale::Even, nib);
        CHECK(ew->s2[size_t(row * (cfg.inter / 32))] == s2);
        CHECK(ew->w2[size_t(row * (cfg.inter / 2))] == fp4_pack2(nib[0], nib[1]));
      }
    }
  CHECK(lw.ranks[1].bias[3] == 0.25f);
  CHECK(lw.ranks[0].g_post[7] == bf16_bits_rne(val(1, 7)));
}

TEST_CASE("checkpoint loader: a missing or malformed tensor is named") {
  TempDir t;
  const Config cfg = preset("tiny", 2);
  const std::string p = t.path("part.safetensors");
  {
    st::Writer w(p, false);
    w.declare(hf::name(hf::Tensor::PostNorm, 0), st::SafetensorsDtype::BF16, {cfg.hidden + 1});
    w.begin();
    std::vector<uint16_t> v(static_cast<size_t>(cfg.hidden + 1), 0);
    w.write(v.data(), v.size() * 2);
    w.finish();
  }
  CHECK_THROWS_WITH_AS(load_checkpoint_layer(p, cfg, 0),
                       doctest::Contains(("tensor 'model.layers.0.post_attention_layernorm.weight' has shape [" +
                                          std::to_string(cfg.hidden + 1) + "], expected [" + std::to_string(cfg.hidden) + "]")
                                             .c_str()),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(load_checkpoint_layer(t.path("nope"), cfg, 0), doctest::Contains("does not exist"),
                       std::invalid_argument);
}

TEST_CASE("hf names: one table, routed and shared experts") {
  CHECK(hf::name(hf::Tensor::W2Scale, 3, 17) == "model.layers.3.block_sparse_moe.experts.17.w2.weight_scale");
  CHECK(hf::name(hf::Tensor::W1, 0, 128, true) == "model.layers.0.block_sparse_moe.shared_experts.w1.weight");
  CHECK(hf::name(hf::Tensor::OProj, 61) == "model.layers.61.self_attn.o_proj.weight");
  CHECK(hf::table().size() == 11);
}

}  // TEST_SUITE safetensors
