// checkpoint.cpp -- see checkpoint.hpp.
#include "golden/inputs/checkpoint.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "golden/inputs/expert_cache.hpp"
#include "golden/inputs/hf_config.hpp"
#include "golden/inputs/hf_names.hpp"
#include "golden/inputs/weight_prep.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"

namespace k4 {
using Dtype = st::SafetensorsDtype;
using T = hf::Tensor;

// ---- the shape -------------------------------------------------------------------------

CheckpointShape checkpoint_shape(const Checkpoint& ck, const std::string& preset_name, int tp, int layer) {
  CheckpointShape s;
  if (ck.config_json().empty()) {
    if (preset_name.empty())
      throw std::invalid_argument("checkpoint " + ck.path() + " has no config.json: --preset is required");
    s.cfg = preset(preset_name, tp);
    s.layer = layer < 0 ? 0 : layer;
    return s;
  }
  const std::string where = "checkpoint " + ck.path() + ": config.json";
  const HfModel m = hf_model_from_config(ck.config_json(), where, tp);
  if (!preset_name.empty()) require_preset_agrees(m.cfg, preset(preset_name, tp), where);
  s.cfg = m.cfg;
  s.layer = choose_k4_layer(m, layer, where);
  s.from_config_json = true;
  s.k4_layers = m.k4_layers;
  return s;
}

// ---- the plan: names found, forms checked ----------------------------------------------

namespace {

float load_f32(const uint8_t* p, Dtype d, uint64_t i) {
  if (d == Dtype::BF16) {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    return bf16_to_f32(b);
  }
  float f;
  std::memcpy(&f, p + 4 * i, 4);
  return f;
}

// x is row `row`, columns [col0, col0 + n) of the tensor.
void reject_nonfinite(const float* x, int64_t n, const std::string& ck, const std::string& tensor, int64_t row, int64_t col0) {
  for (int64_t i = 0; i < n; ++i)
    if ((f32_bits(x[i]) & 0x7F800000u) == 0x7F800000u)
      throw std::invalid_argument("checkpoint " + ck + ": tensor '" + tensor + "' element [" + std::to_string(row) + ", " +
                                  std::to_string(col0 + i) + "] is " + (std::isnan(x[i]) ? "NaN" : "Inf") +
                                  ": weights quantized on load (BF16 / F32 / MXFP8) must be finite");
}

// The name a checkpoint uses for tensor t, or a "missing" error listing what was looked for.
std::string resolve(const Checkpoint& ck, T t, int layer, int e = -1, bool sh = false) {
  const std::vector<std::string> c = hf::candidates(t, layer, e, sh);
  const std::string n = ck.find(c);
  if (!n.empty()) return n;
  std::string tried;
  for (size_t i = 0; i < c.size(); ++i) tried += (i ? ", " : "") + c[i];
  throw std::invalid_argument("checkpoint " + ck.path() + ": tensor '" + hf::name(t, layer, e, sh) +
                              "' is missing (looked for " + tried + ")");
}

enum class OForm { Fp8RowScale, Mxfp8, Wide };  // Wide: BF16 / F32
enum class XForm { Mxfp4, Mxfp8, Wide };  // Mxfp8: E4M3 codes + E8M0 1x32 scales, as stored

struct Proj {  // one expert projection, resolved
  std::string w, s;  // s empty unless Mxfp4
  XForm form = XForm::Mxfp4;
  Dtype dtype = Dtype::U8;
};
struct ExpertPlan {
  Proj p[3];  // w1 (gate), w3 (up), w2 (down)
  bool fp8 = false;  // Config::expert_fp8(e): the expert's tables hold E4M3 (V7, V6.1)
};

struct DensePlan {
  std::string norm, o, o_scale, gate, bias;
  OForm oform = OForm::Wide;
};

void add_use(LayerPlan* plan, const Checkpoint& ck, const std::string& role, const std::string& n, const std::string& conv) {
  if (!plan) return;
  const st::TensorView& v = ck.at(n);
  plan->tensors.push_back({role, n, ck.shard_of(n), st::dtype_name(v.dtype), v.shape, conv});
}

DensePlan plan_dense(const Checkpoint& ck, const Config& c, int layer, LayerPlan* plan) {
  const int64_t H = c.hidden, TOK = int64_t(c.tp) * c.o_k(), E = c.n_routed;
  DensePlan d;
  d.norm = resolve(ck, T::PostNorm, layer);
  ck.get(d.norm, {Dtype::BF16, Dtype::F32}, {H});
  d.o = resolve(ck, T::OProj, layer);
  d.gate = resolve(ck, T::Gate, layer);
  d.bias = resolve(ck, T::Bias, layer);
  add_use(plan, ck, "post-attention norm g", d.norm, ck.at(d.norm).dtype == Dtype::BF16 ? "as stored" : "f32-to-bf16-rne");
  const Dtype od = ck.at(d.o).dtype;
  if (od == Dtype::F8_E4M3) {
    ck.get(d.o, {Dtype::F8_E4M3}, {H, TOK});
    d.o_scale = resolve(ck, T::OProjScale, layer);
    const st::TensorView& s = ck.at(d.o_scale);
    if (s.dtype == Dtype::F32) {
      d.oform = OForm::Fp8RowScale;
      if (s.shape == std::vector<int64_t>{H, 1}) ck.get(d.o_scale, {Dtype::F32}, {H, 1});
      else ck.get(d.o_scale, {Dtype::F32}, {H});
    } else {
      d.oform = OForm::Mxfp8;
      ck.get(d.o_scale, {Dtype::U8, Dtype::F8_E8M0}, {H, TOK / 32});
    }
    const char* conv = d.oform == OForm::Mxfp8 ? "mxfp8-dequant, then ptpc-fp8-vllm on each rank's shard"
                                               : "as stored (E4M3 with one f32 scale a row, every rank the same)";
    add_use(plan, ck, "o_proj", d.o, conv);
    add_use(plan, ck, "o_proj scale", d.o_scale, d.oform == OForm::Mxfp8 ? "E8M0 1x32, used by the dequantization" : "as stored");
  } else {
    ck.get(d.o, {Dtype::BF16, Dtype::F32}, {H, TOK});
    d.oform = OForm::Wide;
    add_use(plan, ck, "o_proj", d.o, "ptpc-fp8-vllm on each rank's shard (per-rank s_o)");
  }
  ck.get(d.gate, {Dtype::BF16, Dtype::F32}, {E, H});
  add_use(plan, ck, "router gate", d.gate,
          ck.at(d.gate).dtype == Dtype::F32 ? "f32-to-bf16-rne (the F32 kept for router.gate=f32)" : "as stored");
  ck.get(d.bias, {Dtype::F32, Dtype::BF16}, {E});
  add_use(plan, ck, "routing bias", d.bias, ck.at(d.bias).dtype == Dtype::F32 ? "as stored" : "bf16 widened to f32");
  return d;
}

// The names of every tensor the layer may read that the checkpoint holds (no shard opened).
std::vector<std::string> layer_names(const Checkpoint& ck, const Config& c, int layer) {
  std::vector<std::string> names;
  for (T t : {T::PostNorm, T::OProj, T::Gate, T::Bias, T::OProjScale}) names.push_back(ck.find(hf::candidates(t, layer)));
  for (int e = 0; e <= c.n_routed; ++e)
    for (T t : {T::W1, T::W1Scale, T::W3, T::W3Scale, T::W2, T::W2Scale})
      names.push_back(ck.find(hf::candidates(t, layer, e, e == c.shared_expert())));
  names.erase(std::remove(names.begin(), names.end(), std::string()), names.end());
  return names;
}

const char* kProjName[3] = {"w1 (gate)", "w3 (up)", "w2 (down)"};

ExpertPlan plan_expert(const Checkpoint& ck, const Config& c, int layer, int e, prep::MxScale mx, LayerPlan* plan) {
  const bool sh = e == c.shared_expert();
  const int64_t H = c.hidden, TI = int64_t(c.tp) * c.inter;
  const T wt[3] = {T::W1, T::W3, T::W2}, stt[3] = {T::W1Scale, T::W3Scale, T::W2Scale};
  ExpertPlan x;
  x.fp8 = c.expert_fp8(e);
  const std::string who = sh ? "shared expert" : "expert " + std::to_string(e);
  for (int p = 0; p < 3; ++p) {
    Proj& q = x.p[p];
    const int64_t R = p < 2 ? TI : H, C = p < 2 ? H : TI;
    q.w = resolve(ck, wt[p], layer, e, sh);
    const st::TensorView& w = ck.at(q.w);
    q.dtype = w.dtype;
    if (x.fp8) {  // moe.experts = mxfp8 (V7) / moe.shared_fp8 (V6.1): E4M3 and E8M0 as stored
      if (w.dtype != Dtype::F8_E4M3)
        throw std::invalid_argument(
            "checkpoint " + ck.path() + ": tensor '" + q.w + "' is " + st::dtype_name(w.dtype) + ", expected F8_E4M3: " +
            (c.variant.experts == ExpertFormat::mxfp8 ? "moe.experts = mxfp8 (V7)" : "moe.shared_fp8 = on (V6.1)") +
            " reads the " + who + " as MXFP8 codes with E8M0 1x32 scales, as stored (the MiniMax-M3-MXFP8 release); "
            "no MXFP8 quantization of other forms is modelled");
      q.form = XForm::Mxfp8;
      ck.get(q.w, {Dtype::F8_E4M3}, {R, C});
      q.s = resolve(ck, stt[p], layer, e, sh);
      ck.get(q.s, {Dtype::U8, Dtype::F8_E8M0}, {R, C / 32});
      add_use(plan, ck, who + " " + kProjName[p], q.w, "mxfp8-stored (E4M3 codes as stored)");
      add_use(plan, ck, who + " " + kProjName[p] + " scale", q.s, "E8M0 as stored");
      continue;
    }
    if (w.dtype == Dtype::F8_E4M3)
      throw std::invalid_argument(
          "checkpoint " + ck.path() + ": tensor '" + q.w +
          "' is F8_E4M3 (MXFP8 experts, the MiniMax-M3-MXFP8 release): K4 with MXFP8 experts is the "
          "MXFP8-experts variant (VARIANTS.md V7): --variant moe.experts=mxfp8" +
          (sh ? " (or, for an MXFP8 shared expert only, moe.shared_fp8=on)" : "") +
          "; the seed's MXFP4 experts come from the amd/MiniMax-M3-MXFP4 release or the BF16 release");
    if (w.dtype == Dtype::U8) {
      q.form = XForm::Mxfp4;
      ck.get(q.w, {Dtype::U8}, {R, C / 2});
      q.s = resolve(ck, stt[p], layer, e, sh);
      ck.get(q.s, {Dtype::U8, Dtype::F8_E8M0}, {R, C / 32});
      add_use(plan, ck, who + " " + kProjName[p], q.w, "MXFP4 as stored (even element in the low nibble)");
      add_use(plan, ck, who + " " + kProjName[p] + " scale", q.s, "E8M0 as stored");
    } else {
      q.form = XForm::Wide;
      ck.get(q.w, {Dtype::BF16, Dtype::F32}, {R, C});
      add_use(plan, ck, who + " " + kProjName[p], q.w, std::string(prep::mx_scale_name(mx)) + " per 32-block along the input");
    }
  }
  return x;
}

}  // namespace

LayerPlan plan_layer(const Checkpoint& ck, const Config& cfg, int layer, prep::MxScale mx) {
  cfg.validate();
  LayerPlan plan;
  // Names first (no shard opened), then the shards (a missing one named), then the headers.
  plan.shards = ck.require_shards(layer_names(ck, cfg, layer));
  const DensePlan d = plan_dense(ck, cfg, layer, &plan);
  std::string experts, shared;
  for (int e = 0; e <= cfg.n_routed; ++e) {
    const ExpertPlan x = plan_expert(ck, cfg, layer, e, mx, &plan);
    std::string& form = e == cfg.shared_expert() ? shared : experts;
    const std::string f = x.p[0].form == XForm::Mxfp4   ? "mxfp4-stored"
                          : x.p[0].form == XForm::Mxfp8 ? "mxfp8-stored"
                                                        : prep::mx_scale_name(mx);
    if (form.empty()) form = f;
    else if (form != f) form = "mixed";
  }
  nlohmann::ordered_json j;
  j["o_proj"] = d.oform == OForm::Wide     ? "ptpc-fp8-vllm per rank"
                : d.oform == OForm::Mxfp8 ? "mxfp8-dequant + ptpc-fp8-vllm per rank"
                                          : "fp8-row-scale-stored";
  j["router_gate"] = ck.at(d.gate).dtype == Dtype::F32 ? "f32-to-bf16-rne" : "bf16-stored";
  j["experts"] = experts;
  j["shared_expert"] = shared;
  j["rules"] = "docs/golden-format.md, Checkpoints; ../shared/design/VARIANTS.md section 8";
  plan.prep_json = j.dump();
  return plan;
}

// ---- experts on demand -----------------------------------------------------------------

namespace {

// One projection's rank slice: rows [r0, r0 + rows) x input columns [c0, c0 + cols) of the
// full (R, C) matrix, as packed pairs + scales (cols / 2 and cols / 32 bytes a row), or for
// MXFP8 as E4M3 codes + scales (cols and cols / 32 bytes a row), both copied as stored.
void load_projection(const Checkpoint& ck, const Proj& q, prep::MxScale mx, int64_t C, int64_t r0, int64_t rows, int64_t c0,
                     int64_t cols, uint8_t* packed, uint8_t* scales) {
  const st::TensorView& w = ck.at(q.w);
  if (q.form == XForm::Mxfp4 || q.form == XForm::Mxfp8) {
    const int64_t per = q.form == XForm::Mxfp8 ? 1 : 2;  // elements a byte
    const st::TensorView& s = ck.at(q.s);
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(packed + i * (cols / per), w.data + (r0 + i) * (C / per) + c0 / per, size_t(cols / per));
      std::memcpy(scales + i * (cols / 32), s.data + (r0 + i) * (C / 32) + c0 / 32, size_t(cols / 32));
    }
    return;
  }
  std::vector<float> x(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) x[size_t(j)] = load_f32(w.data, w.dtype, uint64_t((r0 + i) * C + c0 + j));
    reject_nonfinite(x.data(), cols, ck.path(), q.w, r0 + i, c0);
    prep::mxfp4_row(x.data(), int(cols), mx, packed + i * (cols / 2), scales + i * (cols / 32));
  }
}

// Builds ExpertWeights for (rank, e) on demand; thread-safe, a cache of the most recent 16,
// so unrouted experts are never materialized.
class CheckpointExpertSource : public ExpertSource {
 public:
  CheckpointExpertSource(std::shared_ptr<const Checkpoint> ck, const Config& cfg, std::vector<ExpertPlan> plans,
                         prep::MxScale mx, std::function<void(uint64_t)> built)
      : ck_(std::move(ck)), cfg_(cfg), plans_(std::move(plans)), mx_(mx), built_(std::move(built)) {}

  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    return cache_.get(rank, e, [&] {
      std::shared_ptr<const ExpertWeights> ew = build(rank, e);
      if (built_) built_(++n_built_);
      return ew;
    });
  }

 private:
  std::shared_ptr<ExpertWeights> build(int rank, int e) const {
    const Config& c = cfg_;
    if (rank < 0 || rank >= c.tp || e < 0 || e > c.n_routed)
      throw std::invalid_argument("expert(" + std::to_string(rank) + ", " + std::to_string(e) + ") is outside rank 0.." +
                                  std::to_string(c.tp - 1) + ", expert 0.." + std::to_string(c.n_routed));
    const ExpertPlan& x = plans_[size_t(e)];
    const int64_t H = c.hidden, I = c.inter, TI = int64_t(c.tp) * c.inter;
    const int64_t per = x.fp8 ? 1 : 2;  // elements a stored byte: E4M3 one, E2M1 pairs two
    auto ew = std::make_shared<ExpertWeights>();
    ew->w13.resize(static_cast<size_t>(2 * I * H / per));
    ew->s13.resize(static_cast<size_t>(2 * I * H / 32));
    ew->w2.resize(static_cast<size_t>(H * I / per));
    ew->s2.resize(static_cast<size_t>(H * I / 32));
    // gate rows (w1) then up rows (w3): rows [r*inter, (r+1)*inter) of (tp*inter, hidden)
    for (int p = 0; p < 2; ++p)
      load_projection(*ck_, x.p[p], mx_, H, rank * I, I, 0, H, ew->w13.data() + p * I * H / per, ew->s13.data() + p * I * H / 32);
    // down: columns [r*inter, (r+1)*inter) of (hidden, tp*inter)
    load_projection(*ck_, x.p[2], mx_, TI, 0, H, rank * I, I, ew->w2.data(), ew->s2.data());
    return ew;
  }

  std::shared_ptr<const Checkpoint> ck_;
  Config cfg_;
  std::vector<ExpertPlan> plans_;
  prep::MxScale mx_;
  std::function<void(uint64_t)> built_;
  mutable std::atomic<uint64_t> n_built_{0};
  ExpertCache cache_{16};
};

// o_proj -> every rank's (w_o, s_o).
void load_o_proj(const Checkpoint& ck, const Config& c, const DensePlan& d, LayerWeights& lw,
                 const std::function<void(uint64_t, uint64_t)>& progress) {
  const int64_t H = c.hidden, OK = c.o_k(), TOK = int64_t(c.tp) * OK;
  const st::TensorView& ow = ck.at(d.o);
  for (auto& R : lw.ranks) R.w_o.resize(static_cast<size_t>(H * OK)), R.s_o.resize(static_cast<size_t>(H));
  if (d.oform == OForm::Fp8RowScale) {
    const st::TensorView& sv = ck.at(d.o_scale);
    for (int r = 0; r < c.tp; ++r)
      for (int64_t i = 0; i < H; ++i) {
        std::memcpy(lw.ranks[size_t(r)].w_o.data() + i * OK, ow.data + i * TOK + r * OK, size_t(OK));
        lw.ranks[size_t(r)].s_o[size_t(i)] = load_f32(sv.data, Dtype::F32, uint64_t(i));
      }
    return;
  }
  const st::TensorView* sv = d.oform == OForm::Mxfp8 ? &ck.at(d.o_scale) : nullptr;
  // An exception must not leave an OpenMP region (std::terminate): each row's error is kept
  // and the first row's is thrown after the loop.
  std::vector<std::string> errors(static_cast<size_t>(H));
  std::atomic<uint64_t> rows_done{0};
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < H; ++i) {  // rows are independent: the same bits for any thread count
    const uint64_t done = ++rows_done;
    if (progress && omp_get_thread_num() == 0 && done % 64 == 0) progress(done, uint64_t(H));
    std::vector<float> x(static_cast<size_t>(TOK));
    for (int64_t j = 0; j < TOK; ++j)
      x[size_t(j)] = sv ? prep::mxfp8_value(ow.data[i * TOK + j], sv->data[i * (TOK / 32) + j / 32])
                        : load_f32(ow.data, ow.dtype, uint64_t(i * TOK + j));
    try {
      reject_nonfinite(x.data(), TOK, ck.path(), d.o, i, 0);
    } catch (const std::exception& e) {
      errors[size_t(i)] = e.what();
      continue;
    }
    for (int r = 0; r < c.tp; ++r)  // each rank's own shard: its own amax, its own scale
      lw.ranks[size_t(r)].s_o[size_t(i)] =
          prep::ptpc_fp8_row(x.data() + r * OK, int(OK), lw.ranks[size_t(r)].w_o.data() + i * OK);
  }
  for (const std::string& e : errors)
    if (!e.empty()) throw std::invalid_argument(e);
  if (progress) progress(uint64_t(H), uint64_t(H));
}

}  // namespace

LayerWeights load_checkpoint_layer(std::shared_ptr<const Checkpoint> ck, const Config& cfg, int layer, prep::MxScale mx,
                                   const std::function<void(uint64_t, uint64_t)>& progress,
                                   std::function<void(uint64_t)> expert_progress) {
  cfg.validate();
  const Config& c = cfg;
  ck->require_shards(layer_names(*ck, c, layer));  // a missing shard is named before any work
  const DensePlan d = plan_dense(*ck, c, layer, nullptr);
  std::vector<ExpertPlan> experts;
  for (int e = 0; e <= c.n_routed; ++e) experts.push_back(plan_expert(*ck, c, layer, e, mx, nullptr));
  const int64_t H = c.hidden, E = c.n_routed;
  LayerWeights lw;
  lw.cfg = cfg;
  lw.ranks.resize(static_cast<size_t>(c.tp));
  std::vector<uint16_t> g_post(static_cast<size_t>(H)), w_gate(static_cast<size_t>(E * H));
  std::vector<float> w_gate_f32(static_cast<size_t>(E * H));  // as stored (F32: the router.gate = f32 operand)
  std::vector<float> bias(static_cast<size_t>(E));
  {
    const st::TensorView& t = ck->at(d.norm);
    for (int64_t i = 0; i < H; ++i) g_post[size_t(i)] = bf16_bits_rne(load_f32(t.data, t.dtype, uint64_t(i)));
  }
  {
    const st::TensorView& t = ck->at(d.gate);
    for (int64_t i = 0; i < E * H; ++i) {
      w_gate_f32[size_t(i)] = load_f32(t.data, t.dtype, uint64_t(i));
      w_gate[size_t(i)] = bf16_bits_rne(w_gate_f32[size_t(i)]);  // f32-to-bf16-rne (VARIANTS.md 8.2)
    }
  }
  {
    const st::TensorView& t = ck->at(d.bias);
    for (int64_t i = 0; i < E; ++i) bias[size_t(i)] = load_f32(t.data, t.dtype, uint64_t(i));
  }
  load_o_proj(*ck, c, d, lw, progress);
  for (auto& R : lw.ranks) {
    R.g_post = g_post;
    R.w_gate = w_gate;
    R.w_gate_f32 = w_gate_f32;
    R.bias = bias;
  }
  lw.experts = std::make_shared<CheckpointExpertSource>(ck, cfg, std::move(experts), mx, std::move(expert_progress));
  return lw;
}

std::vector<RankWeights> load_o_proj_ranks(const Checkpoint& ck, const Config& cfg, int layer) {
  cfg.validate();
  const DensePlan d = plan_dense(ck, cfg, layer, nullptr);
  LayerWeights lw;
  lw.ranks.resize(static_cast<size_t>(cfg.tp));
  load_o_proj(ck, cfg, d, lw, {});
  return lw.ranks;
}

LayerWeights load_checkpoint_layer(const std::string& path, const Config& cfg, int layer, prep::MxScale mx) {
  return load_checkpoint_layer(std::make_shared<const Checkpoint>(path), cfg, layer, mx);
}

}  // namespace k4
