// Stage 4, router: residual add, Gemma RMSNorm, MXFP8 xn, gate logits, sigmoid and route
// keys (stage_router (seed:L1309-L1482)). Contract in router.hpp.
#include "reference/stages/router.hpp"

#include <stdexcept>
#include <string>

#include "reference/numerics/bf16.hpp"
#include "reference/numerics/butterfly.hpp"
#include "reference/numerics/mx.hpp"
#include "reference/numerics/policy.hpp"
#include "reference/model_mutants.hpp"

namespace k4 {

namespace {

// RMSNorm of one token (ssw (seed:L1397-L1416)) -> xn (bf16 bits), rstd.
float rms_norm(uint16_t* xn, const float* v, const RankWeights& w, const Config& cfg) {
  const int threads = cfg.threads(), re = cfg.hidden / threads;
  float ss = 0.0f;
  for (int wave0 = 0, wave; wave0 < cfg.waves && (wave = K4_MODEL_MUTANT_ON(10) ? cfg.waves - 1 - wave0 : wave0, true); ++wave0) {
    float lanes[kWaveLanes];
    for (int lane = 0; lane < kWaveLanes; ++lane) {
      const float* vt = v + (wave * kWaveLanes + lane) * re;
      float ssw = 0.0f;
      for (int e = 0; e < re; ++e) ssw = fma_f32(vt[e], vt[e], ssw);  // the seed's fmath.fma
      lanes[lane] = ssw;
    }
    const float sw = wave_sum(lanes);
    ss = wave0 == 0 ? sw : ss + sw;  // ss = red[0]; ss = ss + red[w]
  }
  const float rstd = rsq_approx(K4_MODEL_MUTANT_ON(9) ? (ss + cfg.eps) / float(cfg.hidden) : ss / float(cfg.hidden) + cfg.eps);
  for (int i = 0; i < cfg.hidden; ++i) xn[i] = bf16_bits_rne((v[i] * rstd) * (bf16_to_f32(w.g_post[i]) + (K4_MODEL_MUTANT_ON(8) ? 0.0f : 1.0f)));
  return rstd;
}

// The gate's order (gw (seed:L1337-L1347), accs (seed:L1446-L1461)): lane l's 4 chains j run
// over the element pairs el = (64 i + l) 8 + 2 j, acc[j] = pair(acc[j], el); the lane's value
// (acc0 + acc1) + (acc2 + acc3); then wave_sum.
template <class PairStep>
float gate_chains(const Config& cfg, PairStep pair) {
  float lanes[kWaveLanes];
  for (int lane = 0; lane < kWaveLanes; ++lane) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < cfg.hidden / 512; ++i)
      for (int j = 0; j < 4; ++j) acc[j] = pair(acc[j], (i * 64 + lane) * 8 + 2 * j);
    lanes[lane] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  return wave_sum(lanes);
}

// Gate logit of expert e: the pair step one fdot2 on the bf16 gate.
float gate_logit(const uint16_t* gate_row, const uint16_t* xn, const Config& cfg) {
  return gate_chains(cfg, [&](float acc, int el) {
    const uint32_t gw = uint32_t(gate_row[el]) | (uint32_t(gate_row[el + 1]) << 16);
    const uint32_t xv = uint32_t(xn[el]) | (uint32_t(xn[el + 1]) << 16);
    return fdot2_bf16(gw, xv, acc);
  });
}

// Gate logit of expert e under router.gate = f32 (VARIANTS.md V1a): the same lanes, chains
// and element pairs, the pair step two IEEE fmas on the F32 gate (the even element first).
float gate_logit_f32(const float* gate_row, const uint16_t* xn, const Config& cfg) {
  return gate_chains(cfg, [&](float acc, int el) {
    return fma_f32(gate_row[el + 1], bf16_to_f32(xn[el + 1]), fma_f32(gate_row[el], bf16_to_f32(xn[el]), acc));
  });
}

}  // namespace

void route_scores(RouterOut& out, const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in,
                  const RankWeights& w, int tokens, const Config& cfg) {
  const int HID = cfg.hidden, E = cfg.n_routed;
  out.xn.assign(size_t(tokens) * HID, 0);
  out.xn8.assign(size_t(tokens) * HID, 0);
  out.xsc.assign(size_t(tokens) * HID / 32, 0);
  out.rstd.assign(tokens, 0.0f);
  out.logit.assign(size_t(tokens) * E, 0.0f);
  out.sig.assign(size_t(tokens) * E, 0.0f);
  out.key.assign(size_t(tokens) * E, 0);
  const bool f32_gate = cfg.variant.router_gate == RouterGate::f32;
  if (f32_gate && w.w_gate_f32.size() != size_t(E) * HID)
    throw std::invalid_argument("router: router.gate = f32 needs the F32 gate w_gate_f32 (" + std::to_string(size_t(E) * HID) +
                                " elements), the weights have " + std::to_string(w.w_gate_f32.size()));
  for (int k = 0; k < tokens; ++k) {
    std::vector<float> v(HID);
    for (int i = 0; i < HID; ++i) v[i] = bf16_to_f32(a[size_t(k) * HID + i]) + bf16_to_f32(h_in[size_t(k) * HID + i]);
    uint16_t* xn = out.xn.data() + size_t(k) * HID;
    out.rstd[k] = canon_nan(rms_norm(xn, v.data(), w, cfg));
    for (int b = 0; b < HID / 32; ++b) {  // MXFP8 xn (XN_SLICE (seed:L1419-L1442))
      float f[32];
      for (int i = 0; i < 32; ++i) f[i] = bf16_to_f32(xn[b * 32 + i]);
      out.xsc[size_t(k) * HID / 32 + b] = mx8_quantize_block(f, out.xn8.data() + size_t(k) * HID + b * 32);
    }
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (int k = 0; k < tokens; ++k)
    for (int e = 0; e < E; ++e) {
      const uint16_t* xn = out.xn.data() + size_t(k) * HID;
      const float logit = f32_gate ? gate_logit_f32(w.w_gate_f32.data() + size_t(e) * HID, xn, cfg)  // V1a
                                   : gate_logit(w.w_gate.data() + size_t(e) * HID, xn, cfg);
      // bf16_round (seed:L1465); router.round_logit = false (V1a, V1b): the f32 logit itself
      const float x = cfg.variant.round_logit ? bf16_round(logit) : logit;
      const float sc = sigmoid_approx(x);  // hw_rcp (seed:L1465)
      out.logit[size_t(k) * E + e] = canon_nan(logit);
      out.sig[size_t(k) * E + e] = canon_nan(sc);
      out.key[size_t(k) * E + e] = route_key_of(sc, K4_MODEL_MUTANT_ON(4) ? 0.0f : w.bias[e], e);  // route_key (seed:L1466): a NaN sc keys last
    }
}

}  // namespace k4
