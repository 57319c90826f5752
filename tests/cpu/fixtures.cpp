#include "tests/cpu/fixtures.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"

namespace k4::test {

double Rng::normal() {
  const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

namespace {

uint16_t bf16_normal(Rng& r, double sd) { return bf16_bits_rne(float(r.normal() * sd)); }
uint8_t e4m3_normal(Rng& r, double sd) { return e4m3_bits(float(r.normal() * sd), Fp8Overflow::Saturate); }

// KV cache bytes, E4M3 ~ N(0, 16^2): four codes a draw from a fixed table of 65,536 normal
// samples (a Box-Muller draw and a conversion per byte made the caches most of a GPU sweep
// case's host time).
void fill_e4m3_cache(Rng& r, std::vector<uint8_t>& v) {
  static const std::vector<uint8_t> table = [] {
    Rng t(0xE4E3);
    std::vector<uint8_t> codes(65536);
    for (auto& c : codes) c = e4m3_normal(t, 16.0);
    return codes;
  }();
  for (size_t i = 0; i < v.size(); i += 4) {
    const uint64_t x = r.next();
    for (size_t j = 0; j < 4 && i + j < v.size(); ++j) v[i + j] = table[(x >> (16 * j)) & 0xFFFF];
  }
}

// Experts made on demand from (seed, rank, e): unrouted experts are never made.
class RandomExperts : public ExpertSource {
 public:
  RandomExperts(const Config& cfg, uint64_t seed) : cfg_(cfg), seed_(seed) {}
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = cache_[int64_t(rank) * 1000 + e];
    if (!slot) slot = make(rank, e);
    return slot;
  }

 private:
  std::shared_ptr<const ExpertWeights> make(int rank, int e) const {
    Rng r(seed_ ^ (uint64_t(rank + 1) << 40) ^ (uint64_t(e + 1) << 20));
    auto w = std::make_shared<ExpertWeights>();
    const int H = cfg_.hidden, I = cfg_.inter;
    auto bytes = [&](std::vector<uint8_t>& v, size_t n) {  // 8 random bytes a draw
      v.resize(n);
      for (size_t i = 0; i < n; i += 8) {
        const uint64_t x = r.next();
        for (size_t j = 0; j < 8 && i + j < n; ++j) v[i + j] = uint8_t(x >> (8 * j));
      }
    };
    auto scales = [&](std::vector<uint8_t>& v, size_t n) { v.resize(n); for (auto& x : v) x = uint8_t(119 + r.below(3)); };
    // an MXFP8 expert (V7, V6.1): E4M3 codes below 16 in magnitude (as E2M1's 6 is), no NaN
    auto fp8 = [&](std::vector<uint8_t>& v, size_t n) {
      bytes(v, n);
      for (auto& x : v) x = uint8_t((x & 0x80u) | ((x & 0x7Fu) % 0x58u));
    };
    if (cfg_.expert_fp8(e)) {
      fp8(w->w13, size_t(2 * I) * H);
      scales(w->s13, size_t(2 * I) * H / 32);
      fp8(w->w2, size_t(H) * I);
    } else {
      bytes(w->w13, size_t(2 * I) * H / 2);
      scales(w->s13, size_t(2 * I) * H / 32);
      bytes(w->w2, size_t(H) * I / 2);
    }
    scales(w->s2, size_t(H) * I / 32);
    return w;
  }
  Config cfg_;
  uint64_t seed_;
  mutable std::mutex mu_;
  mutable std::unordered_map<int64_t, std::shared_ptr<const ExpertWeights>> cache_;
};

}  // namespace

LayerWeights random_layer(const Config& cfg, uint64_t seed) {
  LayerWeights lw;
  lw.cfg = cfg;
  Rng shared(seed * 7 + 3);
  std::vector<uint16_t> g_post(cfg.hidden), w_gate(size_t(cfg.n_routed) * cfg.hidden);
  std::vector<float> bias(cfg.n_routed);
  for (auto& g : g_post) g = bf16_normal(shared, 0.1);
  for (auto& g : w_gate) g = bf16_normal(shared, 0.02);
  for (auto& b : bias) b = float(shared.normal() * 0.01);
  // the F32 gate (router.gate = f32): w_gate plus low bits below half a bf16 ulp, so that its
  // bf16 copy is w_gate (an own stream: the other draws stay as they were)
  std::vector<float> w_gate_f32(w_gate.size());
  Rng low(seed * 7 + 5);
  for (size_t i = 0; i < w_gate.size(); ++i) {
    const bool finite_nonzero = (w_gate[i] & 0x7FFF) != 0 && (w_gate[i] & 0x7F80) != 0x7F80;
    w_gate_f32[i] = f32_from_bits((uint32_t(w_gate[i]) << 16) | (finite_nonzero ? uint32_t(low.below(0x8000)) : 0u));
  }
  for (int r = 0; r < cfg.tp; ++r) {
    Rng rr(seed * 131 + r);
    RankWeights w;
    w.w_o.resize(size_t(cfg.hidden) * cfg.o_k());
    for (auto& x : w.w_o) x = e4m3_normal(rr, 32.0);
    w.s_o.resize(cfg.hidden);
    for (auto& s : w.s_o) s = float(1e-3 * (0.5 + rr.uniform()));
    w.g_post = g_post;
    w.w_gate = w_gate;
    w.w_gate_f32 = w_gate_f32;
    w.bias = bias;
    lw.ranks.push_back(std::move(w));
  }
  lw.experts = std::make_shared<RandomExperts>(cfg, seed);
  return lw;
}

StepInputs random_step(const Config& cfg, const StepSpec& spec) {
  Rng r(spec.seed);
  StepInputs in;
  StepShared& sh = in.shared;
  const int S = spec.tokens;
  sh.tokens = S;
  sh.q_len = spec.q_len;
  sh.seq_lens.resize(S);
  for (int k = 0; k < S; ++k) sh.seq_lens[k] = spec.seq_lens.size() == 1 ? spec.seq_lens[0] : spec.seq_lens[k];
  int max_blk = 1;
  for (int L : sh.seq_lens) max_blk = std::max(max_blk, (std::max(L, 1) + cfg.sparse_block - 1) / cfg.sparse_block);
  sh.bt_width = max_blk;
  sh.score_width = max_blk;
  // A small pool of block entries shared by all rows: only the selected ones are read.
  const int n_entries = std::min(max_blk, 64);
  const int n_pages = n_entries * cfg.kv_page_stride;
  sh.block_table.resize(size_t(S) * max_blk);
  for (int k = 0; k < S; ++k)
    for (int b = 0; b < max_blk; ++b)
      sh.block_table[size_t(k) * max_blk + b] = sh.seq_lens[k] == 0 ? 0 : r.below(n_entries);
  // rank 0's scores from the step's stream, each other rank's own (its own index head)
  std::vector<float> scores0(size_t(S) * max_blk);
  for (auto& s : scores0) s = float(r.normal() * 4.0);
  sh.h_in.resize(size_t(S) * cfg.hidden);
  for (auto& h : sh.h_in) h = bf16_normal(r, 1.0);
  for (int rk = 0; rk < cfg.tp; ++rk) {
    StepRank R;
    R.index_scores = scores0;
    if (rk > 0) {
      Rng rs(spec.seed * 1000003u + uint64_t(rk));
      for (auto& s : R.index_scores) s = float(rs.normal() * 4.0);
    }
    R.q.resize(size_t(S) * cfg.o_k());
    for (auto& q : R.q) q = bf16_normal(r, 1.0);
    R.n_pages = n_pages;
    const size_t bytes = size_t(n_pages) * cfg.page * cfg.head_dim;
    R.k_cache.resize(bytes);
    R.v_cache.resize(bytes);
    fill_e4m3_cache(r, R.k_cache);
    fill_e4m3_cache(r, R.v_cache);
    const size_t ns = cfg.one_kv_scale() ? 1 : size_t(n_pages) * cfg.page;
    R.k_scale.resize(ns);
    R.v_scale.resize(ns);
    for (auto& s : R.k_scale) s = float(0.05 + 0.1 * r.uniform());
    for (auto& s : R.v_scale) s = float(0.05 + 0.1 * r.uniform());
    in.ranks.push_back(std::move(R));
  }
  return in;
}

void one_token_split_step(const Config& cfg, int seq_len, StepShared& sh, StepRank& rk) {
  constexpr uint8_t kE4NaN = 0x7F;
  const int nb = (seq_len + cfg.sparse_block - 1) / cfg.sparse_block;
  sh.tokens = 1, sh.q_len = 1, sh.seq_lens = {seq_len};
  sh.bt_width = sh.score_width = nb;
  for (int b = 0; b < nb; ++b) sh.block_table.push_back(b), rk.index_scores.push_back(0.0f);
  sh.h_in.assign(cfg.hidden, 0);
  rk.n_pages = nb * cfg.kv_page_stride;  // block b's pages are 16b + j (kv_page_stride)
  rk.q.assign(cfg.o_k(), 0);
  rk.k_cache.assign(size_t(rk.n_pages) * cfg.page * cfg.head_dim, kE4NaN);
  rk.v_cache.assign(size_t(rk.n_pages) * cfg.page * cfg.head_dim, kE4NaN);
}

}  // namespace k4::test
