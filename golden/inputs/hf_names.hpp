// hf_names.hpp -- the Hugging Face tensor names of one MiniMax-M3 layer, in ONE table.
//
// Convention (docs/golden-format.md, "Checkpoints"): Mixtral-style block_sparse_moe names;
// routed expert E is "experts.{E}", the shared expert (id n_routed) "shared_experts", both
// with w1 (gate), w3 (up), w2 (down). Every tensor is the full (unsharded) matrix.
//   post_attention_layernorm.weight          (hidden)                     BF16 (F32 rounded RNE)
//   self_attn.o_proj.weight                  (hidden, tp*o_k)             F8_E4M3, or BF16 / F32
//   self_attn.o_proj.weight_scale            (hidden) or (hidden, 1)      F32 (with F8_E4M3 only)
//   block_sparse_moe.gate.weight             (n_routed, hidden)           BF16 (F32 rounded RNE)
//   block_sparse_moe.e_score_correction_bias (n_routed)                   F32 (BF16 widened)
//   ...experts.{E}.w1.weight                 (tp*inter, hidden/2) U8 MXFP4 pairs, or (tp*inter, hidden) BF16
//   ...experts.{E}.w1.weight_scale           (tp*inter, hidden/32)        U8 / F8_E8M0 (MXFP4 form)
//   ...experts.{E}.w3.*                      as w1
//   ...experts.{E}.w2.weight                 (hidden, tp*inter/2) U8, or (hidden, tp*inter) BF16
//   ...experts.{E}.w2.weight_scale           (hidden, tp*inter/32)        U8 / F8_E8M0
#pragma once
#include <string>
#include <vector>

namespace k4::hf {

enum class Tensor { PostNorm, OProj, OProjScale, Gate, Bias, W1, W1Scale, W3, W3Scale, W2, W2Scale };

struct NameRow {
  Tensor id;
  const char* pattern;         // {L} = layer, {E} = routed expert id
  const char* shared_pattern;  // the shared expert's name ("" for non-expert tensors)
  const char* meaning;
};
const std::vector<NameRow>& table();

// The name of tensor t of layer L; for expert tensors, expert e (shared: the shared pattern).
// This is the k4 form (the single-file `k4 synth` checkpoint, the synthetic weights' keys).
std::string name(Tensor t, int layer, int expert = -1, bool shared = false);

// Every name a checkpoint may give tensor t, the published releases' forms first
// (../shared/design/CHECKPOINTS.md): the prefix `language_model.model.` (every release is the
// vision-language model) then `model.`; the shared expert's `shared_experts.gate_proj / up_proj /
// down_proj` then `shared_experts.w1 / w3 / w2`; a scale's `weight_scale_inv` (MXFP8 release)
// then `weight_scale` (Quark, k4). A loader takes the first one the checkpoint holds.
std::vector<std::string> candidates(Tensor t, int layer, int expert = -1, bool shared = false);

// The name a release writes: prefix `language_model.model.`, the shared expert as gate_proj /
// up_proj / down_proj, scales as `weight_scale_inv` when scale_inv (MXFP8) else `weight_scale`.
std::string release_name(Tensor t, int layer, int expert, bool shared, bool scale_inv);

bool is_scale(Tensor t);

}  // namespace k4::hf
