// checkpoint.cpp -- see checkpoint.hpp.
#include "golden/inputs/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "golden/inputs/hf_names.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/mx.hpp"

namespace k4 {
namespace fs = std::filesystem;
using st::SafetensorsDtype;

namespace {

float load_f32(const uint8_t* p, SafetensorsDtype d, uint64_t i) {
  if (d == SafetensorsDtype::BF16) {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    return bf16_to_f32(b);
  }
  float f;
  std::memcpy(&f, p + 4 * i, 4);
  return f;
}

// x is row `row`, columns [col0, col0 + n) of the tensor.
void reject_nonfinite(const float* x, int n, const std::string& file, const std::string& tensor, int64_t row, int64_t col0) {
  for (int i = 0; i < n; ++i)
    if ((f32_bits(x[i]) & 0x7F800000u) == 0x7F800000u)
      throw std::invalid_argument("checkpoint " + file + ": tensor '" + tensor + "' element [" + std::to_string(row) +
                                  ", " + std::to_string(col0 + i) + "] is " + (std::isnan(x[i]) ? "NaN" : "Inf") +
                                  ": weights quantized on load (BF16 / F32) must be finite");
}

}  // namespace

void mxfp4_quantize_row(const float* x, int n, uint8_t* packed, uint8_t* scales) {
  uint8_t nib[32];
  for (int b = 0; b < n / 32; ++b) {
    scales[b] = mxfp4_quantize_block(x + 32 * b, nib);
    for (int i = 0; i < 16; ++i) packed[16 * b + i] = fp4_pack2(nib[2 * i], nib[2 * i + 1]);
  }
}

float e4m3_quantize_row(const float* x, int n, uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, fabs_f32(x[i]));
  const float scale = amax == 0.0f ? 1.0f : amax / 448.0f;
  for (int i = 0; i < n; ++i) codes[i] = e4m3_bits(x[i] / scale, Fp8Overflow::Saturate);
  return scale;
}

// ---- Checkpoint ------------------------------------------------------------------------

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  std::error_code ec;
  std::vector<std::string> paths;
  if (fs::is_directory(path, ec)) {
    try {
      for (const auto& e : fs::directory_iterator(path))
        if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
    } catch (const fs::filesystem_error& e) {
      throw std::invalid_argument("checkpoint " + path + ": cannot list the directory (" + e.code().message() + ")");
    }
    std::sort(paths.begin(), paths.end());
    if (paths.empty()) throw std::invalid_argument("checkpoint " + path + ": no *.safetensors file in the directory");
  } else if (fs::exists(path, ec)) {
    paths.push_back(path);
  } else {
    throw std::invalid_argument("checkpoint " + path + " does not exist");
  }
  for (const std::string& p : paths) {
    files_.push_back(std::make_unique<st::File>(p));
    for (const std::string& n : files_.back()->names()) {
      if (where_.count(n))
        throw std::invalid_argument("checkpoint " + path + ": tensor '" + n + "' is in both " + where_[n]->path() +
                                    " and " + p);
      where_[n] = files_.back().get();
    }
  }
}

const st::TensorView& Checkpoint::at(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw std::invalid_argument("checkpoint " + path_ + ": tensor '" + name + "' is missing");
  return it->second->at(name);
}

const st::TensorView& Checkpoint::get(const std::string& name, const std::vector<SafetensorsDtype>& dtypes,
                                      const std::vector<int64_t>& shape) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw std::invalid_argument("checkpoint " + path_ + ": tensor '" + name + "' is missing");
  return it->second->get(name, dtypes, shape);
}

// ---- experts ---------------------------------------------------------------------------

CheckpointExpertSource::CheckpointExpertSource(std::shared_ptr<const Checkpoint> ck, const Config& cfg, int layer)
    : ck_(std::move(ck)), cfg_(cfg), layer_(layer) {}

namespace {

struct ExpertNames {
  std::string w[3], s[3];  // w1, w3, w2
};
ExpertNames expert_names(const Config& c, int layer, int e) {
  const bool sh = e == c.shared_expert();
  ExpertNames n;
  n.w[0] = hf::name(hf::Tensor::W1, layer, e, sh);
  n.s[0] = hf::name(hf::Tensor::W1Scale, layer, e, sh);
  n.w[1] = hf::name(hf::Tensor::W3, layer, e, sh);
  n.s[1] = hf::name(hf::Tensor::W3Scale, layer, e, sh);
  n.w[2] = hf::name(hf::Tensor::W2, layer, e, sh);
  n.s[2] = hf::name(hf::Tensor::W2Scale, layer, e, sh);
  return n;
}

// One projection's rank slice: rows [r0, r0 + rows) x input columns [c0, c0 + cols) of the
// full (R, C) matrix, as packed pairs + scales (cols / 2 and cols / 32 bytes a row).
void load_projection(const Checkpoint& ck, const std::string& wname, const std::string& sname, int64_t R, int64_t C,
                     int64_t r0, int64_t rows, int64_t c0, int64_t cols, uint8_t* packed, uint8_t* scales) {
  const st::TensorView& w = ck.at(wname);
  if (w.dtype == SafetensorsDtype::U8) {  // MXFP4 as stored
    ck.get(wname, {SafetensorsDtype::U8}, {R, C / 2});
    const st::TensorView& s = ck.get(sname, {SafetensorsDtype::U8, SafetensorsDtype::F8_E8M0}, {R, C / 32});
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(packed + i * (cols / 2), w.data + (r0 + i) * (C / 2) + c0 / 2, size_t(cols / 2));
      std::memcpy(scales + i * (cols / 32), s.data + (r0 + i) * (C / 32) + c0 / 32, size_t(cols / 32));
    }
    return;
  }
  ck.get(wname, {SafetensorsDtype::BF16, SafetensorsDtype::F32}, {R, C});  // quantized on load
  std::vector<float> x(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) x[size_t(j)] = load_f32(w.data, w.dtype, uint64_t((r0 + i) * C + c0 + j));
    reject_nonfinite(x.data(), int(cols), ck.path(), wname, r0 + i, c0);
    mxfp4_quantize_row(x.data(), int(cols), packed + i * (cols / 2), scales + i * (cols / 32));
  }
}

}  // namespace

std::shared_ptr<ExpertWeights> CheckpointExpertSource::build(int rank, int e) const {
  const Config& c = cfg_;
  if (rank < 0 || rank >= c.tp || e < 0 || e > c.n_routed)
    throw std::invalid_argument("expert(" + std::to_string(rank) + ", " + std::to_string(e) + ") is outside rank 0.." +
                                std::to_string(c.tp - 1) + ", expert 0.." + std::to_string(c.n_routed));
  const ExpertNames n = expert_names(c, layer_, e);
  const int64_t H = c.hidden, I = c.inter, TI = int64_t(c.tp) * c.inter;
  auto ew = std::make_shared<ExpertWeights>();
  ew->w13.resize(static_cast<size_t>(2 * I * H / 2));
  ew->s13.resize(static_cast<size_t>(2 * I * H / 32));
  ew->w2.resize(static_cast<size_t>(H * I / 2));
  ew->s2.resize(static_cast<size_t>(H * I / 32));
  // gate rows (w1) then up rows (w3): rows [r*inter, (r+1)*inter) of (tp*inter, hidden)
  for (int p = 0; p < 2; ++p)
    load_projection(*ck_, n.w[p], n.s[p], TI, H, rank * I, I, 0, H, ew->w13.data() + p * I * H / 2,
                    ew->s13.data() + p * I * H / 32);
  // down: columns [r*inter, (r+1)*inter) of (hidden, tp*inter)
  load_projection(*ck_, n.w[2], n.s[2], H, TI, 0, H, rank * I, I, ew->w2.data(), ew->s2.data());
  return ew;
}

std::shared_ptr<const ExpertWeights> CheckpointExpertSource::expert(int rank, int e) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& kv : cache_)
      if (kv.first == std::make_pair(rank, e)) return kv.second;
  }
  std::shared_ptr<const ExpertWeights> ew = build(rank, e);  // outside the lock: ranks build in parallel
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : cache_)
    if (kv.first == std::make_pair(rank, e)) return kv.second;
  if (cache_.size() >= 16) cache_.erase(cache_.begin());
  cache_.push_back({{rank, e}, ew});
  return ew;
}

void CheckpointExpertSource::validate_all() const {
  const Config& c = cfg_;
  const int64_t H = c.hidden, TI = int64_t(c.tp) * c.inter;
  for (int e = 0; e <= c.n_routed; ++e) {
    const ExpertNames n = expert_names(c, layer_, e);
    for (int p = 0; p < 3; ++p) {
      const int64_t R = p < 2 ? TI : H, C = p < 2 ? H : TI;
      if (ck_->at(n.w[p]).dtype == SafetensorsDtype::U8) {
        ck_->get(n.w[p], {SafetensorsDtype::U8}, {R, C / 2});
        ck_->get(n.s[p], {SafetensorsDtype::U8, SafetensorsDtype::F8_E8M0}, {R, C / 32});
      } else {
        ck_->get(n.w[p], {SafetensorsDtype::BF16, SafetensorsDtype::F32}, {R, C});
      }
    }
  }
}

// ---- the layer -------------------------------------------------------------------------

LayerWeights load_checkpoint_layer(const std::string& path, const Config& cfg, int layer) {
  auto ck = std::make_shared<const Checkpoint>(path);
  const Config& c = cfg;
  const int64_t H = c.hidden, OK = c.o_k(), TOK = int64_t(c.tp) * OK, E = c.n_routed;
  LayerWeights lw;
  lw.cfg = cfg;
  lw.ranks.resize(static_cast<size_t>(c.tp));
  // replicated: norm weight, gate, bias
  std::vector<uint16_t> g_post(static_cast<size_t>(H)), w_gate(static_cast<size_t>(E * H));
  std::vector<float> bias(static_cast<size_t>(E));
  {
    const std::string n = hf::name(hf::Tensor::PostNorm, layer);
    const st::TensorView& t = ck->get(n, {SafetensorsDtype::BF16, SafetensorsDtype::F32}, {H});
    for (int64_t i = 0; i < H; ++i) g_post[size_t(i)] = bf16_bits_rne(load_f32(t.data, t.dtype, uint64_t(i)));
  }
  {
    const std::string n = hf::name(hf::Tensor::Gate, layer);
    const st::TensorView& t = ck->get(n, {SafetensorsDtype::BF16, SafetensorsDtype::F32}, {E, H});
    for (int64_t i = 0; i < E * H; ++i) w_gate[size_t(i)] = bf16_bits_rne(load_f32(t.data, t.dtype, uint64_t(i)));
  }
  {
    const std::string n = hf::name(hf::Tensor::Bias, layer);
    const st::TensorView& t = ck->get(n, {SafetensorsDtype::F32, SafetensorsDtype::BF16}, {E});
    for (int64_t i = 0; i < E; ++i) bias[size_t(i)] = load_f32(t.data, t.dtype, uint64_t(i));
  }
  // o_proj
  std::vector<float> s_o(static_cast<size_t>(H));
  const std::string on = hf::name(hf::Tensor::OProj, layer);
  const st::TensorView& ow = ck->at(on);
  for (auto& R : lw.ranks) R.w_o.resize(static_cast<size_t>(H * OK));
  if (ow.dtype == SafetensorsDtype::F8_E4M3) {
    ck->get(on, {SafetensorsDtype::F8_E4M3}, {H, TOK});
    const std::string sn = hf::name(hf::Tensor::OProjScale, layer);
    const st::TensorView& sv = ck->at(sn);
    if (sv.shape == std::vector<int64_t>{H, 1}) ck->get(sn, {SafetensorsDtype::F32}, {H, 1});
    else ck->get(sn, {SafetensorsDtype::F32}, {H});
    for (int64_t i = 0; i < H; ++i) s_o[size_t(i)] = load_f32(sv.data, SafetensorsDtype::F32, uint64_t(i));
    for (int r = 0; r < c.tp; ++r)
      for (int64_t i = 0; i < H; ++i)
        std::memcpy(lw.ranks[size_t(r)].w_o.data() + i * OK, ow.data + i * TOK + r * OK, size_t(OK));
  } else {
    ck->get(on, {SafetensorsDtype::BF16, SafetensorsDtype::F32}, {H, TOK});
    // An exception must not leave an OpenMP region (std::terminate): each row's error is kept
    // and the first row's is thrown after the loop.
    std::vector<std::string> errors(static_cast<size_t>(H));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < H; ++i) {  // rows are independent: the same bits for any thread count
      std::vector<float> x(static_cast<size_t>(TOK));
      std::vector<uint8_t> q(static_cast<size_t>(TOK));
      for (int64_t j = 0; j < TOK; ++j) x[size_t(j)] = load_f32(ow.data, ow.dtype, uint64_t(i * TOK + j));
      try {
        reject_nonfinite(x.data(), int(TOK), path, on, i, 0);
      } catch (const std::exception& e) {
        errors[size_t(i)] = e.what();
        continue;
      }
      s_o[size_t(i)] = e4m3_quantize_row(x.data(), int(TOK), q.data());
      for (int r = 0; r < c.tp; ++r)
        std::memcpy(lw.ranks[size_t(r)].w_o.data() + i * OK, q.data() + r * OK, size_t(OK));
    }
    for (const std::string& e : errors)
      if (!e.empty()) throw std::invalid_argument(e);
  }
  for (auto& R : lw.ranks) {
    R.s_o = s_o;
    R.g_post = g_post;
    R.w_gate = w_gate;
    R.bias = bias;
  }
  auto src = std::make_shared<CheckpointExpertSource>(ck, cfg, layer);
  src->validate_all();
  lw.experts = src;
  return lw;
}

}  // namespace k4
