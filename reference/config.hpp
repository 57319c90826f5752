// config.hpp -- every shape and parameter K4's numerics depend on, in one type.
//
// The seed compiles these as constants (mono_config); here they are data, so that small
// presets can keep every structural rule of the seed while running in milliseconds.
// validate() rejects a config the seed's structure cannot serve, naming the rule.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "reference/variant.hpp"

namespace k4 {

struct Config {
  std::string name = "minimax-m3-tp4";
  // Attention (one rank): 16 q heads of 128 over one KV head. O_K = heads * head_dim.
  int heads = 16;
  int head_dim = 128;
  // Residual stream and MoE.
  int hidden = 6144;
  int n_routed = 128;     // routed experts; the shared expert is id n_routed
  int top_k = 4;
  int inter = 768;        // expert intermediate size of one rank
  // Sparse attention.
  int sparse_block = 128;  // keys a block
  int topk_blocks = 16;
  int page = 16;           // keys a KV page
  int n_split = 8;
  int max_tokens = 16;
  int max_context = 1 << 20;
  int kv_page_stride = 16;     // 16: vLLM's cache (8 K pages then 8 V pages); 8: separate planes
  // The deployment build's numerics (variant.hpp; docs/numerics.md §13): the seed by default.
  Variant variant;
  // Layout of the seed's work (these fix reduction orders).
  int waves = 8;
  int lanes = 64;
  int o_rows = 32;
  int dn_rows = 32;
  int ug_rows = 16;
  int sh_rows = 8;
  // Tensor parallelism.
  int tp = 4;
  // Kernel parameters.
  float sm_scale = 0.08838834764831845f;  // 128^-0.5
  float eps = 1e-6f;
  float route_scale = 2.0f;
  float shared_weight = 1.0f;
  float swiglu_limit = 7.0f;
  int init_blocks = 0;
  int local_blocks = 1;
  // Thresholds (token counts S).
  int wide_from = 5;      // the MoE groups by distinct expert from S = 5 on
  int ag_rs_from = 12;    // all-reduces as reduce-scatter + all-gather from S = 12 on

  // Derived shapes.
  int o_k() const { return heads * head_dim; }
  int threads() const { return waves * lanes; }
  int pages_per_block() const { return sparse_block / page; }
  int split_keys() const { return topk_blocks * sparse_block / n_split; }
  int moe_slots() const { return top_k + 1; }
  int shared_expert() const { return n_routed; }
  int n_experts() const { return n_routed + 1; }
  int max_blocks() const { return max_context / sparse_block; }
  int long_from_blocks() const { return threads(); }  // a request is long past THREADS blocks
  int sparse_table_words() const { return topk_blocks * pages_per_block() + 1; }
  bool wide(int tokens) const { return tokens >= wide_from; }
  bool ag_rs(int tokens) const { return tokens >= ag_rs_from; }
  // One k / v scale a cache (split.kv_scale other than per_key: the inputs' k_scale / v_scale
  // are (1,)) instead of one a key.
  bool one_kv_scale() const { return variant.kv_scale != KvScale::per_key; }
  // Expert e's weights are E4M3 (one byte an element) rather than E2M1 pairs: every expert
  // under moe.experts = mxfp8 (V7), the shared one under moe.shared_fp8 (V6.1).
  bool expert_fp8(int e) const {
    return variant.experts == ExpertFormat::mxfp8 || (variant.shared_fp8 && e == shared_expert());
  }
  int w13_row_bytes(int e) const { return expert_fp8(e) ? hidden : hidden / 2; }  // a gate / up row
  int w2_row_bytes(int e) const { return expert_fp8(e) ? inter : inter / 2; }     // a down row

  // Throws std::invalid_argument naming the first rule the config breaks.
  void validate() const;
};

// Presets: "minimax-m3-tp4" (the real shapes), "small" and "tiny" (fast tests). tp = -1 keeps
// the preset's TP; any other value replaces it and is validated.
Config preset(const std::string& name, int tp = -1);
std::vector<std::string> preset_names();

}  // namespace k4
