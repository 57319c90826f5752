// synth_release.cpp -- see synth_release.hpp.
#include "golden/inputs/synth_release.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "golden/inputs/hf_names.hpp"
#include "golden/inputs/synth.hpp"
#include "golden/io/atomic_file.hpp"
#include "golden/io/safetensors.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"

namespace k4::synth {
namespace fs = std::filesystem;
using T = hf::Tensor;

Layout layout_from(const std::string& s) {
  if (s == "bf16") return Layout::Bf16;
  if (s == "mxfp8") return Layout::Mxfp8;
  if (s == "mxfp4") return Layout::Mxfp4;
  throw std::invalid_argument("--layout '" + s + "' is none of bf16, mxfp8, mxfp4");
}
const char* layout_name(Layout l) { return l == Layout::Bf16 ? "bf16" : l == Layout::Mxfp8 ? "mxfp8" : "mxfp4"; }

Config release_config(const ReleaseOptions& o) {
  Config c = preset("minimax-m3-tp4", o.tp < 0 ? (o.full ? 4 : 2) : o.tp);
  if (!o.full) {  // the smallest shapes the seed's structure serves
    c.hidden = 2048;
    c.n_routed = 8;
    c.inter = 128;
  }
  c.validate();
  return c;
}

namespace {

constexpr int kDenseInter = 256;  // the dense layers' MLP (K4 never reads it)
int num_layers(const ReleaseOptions& o) { return o.full ? 60 : 5; }
int written_layers(const ReleaseOptions& o) { return o.full ? 4 : 5; }
constexpr int kFirstK4 = 3;

// One tensor: rows of row_bytes, each made by gen(row, out).
struct Item {
  std::string name, dtype;
  std::vector<int64_t> shape;
  int64_t rows = 0;
  uint64_t row_bytes = 0;
  std::function<void(int64_t, uint8_t*)> gen;
};

// Synthetic MXFP4 row i of an expert projection (C inputs): packed bytes and scales, every
// 32-block holding a magnitude 4 or 6 (element 0 of the block becomes 4 where none does).
void mxfp4_row(uint64_t kw, uint64_t ks, int64_t C, int64_t i, uint8_t* packed, uint8_t* scales) {
  fp4_packed(kw, uint64_t(i) * uint64_t(C / 2), uint64_t(C / 2), packed);
  if (scales) expert_scales(ks, uint64_t(i) * uint64_t(C / 32), uint64_t(C / 32), scales);
  for (int64_t b = 0; b < C / 32; ++b) {
    uint8_t* blk = packed + 16 * b;
    bool big = false;
    for (int k = 0; k < 16; ++k) big = big || (blk[k] & 7) >= 6 || ((blk[k] >> 4) & 7) >= 6;
    if (!big) blk[0] = uint8_t((blk[0] & 0xF8u) | 6u);  // keep element 0's sign
  }
}

struct Gen {
  const ReleaseOptions& o;
  Config c;
  uint64_t key(const std::string& k4_name) const { return tensor_key(o.seed, k4_name); }

  Item expert(int layer, int e, int p, bool weight) const {  // p: 0 w1, 1 w3, 2 w2
    const bool sh = e == c.shared_expert();
    const T wt[3] = {T::W1, T::W3, T::W2}, stt[3] = {T::W1Scale, T::W3Scale, T::W2Scale};
    const int64_t TI = int64_t(c.tp) * c.inter, R = p < 2 ? TI : c.hidden, C = p < 2 ? c.hidden : TI;
    const uint64_t kw = key(hf::name(wt[p], layer, e, sh)), ks = key(hf::name(stt[p], layer, e, sh));
    Item it;
    it.rows = R;
    const bool inv = o.layout == Layout::Mxfp8;
    it.name = hf::release_name(weight ? wt[p] : stt[p], layer, e, sh, inv);
    if (!weight) {  // scales: mxfp4 as generated; mxfp8 six binades lower (E4M3 = E2M1 * 64)
      it.dtype = "U8";
      it.shape = {R, C / 32};
      it.row_bytes = uint64_t(C / 32);
      const int shift = inv ? 6 : 0;
      it.gen = [=](int64_t i, uint8_t* out) {
        expert_scales(ks, uint64_t(i) * uint64_t(C / 32), uint64_t(C / 32), out);
        for (int64_t j = 0; j < C / 32; ++j) out[j] = uint8_t(out[j] - shift);
      };
      return it;
    }
    if (o.layout == Layout::Mxfp4) {
      it.dtype = "U8";
      it.shape = {R, C / 2};
      it.row_bytes = uint64_t(C / 2);
      it.gen = [=](int64_t i, uint8_t* out) { mxfp4_row(kw, ks, C, i, out, nullptr); };
      return it;
    }
    it.shape = {R, C};
    const bool bf16 = o.layout == Layout::Bf16;
    it.dtype = bf16 ? "BF16" : "F8_E4M3";
    it.row_bytes = uint64_t(C) * (bf16 ? 2 : 1);
    it.gen = [=](int64_t i, uint8_t* out) {
      std::vector<uint8_t> packed(size_t(C / 2)), scales(size_t(C / 32));
      mxfp4_row(kw, ks, C, i, packed.data(), scales.data());
      for (int64_t j = 0; j < C; ++j) {
        const uint8_t b = packed[size_t(j / 2)], nib = j % 2 ? fp4_hi(b) : fp4_lo(b);
        if (bf16) {
          const float v = float(std::ldexp(double(e2m1_to_f32(nib)), int(scales[size_t(j / 32)]) - 127));
          const uint16_t h = bf16_bits_rne(v);
          std::memcpy(out + 2 * j, &h, 2);
        } else {
          out[j] = e4m3_bits(e2m1_to_f32(nib) * 64.0f, Fp8Overflow::Saturate);
        }
      }
    };
    return it;
  }

  Item o_proj(int layer, bool weight) const {
    const int64_t H = c.hidden, TOK = int64_t(c.tp) * c.o_k();
    const uint64_t k = key(hf::name(T::OProj, layer)), ks = key(hf::name(T::OProjScale, layer));
    Item it;
    it.rows = H;
    if (o.layout != Layout::Mxfp8) {
      it.name = hf::release_name(T::OProj, layer, -1, false, false);
      it.dtype = "BF16";
      it.shape = {H, TOK};
      it.row_bytes = uint64_t(TOK) * 2;
      it.gen = [=](int64_t i, uint8_t* out) {
        normal_bf16(k, i % 97 == 5 ? 0.02 / 4096 : 0.02, uint64_t(i * TOK), uint64_t(TOK), reinterpret_cast<uint16_t*>(out));
      };
    } else if (weight) {
      it.name = hf::release_name(T::OProj, layer, -1, false, true);
      it.dtype = "F8_E4M3";
      it.shape = {H, TOK};
      it.row_bytes = uint64_t(TOK);
      it.gen = [=](int64_t i, uint8_t* out) { e4m3_codes(k, uint64_t(i * TOK), uint64_t(TOK), out); };
    } else {
      it.name = hf::release_name(T::OProjScale, layer, -1, false, true);
      it.dtype = "U8";
      it.shape = {H, TOK / 32};
      it.row_bytes = uint64_t(TOK / 32);
      it.gen = [=](int64_t i, uint8_t* out) {  // 2^-12 .. 2^-9
        expert_scales(ks, uint64_t(i * (TOK / 32)), uint64_t(TOK / 32), out);
        for (int64_t j = 0; j < TOK / 32; ++j) out[j] = uint8_t(out[j] - 6);
      };
    }
    return it;
  }

  // A 1-D or 2-D tensor of normal values, rows of `cols`.
  Item normal(const std::string& name, const std::string& k4_key, const std::string& dtype, std::vector<int64_t> shape,
              double sigma) const {
    Item it;
    it.name = name;
    it.dtype = dtype;
    it.shape = shape;
    const int64_t cols = shape.back();
    it.rows = shape.size() == 1 ? 1 : shape[0];
    const bool f32 = dtype == "F32";
    it.row_bytes = uint64_t(cols) * (f32 ? 4 : 2);
    const uint64_t k = key(k4_key);
    it.gen = [=](int64_t i, uint8_t* out) {
      if (f32) normal_f32(k, sigma, uint64_t(i * cols), uint64_t(cols), reinterpret_cast<float*>(out));
      else normal_bf16(k, sigma, uint64_t(i * cols), uint64_t(cols), reinterpret_cast<uint16_t*>(out));
    };
    return it;
  }

  Item other(const std::string& name, std::vector<int64_t> shape) const {  // BF16, never read by K4
    return normal(name, name, "BF16", shape, 0.02);
  }

  std::string lp(int layer) const { return "language_model.model.layers." + std::to_string(layer) + "."; }

  std::vector<Item> dense_layer(int layer) const {
    const int64_t H = c.hidden;
    return {other(lp(layer) + "input_layernorm.weight", {H}),
            other(lp(layer) + "self_attn.q_proj.weight", {256, H}),
            other(lp(layer) + "mlp.gate_proj.weight", {kDenseInter, H}),
            other(lp(layer) + "mlp.up_proj.weight", {kDenseInter, H}),
            other(lp(layer) + "mlp.down_proj.weight", {H, kDenseInter}),
            other(lp(layer) + "post_attention_layernorm.weight", {H})};
  }

  std::vector<Item> k4_dense(int layer) const {
    const int64_t H = c.hidden, E = c.n_routed;
    std::vector<Item> v = {other(lp(layer) + "input_layernorm.weight", {H}),
                           other(lp(layer) + "self_attn.q_proj.weight", {256, H}),
                           other(lp(layer) + "self_attn.indexer.wk.weight", {128, H}),
                           normal(hf::release_name(T::PostNorm, layer, -1, false, false), hf::name(T::PostNorm, layer), "BF16",
                                  {H}, 0.1),
                           o_proj(layer, true)};
    if (o.layout == Layout::Mxfp8) v.push_back(o_proj(layer, false));
    v.push_back(normal(hf::release_name(T::Gate, layer, -1, false, false), hf::name(T::Gate, layer), "F32", {E, H}, 0.02));
    v.push_back(normal(hf::release_name(T::Bias, layer, -1, false, false), hf::name(T::Bias, layer), "F32", {E}, 0.01));
    return v;
  }

  void experts(int layer, int e0, int e1, std::vector<Item>& v) const {
    for (int e = e0; e < e1; ++e)
      for (int p : {0, 2, 1}) {  // the release's order inside a shard is its own: not the loader's
        v.push_back(expert(layer, e, p, true));
        if (o.layout != Layout::Bf16) v.push_back(expert(layer, e, p, false));
      }
  }
};

void write_shard(const std::string& path, const std::vector<Item>& items, uint64_t& done, uint64_t total,
                 const std::function<void(uint64_t, uint64_t)>& progress) {
  st::Writer w(path, false);
  for (const Item& it : items) w.declare_raw(it.name, it.dtype, it.shape, uint64_t(it.rows) * it.row_bytes);
  w.set_metadata("format", "pt");
  w.begin();
  constexpr uint64_t kChunk = 16u << 20;
  std::vector<uint8_t> buf;
  for (const Item& it : items) {
    const int64_t per = std::max<int64_t>(1, int64_t(kChunk / std::max<uint64_t>(1, it.row_bytes)));
    for (int64_t r0 = 0; r0 < it.rows; r0 += per) {
      const int64_t n = std::min(per, it.rows - r0);
      buf.resize(size_t(n) * it.row_bytes);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) it.gen(r0 + i, buf.data() + size_t(i) * it.row_bytes);  // rows are independent
      w.write(buf.data(), buf.size());
      done += buf.size();
      if (progress) progress(done, total);
    }
  }
  w.finish();
}

nlohmann::ordered_json config_json(const ReleaseOptions& o, const Config& c) {
  const int L = num_layers(o);
  nlohmann::ordered_json moe = nlohmann::ordered_json::array(), sparse = nlohmann::ordered_json::array();
  for (int l = 0; l < L; ++l) {
    // the two list spellings the public files use: booleans (bf16 layout) and 0/1
    if (o.layout == Layout::Bf16) moe.push_back(l >= kFirstK4);
    else moe.push_back(l >= kFirstK4 ? 1 : 0);
    sparse.push_back(l >= kFirstK4 ? 1 : 0);
  }
  nlohmann::ordered_json t;
  t["model_type"] = "minimax_m3";
  t["hidden_size"] = c.hidden;
  t["num_attention_heads"] = c.heads * c.tp;
  t["num_key_value_heads"] = c.tp;
  t["head_dim"] = c.head_dim;
  t["num_hidden_layers"] = L;
  t["num_local_experts"] = c.n_routed;
  t["num_experts_per_tok"] = c.top_k;
  t["n_shared_experts"] = 1;
  t["intermediate_size"] = c.inter * c.tp;
  t["shared_intermediate_size"] = c.inter * c.tp;
  t["dense_intermediate_size"] = kDenseInter;
  t["moe_layer_freq"] = moe;
  t["scoring_func"] = "sigmoid";
  t["use_routing_bias"] = true;
  t["routed_scaling_factor"] = 2.0;
  t["swiglu_alpha"] = 1.702;
  t["swiglu_limit"] = 7.0;
  t["rms_norm_eps"] = 1e-6;
  t["use_gemma_norm"] = true;
  t["sparse_attention_config"] = {{"sparse_topk_blocks", c.topk_blocks}, {"sparse_block_size", c.sparse_block},
                                  {"sparse_init_block", c.init_blocks},  {"sparse_local_block", c.local_blocks},
                                  {"sparse_attention_freq", sparse}};
  nlohmann::ordered_json j;
  j["architectures"] = {"MiniMaxM3SparseForConditionalGeneration"};
  j["model_type"] = "minimax_m3_vl";
  j["text_config"] = t;
  j["vision_config"] = {{"hidden_size", 64}};
  if (o.layout == Layout::Mxfp8) j["quantization_config"] = {{"quant_method", "mxfp8"}, {"weight_block_size", {1, 32}}};
  if (o.layout == Layout::Mxfp4)
    j["quantization_config"] = {{"quant_method", "quark"},
                                {"exclude", {"*self_attn*", "*gate*", "lm_head"}},
                                {"global_quant_config",
                                 {{"weight", {{"dtype", "fp4"}, {"qscheme", "per_group"}, {"group_size", 32},
                                              {"scale_format", "e8m0"}, {"round_method", "half_even"},
                                              {"scale_calculation_mode", "even"}}}}}};
  return j;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
  f.close();
  if (!f) throw std::runtime_error("write to " + p.string() + " failed");
}

}  // namespace

void write_release(const std::string& dir, const ReleaseOptions& o, bool overwrite,
                   const std::function<void(uint64_t, uint64_t)>& progress) {
  const Config c = release_config(o);
  std::error_code ec;
  const fs::path target(dir);
  if (fs::exists(target, ec)) {
    if (!fs::is_directory(target, ec)) throw std::invalid_argument("output " + dir + " exists and is not a directory");
    if (!overwrite) throw std::invalid_argument("output " + dir + " exists; pass --force to overwrite it");
  }
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec)) throw std::invalid_argument("output " + dir + ": directory " + parent.string() + " does not exist");
  const fs::path tmp = temporary_path(target.string(), int(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp);
  struct Cleanup {
    fs::path p;
    bool keep = false;
    ~Cleanup() {
      std::error_code e;
      if (!keep) fs::remove_all(p, e);
    }
  } cleanup{tmp};

  const Gen g{o, c};
  std::vector<std::vector<Item>> shards(o.full ? 3 : 4);
  shards[0].push_back(g.other("language_model.model.embed_tokens.weight", {64, c.hidden}));
  {
    Item v;  // a vision tensor of a dtype no reader here knows
    v.name = "vision_tower.blocks.0.attn.qkv.weight";
    v.dtype = "F8_E4M3FNUZ";
    v.shape = {64, 64};
    v.rows = 64;
    v.row_bytes = 64;
    v.gen = [](int64_t, uint8_t* out) { std::memset(out, 0x38, 64); };
    shards[0].push_back(v);
  }
  for (int l = 0; l < kFirstK4; ++l)
    for (Item& it : g.dense_layer(l)) shards[0].push_back(std::move(it));
  shards[1] = g.k4_dense(kFirstK4);
  g.experts(kFirstK4, 0, c.n_routed / 2, shards[1]);
  g.experts(kFirstK4, c.n_routed / 2, c.n_routed + 1, shards[2]);
  for (int l = kFirstK4 + 1; l < written_layers(o); ++l) {
    for (Item& it : g.k4_dense(l)) shards[3].push_back(std::move(it));
    g.experts(l, 0, c.n_routed + 1, shards[3]);
  }
  uint64_t total = 0, done = 0;
  for (const auto& s : shards)
    for (const Item& it : s) total += uint64_t(it.rows) * it.row_bytes;
  nlohmann::ordered_json map;
  const int n = int(shards.size());
  for (int i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, n);
    write_shard((tmp / name).string(), shards[size_t(i)], done, total, progress);
    for (const Item& it : shards[size_t(i)]) map[it.name] = name;
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = map;
  write_text(tmp / "model.safetensors.index.json", index.dump(2) + "\n");
  write_text(tmp / "config.json", config_json(o, c).dump(2) + "\n");
  // Commit: the old directory aside, the new one in place, the old one removed.
  const fs::path old = tmp.string() + "-old";
  if (fs::exists(target, ec)) fs::rename(target, old);
  fs::rename(tmp, target);
  cleanup.keep = true;
  fs::remove_all(old, ec);
}

}  // namespace k4::synth
