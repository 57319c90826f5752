// checkpoint.hpp -- one MiniMax-M3 layer's K4 weights from a safetensors checkpoint, prepared
// as a deployment prepares them (golden/inputs/weight_prep.hpp; docs/golden-format.md,
// "Checkpoints").
//
// The files: golden/inputs/checkpoint_files.hpp (a release directory with config.json and an
// index, a directory of shards, or one file). The names: golden/inputs/hf_names.hpp, the
// releases' forms and k4's. The shape: config.json's text_config (golden/inputs/hf_config.hpp)
// when the directory has one, else --preset.
// Forms, each tensor checked (dtype, shape) before any is read:
//  - o_proj BF16 / F32 -> ptpc-fp8-vllm on each rank's shard (per-rank s_o); F8_E4M3 with E8M0
//    1x32 scales (MXFP8 release) -> exact dequantization, then the same; F8_E4M3 with an f32
//    scale a row (k4 synth) -> as stored, one s_o for every rank.
//  - router gate F32 -> bf16 RNE (the value as stored kept in RankWeights::w_gate_f32); BF16 as stored.
//  - experts U8 (MXFP4 pairs, even element low nibble) + U8 / F8_E8M0 scales -> as stored;
//    BF16 / F32 -> MXFP4 by the --mx-scale rule (even by default); F8_E4M3 (MXFP8 release)
//    -> refused for MXFP4 experts, naming the variant that reads them.
//  - experts where Config::expert_fp8(e) (moe.experts = mxfp8, V7; the shared expert under
//    moe.shared_fp8, V6.1): F8_E4M3 codes + U8 / F8_E8M0 1x32 scales as stored ("mxfp8-stored",
//    byte for byte, no dequantization); any other stored form is refused.
//  - NaN or Inf in a weight that is quantized on load is rejected.
// TP sharding: rank r takes o_proj input columns [r*o_k, (r+1)*o_k); expert w1 / w3 rows
// and w2 columns [r*inter, (r+1)*inter) (scales alike); the norm weight, gate and bias replicated.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "golden/inputs/checkpoint_files.hpp"
#include "golden/inputs/weight_prep.hpp"
#include "reference/config.hpp"
#include "reference/weights.hpp"

namespace k4 {

// The shape and the layer of a checkpoint: from config.json (the preset, when given, must
// agree) or, for a checkpoint without config.json, from the preset (required then; layer 0
// by default).
struct CheckpointShape {
  Config cfg;
  int layer = 0;
  bool from_config_json = false;
  std::vector<int> k4_layers;  // from config.json
};
CheckpointShape checkpoint_shape(const Checkpoint& ck, const std::string& preset_name, int tp, int layer);

// One tensor K4 reads, as found.
struct TensorUse {
  std::string role;        // "o_proj", "router gate", "expert 5 w2 scale", ...
  std::string name, shard; // the name found and its shard file
  std::string dtype;
  std::vector<int64_t> shape;
  std::string conversion;  // what the loader does with it
};

// What loading a layer reads and does (headers only: every tensor checked, nothing converted).
struct LayerPlan {
  std::vector<TensorUse> tensors;     // norm, o_proj (+ scale), gate, bias, then every expert's
  std::vector<std::string> shards;    // the shards the layer needs
  std::string prep_json;              // the rules applied, for the golden's weight_prep attribute
};
LayerPlan plan_layer(const Checkpoint& ck, const Config& cfg, int layer, prep::MxScale mx = prep::MxScale::Even);

// progress(done, total): o_proj rows prepared, called from one thread. Experts are prepared
// when the model first routes to them (how many is known only then): expert_progress(n) after
// each (rank, expert) shard, n counting them, from the model's worker threads (it must be
// thread-safe and is kept by the returned weights' expert source).
LayerWeights load_checkpoint_layer(std::shared_ptr<const Checkpoint> ck, const Config& cfg, int layer,
                                   prep::MxScale mx = prep::MxScale::Even,
                                   const std::function<void(uint64_t, uint64_t)>& progress = {},
                                   std::function<void(uint64_t)> expert_progress = {});
// Only o_proj: every rank's (w_o, s_o) as load_checkpoint_layer makes them (tests of the
// o_proj rules on a checkpoint whose experts K4 cannot read yet, the MXFP8 release).
std::vector<RankWeights> load_o_proj_ranks(const Checkpoint& ck, const Config& cfg, int layer);

LayerWeights load_checkpoint_layer(const std::string& path, const Config& cfg, int layer,
                                   prep::MxScale mx = prep::MxScale::Even);

}  // namespace k4
