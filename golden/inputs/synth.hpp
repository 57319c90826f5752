// synth.hpp -- a deterministic synthetic MiniMax-M3 layer: as a safetensors checkpoint
// (`k4 synth`, streamed, never whole in memory) and generated directly (the embedded
// default of `k4 golden`), bit-identical to each other.
//
// Every element is a function of (seed, tensor, index): key = splitmix64(seed ^ fnv1a64(HF
// name)), and the 64-bit word of counter c is splitmix64's output for state key + (c+1) *
// 0x9E3779B97F4A7C15. So any slice (one rank's expert shard) is generated without the rest.
// Distributions (full, unsharded tensors; element i of the tensor in row-major order):
//   expert w1/w3/w2 (MXFP4, packed byte b): word b/4, bytes 2(b%4) and 2(b%4)+1 give the low
//     and high nibble: sign = bit 7, magnitude code from the 7 low bits by a fixed table
//     (0, .5, 1, 1.5, 2, 3, 4, 6 with weights 20, 30, 24, 18, 14, 12, 6, 4 of 128)
//   MXFP8 experts (moe.experts = mxfp8, or the shared one under moe.shared_fp8; E4M3 code i):
//     the o_proj code below with its 7 magnitude bits taken mod 0x58 (|value| < 16)
//   expert scales (E8M0, byte b): 121 + (byte b%8 of word b/8) % 4: 2^-6 .. 2^-3
//   o_proj (E4M3, code i): byte i%8 of word i/8, the NaN codes 0x7F / 0xFF moved to +-448
//   o_proj row scale (F32, row i): 1e-3 * (0.5 + top 24 bits of word i / 2^24)
//   gate (BF16) N(0, 0.02), norm weight g (BF16) N(0, 0.1), bias (F32) N(0, 0.01), where
//     N(0, s) = RNE(s * sqrt(3) * (u0 + u1 + u2 + u3 - 2)), u_k = (16-bit field k of word i + 0.5) / 65536,
//     computed in double (exact but for the final rounding).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "golden/inputs/expert_cache.hpp"
#include "reference/config.hpp"
#include "reference/weights.hpp"

namespace k4::synth {

uint64_t splitmix64(uint64_t x);
uint64_t fnv1a64(const std::string& s);
uint64_t tensor_key(uint64_t seed, const std::string& hf_name);
// The counter-based word c of a tensor.
inline uint64_t word(uint64_t key, uint64_t c) { return splitmix64(key + (c + 1) * 0x9E3779B97F4A7C15ull); }

// Generators over any element range [begin, begin + n) of a full tensor.
void fp4_packed(uint64_t key, uint64_t begin, uint64_t n, uint8_t* out);
void expert_scales(uint64_t key, uint64_t begin, uint64_t n, uint8_t* out);
void e4m3_codes(uint64_t key, uint64_t begin, uint64_t n, uint8_t* out);
void e4m3_weights(uint64_t key, uint64_t begin, uint64_t n, uint8_t* out);  // MXFP8 expert codes
void row_scales(uint64_t key, uint64_t begin, uint64_t n, float* out);
void normal_bf16(uint64_t key, double sigma, uint64_t begin, uint64_t n, uint16_t* out);
void normal_f32(uint64_t key, double sigma, uint64_t begin, uint64_t n, float* out);
// An F32 gate: normal_bf16's value with seeded low bits below half a bf16 ulp (its bf16 RNE is
// normal_bf16's value again; zeros, Inf and NaN exact).
void gate_f32(uint64_t key, double sigma, uint64_t begin, uint64_t n, float* out);

// Expert shards generated on demand (thread-safe, small cache), bit-identical to what
// write_checkpoint puts in the file and CheckpointExpertSource reads back.
class SyntheticExpertSource : public ExpertSource {
 public:
  SyntheticExpertSource(const Config& cfg, uint64_t seed, int layer = 0);
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override;
  std::shared_ptr<ExpertWeights> build(int rank, int e) const;

 private:
  Config cfg_;
  uint64_t seed_;
  int layer_;
  ExpertCache cache_{16};
};

LayerWeights synthetic_layer(const Config& cfg, uint64_t seed, int layer = 0);

// Bytes of tensor data of the synthetic checkpoint (the file adds a header of a few KB).
uint64_t checkpoint_bytes(const Config& cfg);

// Writes the checkpoint (MXFP4 experts, FP8 o_proj) streamed in chunks; progress(done, total).
void write_checkpoint(const std::string& path, const Config& cfg, uint64_t seed, int layer, bool overwrite,
                      const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace k4::synth
