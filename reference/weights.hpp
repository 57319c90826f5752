// weights.hpp -- one MiniMax-M3 layer's K4 weights, one TP rank's shard, logical row-major.
//
// The kernel reads pre-shuffled tiles; the model (and the goldens) use these logical
// tensors. Expert tensors come through an ExpertSource so that experts no token routes to
// are never materialized (a full-size rank holds 129 experts, ~0.9 GB).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "reference/config.hpp"

namespace k4 {

// One expert of one rank: w13 = [gate rows (inter) ; up rows (inter)] x hidden.
// Where Config::expert_fp8(e) (moe.experts = mxfp8, or the shared expert under
// moe.shared_fp8) the weights are E4M3, one byte an element: w13 (2 inter, hidden),
// w2 (hidden, inter); the scales are the same E8M0 1x32 blocks either way.
struct ExpertWeights {
  std::vector<uint8_t> w13;  // (2 inter, hidden / 2)   E2M1 pairs, even element low nibble
  std::vector<uint8_t> s13;  // (2 inter, hidden / 32)  E8M0
  std::vector<uint8_t> w2;   // (hidden, inter / 2)     E2M1 pairs
  std::vector<uint8_t> s2;   // (hidden, inter / 32)    E8M0
};

// Thread-safe source of expert shards: expert(rank, e) for e in [0, n_routed], the shared
// expert being e = n_routed. Implementations: synthetic (golden/synth), safetensors.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual std::shared_ptr<const ExpertWeights> expert(int rank, int e) const = 0;
};

struct RankWeights {
  std::vector<uint8_t> w_o;      // (hidden, o_k)  E4M3, this rank's o_k input columns
  std::vector<float> s_o;        // (hidden,)      f32 row scale
  std::vector<uint16_t> g_post;  // (hidden,)      bf16 Gemma RMSNorm weight (x * (1 + g))
  std::vector<uint16_t> w_gate;  // (n_routed, hidden) bf16 router gate: the bf16 copy of the F32 gate
  // (n_routed, hidden) the F32 checkpoint gate (its bf16 RNE is w_gate), which the router reads
  // under router.gate = f32 (V1a); may be empty where no variant reads it (a golden of another
  // variant does not store it)
  std::vector<float> w_gate_f32;
  std::vector<float> bias;       // (n_routed,)    f32 e_score_correction_bias
};

struct LayerWeights {
  Config cfg;
  std::vector<RankWeights> ranks;         // tp entries
  std::shared_ptr<const ExpertSource> experts;
};

}  // namespace k4
