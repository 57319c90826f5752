// Stage 4, router: residual add, Gemma RMSNorm, MXFP8 xn, gate logits, sigmoid, route keys
// (stage_router (seed:L1309-L1482)).
//   v = f32(a) + f32(h_in); ss: per thread fma(v, v, ssw) over its HIDDEN/512 elements,
//   wave_sum, waves in order; rstd = rsq(ss / f32(HIDDEN) + eps);
//   xn = bf16((v * rstd) * (f32(g) + 1)); MXFP8 per 32-block (mx.hpp).
//   logit(e): lane L's 4 chains from 0.0, acc_j = fdot2(gate pair, xn pair, acc_j) over i (elements
//   (i*64 + L)*8 + 2j, +1), lane value (acc0 + acc1) + (acc2 + acc3), wave_sum.
//   Variants (docs/numerics.md §13): router.gate = f32 reads w_gate_f32 with the pair step
//   fma(g1, x1, fma(g0, x0, acc)) (V1a); router.round_logit = false drops the bf16 rounding.
//   sig = rcp(1 + exp2(-bf16(logit) * log2e)); key = route_key(sig + bias, e): the score's
//   orderable bits with the low 7 replaced by 127 - e (scores in one 128-code bucket tie, the
//   lower expert wins). The NaN that reaches the key (route_key_of): a NaN logit gives the key
//   of -NaN, below -Inf (the seed negates the logit before exp2: the expert is picked last); a
//   NaN bias with a number sig the bias's own NaN (+NaN: above +Inf, picked first).
#pragma once
#include <cstdint>
#include <vector>

#include "reference/config.hpp"
#include "reference/numerics/keys.hpp"
#include "reference/weights.hpp"

namespace k4 {

struct RouterOut {
  std::vector<uint16_t> xn;      // (S, hidden)          bf16 normed row
  std::vector<uint8_t> xn8;      // (S, hidden)          E4M3 MXFP8 elements
  std::vector<uint8_t> xsc;      // (S, hidden / 32)     E8M0 scales
  std::vector<float> rstd;       // (S,)                 f32
  std::vector<float> logit;      // (S, n_routed)        f32 gate logit (before bf16)
  std::vector<float> sig;        // (S, n_routed)        f32 sigmoid (unbiased)
  std::vector<int32_t> key;      // (S, n_routed)        route key
};

// route_key (seed route_key) is in reference/numerics/keys.hpp, shared with the kernels.

void route_scores(RouterOut& out, const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in,
                  const RankWeights& w, int tokens, const Config& cfg);

}  // namespace k4
