// hf_config.hpp -- the model's shape from a release's config.json (text_config), as a Config.
//
// Keys read (../shared/design/CHECKPOINTS.md, "config.json"; text_config, or the top level when
// there is none): hidden_size -> hidden; num_attention_heads / tp -> heads;
// num_key_value_heads (at most one a rank); head_dim; num_local_experts -> n_routed;
// num_experts_per_tok -> top_k; intermediate_size / tp -> inter (shared_intermediate_size
// must equal it, n_shared_experts must be 1: the shared expert is fused as slot n_routed);
// routed_scaling_factor -> route_scale; swiglu_alpha (must be 1.702, the seed's constant);
// swiglu_limit; rms_norm_eps -> eps; scoring_func "sigmoid", use_routing_bias, use_gemma_norm
// (must hold where given); sparse_attention_config {sparse_topk_blocks, sparse_block_size,
// sparse_init_block, sparse_local_block, sparse_attention_freq}; num_hidden_layers and
// moe_layer_freq (list entries 0/1 or booleans) give the K4 layers: MoE and sparse.
// tp: the caller's, else num_attention_heads / 16 (K4 runs 16 q heads a rank).
// The result passes Config::validate (its message names the broken rule).
#pragma once
#include <string>
#include <vector>

#include "reference/config.hpp"

namespace k4 {

struct HfModel {
  Config cfg;
  int num_layers = 0;
  std::vector<int> k4_layers;  // layers both MoE and sparse, ascending
};

// `where` names the file in messages ("checkpoint DIR: config.json").
HfModel hf_model_from_config(const std::string& json_text, const std::string& where, int tp = -1);

// Throws naming every field where the checkpoint's config and the preset differ.
void require_preset_agrees(const Config& ckpt, const Config& preset, const std::string& where);

// `layer` < 0: the first K4 layer. A dense, non-sparse or out-of-range layer is refused with
// the list of K4 layers.
int choose_k4_layer(const HfModel& m, int layer, const std::string& where);

std::string layer_list(const std::vector<int>& layers);  // "3..59" / "3, 5, 7"

}  // namespace k4
