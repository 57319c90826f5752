// checkpoint.hpp -- one MiniMax-M3 layer's K4 weights from a safetensors checkpoint.
//
// PATH is one .safetensors file or a directory of them (every *.safetensors inside is
// mapped; a tensor name must occur in exactly one). Names: golden/inputs/hf_names.hpp.
// Forms accepted (docs/golden-format.md, "Checkpoints"):
//  - o_proj F8_E4M3 with a per-row F32 weight_scale, used as stored; or BF16 / F32,
//    quantized per output row on load: amax = max |x| over the whole row (all tp*o_k
//    columns, so every rank agrees), scale = f32(amax) / 448 (f32 division; 1 where amax is
//    0), code = E4M3 Saturate(f32(x) / scale).
//  - experts MXFP4 (U8 packed pairs, even element low nibble, + U8 / F8_E8M0 weight_scale),
//    used as stored; or BF16 / F32, quantized on load a 32-block at a time by the OCP rule
//    (reference/numerics/mx.hpp mxfp4_quantize_block) along each row's input dimension.
//  - NaN or Inf in a weight that is quantized on load is rejected.
// TP sharding: rank r takes o_proj input columns [r*o_k, (r+1)*o_k); expert w1 / w3 rows
// and w2 columns [r*inter, (r+1)*inter); the norm weight, router gate and bias replicated.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "golden/io/safetensors.hpp"
#include "reference/config.hpp"
#include "reference/weights.hpp"

namespace k4 {

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);
  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const st::TensorView& at(const std::string& name) const;
  const st::TensorView& get(const std::string& name, const std::vector<st::SafetensorsDtype>& dtypes,
                            const std::vector<int64_t>& shape) const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<st::File>> files_;
  std::map<std::string, const st::File*> where_;
};

// Builds ExpertWeights for (rank, e) on demand from the mapped file; thread-safe, with a
// small cache (the most recent 16), so unrouted experts are never materialized.
class CheckpointExpertSource : public ExpertSource {
 public:
  CheckpointExpertSource(std::shared_ptr<const Checkpoint> ck, const Config& cfg, int layer);
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override;
  // Checks that every expert tensor exists with a valid dtype and shape (cheap: headers only).
  void validate_all() const;

 private:
  std::shared_ptr<ExpertWeights> build(int rank, int e) const;
  std::shared_ptr<const Checkpoint> ck_;
  Config cfg_;
  int layer_;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<std::pair<int, int>, std::shared_ptr<const ExpertWeights>>> cache_;
};

LayerWeights load_checkpoint_layer(const std::string& path, const Config& cfg, int layer);

// Shared by the loader and its tests: OCP MXFP4 of one row of `n` values (n % 32 == 0)
// into n/2 packed bytes and n/32 scales; per-row E4M3 of a BF16 / F32 o_proj row.
void mxfp4_quantize_row(const float* x, int n, uint8_t* packed, uint8_t* scales);
float e4m3_quantize_row(const float* x, int n, uint8_t* codes);  // returns the row scale

}  // namespace k4
