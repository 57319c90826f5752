// hf_names.cpp -- the one table of Hugging Face names (see hf_names.hpp).
#include "golden/inputs/hf_names.hpp"

#include <stdexcept>

namespace k4::hf {

// clang-format off
const std::vector<NameRow>& table() {
  static const std::vector<NameRow> t = {
    {Tensor::PostNorm, "model.layers.{L}.post_attention_layernorm.weight", "", "Gemma RMSNorm weight g (x * (1 + g))"},
    {Tensor::OProj, "model.layers.{L}.self_attn.o_proj.weight", "", "o_proj (hidden, tp*o_k)"},
    {Tensor::OProjScale, "model.layers.{L}.self_attn.o_proj.weight_scale", "", "o_proj per-row f32 scale"},
    {Tensor::Gate, "model.layers.{L}.block_sparse_moe.gate.weight", "", "router gate (n_routed, hidden)"},
    {Tensor::Bias, "model.layers.{L}.block_sparse_moe.e_score_correction_bias", "", "router score bias (n_routed)"},
    {Tensor::W1, "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight", "model.layers.{L}.block_sparse_moe.shared_experts.w1.weight", "expert gate projection"},
    {Tensor::W1Scale, "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight_scale", "model.layers.{L}.block_sparse_moe.shared_experts.w1.weight_scale", "gate E8M0 block scales"},
    {Tensor::W3, "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight", "model.layers.{L}.block_sparse_moe.shared_experts.w3.weight", "expert up projection"},
    {Tensor::W3Scale, "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight_scale", "model.layers.{L}.block_sparse_moe.shared_experts.w3.weight_scale", "up E8M0 block scales"},
    {Tensor::W2, "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight", "model.layers.{L}.block_sparse_moe.shared_experts.w2.weight", "expert down projection"},
    {Tensor::W2Scale, "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight_scale", "model.layers.{L}.block_sparse_moe.shared_experts.w2.weight_scale", "down E8M0 block scales"},
  };
  return t;
}
// clang-format on

namespace {
std::string subst(std::string s, const char* key, int v) {
  const std::string k(key);
  for (size_t p = s.find(k); p != std::string::npos; p = s.find(k)) s.replace(p, k.size(), std::to_string(v));
  return s;
}
}  // namespace

std::string name(Tensor t, int layer, int expert, bool shared) {
  for (const NameRow& r : table())
    if (r.id == t) {
      const bool is_expert = r.shared_pattern[0] != '\0';
      if (is_expert && !shared && expert < 0) throw std::logic_error("hf::name: expert tensor without an expert id");
      std::string s = (is_expert && shared) ? r.shared_pattern : r.pattern;
      return subst(subst(s, "{L}", layer), "{E}", expert);
    }
  throw std::logic_error("hf::name: tensor not in the table");
}

namespace {
// The rest of a k4 name after "model.", with the release's shared-expert names.
std::string release_rest(Tensor t, int layer, int expert, bool shared) {
  std::string rest = name(t, layer, expert, shared).substr(std::string("model.").size());
  if (!shared) return rest;
  static const std::pair<const char*, const char*> kShared[] = {
      {"shared_experts.w1.", "shared_experts.gate_proj."},
      {"shared_experts.w3.", "shared_experts.up_proj."},
      {"shared_experts.w2.", "shared_experts.down_proj."}};
  for (const auto& [k4, rel] : kShared) {
    const size_t p = rest.find(k4);
    if (p != std::string::npos) return rest.replace(p, std::string(k4).size(), rel);
  }
  return rest;
}
}  // namespace

bool is_scale(Tensor t) {
  return t == Tensor::OProjScale || t == Tensor::W1Scale || t == Tensor::W3Scale || t == Tensor::W2Scale;
}

std::string release_name(Tensor t, int layer, int expert, bool shared, bool scale_inv) {
  std::string n = "language_model.model." + release_rest(t, layer, expert, shared);
  if (is_scale(t) && scale_inv) n += "_inv";
  return n;
}

std::vector<std::string> candidates(Tensor t, int layer, int expert, bool shared) {
  const std::string k4 = name(t, layer, expert, shared).substr(std::string("model.").size());
  std::vector<std::string> rests;
  if (shared) rests.push_back(release_rest(t, layer, expert, shared));
  rests.push_back(k4);
  std::vector<std::string> out;
  for (const char* prefix : {"language_model.model.", "model."})
    for (const std::string& r : rests) {
      if (is_scale(t)) out.push_back(prefix + r + "_inv");
      out.push_back(prefix + r);
    }
  return out;
}

}  // namespace k4::hf
