// Stage 2, merge: LSE merge of the partitions and the per-token FP8 quant
// (merge_token (seed:L882-L943)).
//   gm = max_i m_i (in order); sl_i = l_i * exp2((m_i - gm) * log2e); gs = sum in order,
//   1 where <= 0 (or NaN); a = bf16(sum_i (sl_i / gs) * o_i) (in order, from 0);
//   amax = max |a| over the token's O_K; x_scale = amax * f32(1/448);
//   inv = amax == 0 ? 0 : rcp(x_scale); attn8 = E4M3(a * inv) (NoSaturate).
#pragma once
#include <cstdint>
#include <vector>

#include "reference/config.hpp"
#include "reference/stages/split.hpp"

namespace k4 {

struct MergeOut {
  std::vector<uint16_t> attn;   // (S, o_k) bf16 merged attention (before the quant)
  std::vector<uint8_t> attn8;   // (S, o_k) E4M3
  std::vector<float> x_scale;   // (S,)     f32 per-token scale
};

void merge_partitions(MergeOut& out, const SplitOut& sp, int tokens, const Config& cfg);

}  // namespace k4
