// Stage 1, split: split FP8 attention over the selected blocks (stage_split (seed:L645-L880)).
//
// Per token and partition t (keys t*256 .. +256 of the sparse context), per head h:
//   q8   = E4M3(q) (NoSaturate); K, V E4M3 from the pages of the sparse table
//   c    = mma_fp8_k32 over 4 dim chunks in order (c = c + block)
//   s    = (f32(sm_scale) * k_scale[key]) * c, NEG (-3.4e38) past n_ctx
//   m    = max over the wave's 16-lane butterfly, then waves in order
//   vmax = max over valid keys of v_scale (0 for invalid), waves in order
//   fscale = 448 * rcp(vmax + 1e-8), pscale = vmax * f32(1/448)
//   p    = exp2((s - m) * log2e) for every key (an invalid key's p is exp2((NEG - m) log2e));
//   P8 = E4M3(((valid ? vs : 0) * fscale) * p) (NoSaturate); V bytes masked to 0 past n_ctx
//   l    = per lane (0 + p0) + p1, 16-lane butterfly, waves in order from wave 0
//   (a partition with no valid key: m = NEG, l = 256, o = +0)
//   PV   = per wave mma_fp8_k32 over its 32 keys (from 0), waves summed in order
//   o    = bf16((pscale * acc) * (1 / (l > 0 ? l : 1)))
// The KV-scale modes (cfg.variant.kv_scale; docs/numerics.md §13 V4): scalar reads
// k_scale[0] / v_scale[0] for every key; static448 (vLLM) has no vmax / fscale, P8 =
// E4M3((valid ? 448 : 0) * p) and pscale = v_scale[0] / 448; atom_vllm (ATOM's
// cache_mode="vllm") gives split t the keys [t span, min(t span + span, n_ctx)),
// span = ceil(n_ctx / 8), over the 256-key tiles they meet, in order, by online softmax:
// P8 = E4M3(p), o = (o * factor) + (v_scale[0] * PV), l = (factor * l) + lsum,
// factor = exp2((m_run - max(M, m_run)) log2e); o = bf16(o * (1 / (l > 0 ? l : 1))); a split
// with no key stores m = NEG, l = +0, o = +0.
#pragma once
#include <cstdint>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/stages/index.hpp"

namespace k4 {

constexpr float kNegScore = -3.4e38f;  // the seed's NEG

struct SplitOut {
  std::vector<uint8_t> q8;     // (S, o_k)               E4M3 of q
  std::vector<uint16_t> o;     // (S, n_split, o_k)      bf16 partition outputs
  std::vector<float> m;        // (S, n_split, heads)    partition max
  std::vector<float> l;        // (S, n_split, heads)    partition exp-sum
};

void split_attention(SplitOut& out, const StepShared& sh, const StepRank& rank, const IndexOut& idx,
                     const Config& cfg);

}  // namespace k4
