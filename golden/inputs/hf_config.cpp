// hf_config.cpp -- see hf_config.hpp.
#include "golden/inputs/hf_config.hpp"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "golden/format/schema.hpp"

namespace k4 {
namespace {

using json = nlohmann::json;

struct Reader {
  const json& j;
  std::string where, scope;
  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    throw std::invalid_argument(where + ": " + scope + key + " " + what);
  }
  const json* find(const std::string& key) const { return j.contains(key) ? &j[key] : nullptr; }
  int64_t integer(const std::string& key) const {
    const json* v = find(key);
    if (!v) bad(key, "is missing");
    if (!v->is_number_integer()) bad(key, "= " + v->dump() + " is not an integer");
    return v->get<int64_t>();
  }
  double number(const std::string& key) const {
    const json* v = find(key);
    if (!v) bad(key, "is missing");
    if (!v->is_number()) bad(key, "= " + v->dump() + " is not a number");
    return v->get<double>();
  }
  // A per-layer list of 0/1 or booleans (or one number for every layer: a frequency).
  std::vector<bool> layer_flags(const std::string& key, int n, bool absent) const {
    const json* v = find(key);
    if (!v) return std::vector<bool>(size_t(n), absent);
    if (v->is_number_integer()) {
      const int64_t f = v->get<int64_t>();
      std::vector<bool> out(size_t(n), false);
      for (int l = 0; l < n; ++l) out[size_t(l)] = f > 0 && (l + 1) % f == 0;
      return out;
    }
    if (!v->is_array()) bad(key, "is neither a list nor a number");
    if (int64_t(v->size()) != n) bad(key, "has " + std::to_string(v->size()) + " entries for " + std::to_string(n) + " layers");
    std::vector<bool> out;
    for (const json& e : *v) {
      if (e.is_boolean()) out.push_back(e.get<bool>());
      else if (e.is_number_integer() && (e.get<int64_t>() == 0 || e.get<int64_t>() == 1)) out.push_back(e.get<int64_t>() == 1);
      else bad(key, "entry " + e.dump() + " is not 0, 1, true or false");
    }
    return out;
  }
};

int to_int(const Reader& r, const std::string& key, int64_t v) {
  if (v < 1 || v > (int64_t(1) << 30)) r.bad(key, "= " + std::to_string(v) + " is outside 1..2^30");
  return int(v);
}

int per_rank(const Reader& r, const std::string& key, int64_t total, int tp) {
  if (total % tp != 0) r.bad(key, "= " + std::to_string(total) + " does not split over tp " + std::to_string(tp));
  return to_int(r, key, total / tp);
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

}  // namespace

HfModel hf_model_from_config(const std::string& text, const std::string& where, int tp) {
  json top;
  try {
    top = json::parse(text);
  } catch (const json::exception& e) {
    throw std::invalid_argument(where + " is not valid JSON (" + e.what() + ")");
  }
  if (!top.is_object()) throw std::invalid_argument(where + " is not a JSON object");
  const bool nested = top.contains("text_config");
  if (nested && !top["text_config"].is_object()) throw std::invalid_argument(where + ": text_config is not an object");
  const json& t = nested ? top["text_config"] : top;
  const Reader r{t, where, nested ? "text_config." : ""};
  HfModel m;
  Config& c = m.cfg;
  c = preset("minimax-m3-tp4");  // the seed's layout constants; every model number below replaces one
  c.name = "checkpoint";
  const int64_t heads = r.integer("num_attention_heads");
  if (tp < 0) tp = heads % 16 == 0 && heads / 16 >= 1 && heads / 16 <= 8 ? int(heads / 16) : 4;
  c.tp = tp;
  if (tp < 1) r.bad("num_attention_heads", "cannot split over tp " + std::to_string(tp));
  c.heads = per_rank(r, "num_attention_heads", heads, tp);
  if (const json* kv = r.find("num_key_value_heads")) {
    if (!kv->is_number_integer() || kv->get<int64_t>() < 1) r.bad("num_key_value_heads", "is not a positive integer");
    if (kv->get<int64_t>() > tp)
      r.bad("num_key_value_heads", "= " + kv->dump() + " over tp " + std::to_string(tp) +
                                       " is more than the one KV head a rank K4 reads");
  }
  c.head_dim = to_int(r, "head_dim", r.integer("head_dim"));
  c.hidden = to_int(r, "hidden_size", r.integer("hidden_size"));
  c.n_routed = to_int(r, "num_local_experts", r.integer("num_local_experts"));
  c.top_k = to_int(r, "num_experts_per_tok", r.integer("num_experts_per_tok"));
  const int64_t inter = r.integer("intermediate_size");
  c.inter = per_rank(r, "intermediate_size", inter, tp);
  if (r.find("shared_intermediate_size") && r.integer("shared_intermediate_size") != inter)
    r.bad("shared_intermediate_size", "= " + std::to_string(r.integer("shared_intermediate_size")) +
                                          " differs from intermediate_size " + std::to_string(inter) +
                                          " (K4 fuses the shared expert as expert slot n_routed, routed shapes)");
  if (r.find("n_shared_experts") && r.integer("n_shared_experts") != 1)
    r.bad("n_shared_experts", "= " + std::to_string(r.integer("n_shared_experts")) + " is not the one shared expert K4 fuses");
  c.route_scale = float(r.number("routed_scaling_factor"));
  if (r.find("swiglu_alpha") && float(r.number("swiglu_alpha")) != 1.702f)
    r.bad("swiglu_alpha", "= " + num(r.number("swiglu_alpha")) + " is not the seed's swiglu constant 1.702");
  c.swiglu_limit = float(r.number("swiglu_limit"));
  if (!(c.swiglu_limit > 0.0f) || !std::isfinite(c.swiglu_limit)) r.bad("swiglu_limit", "= " + num(c.swiglu_limit) + " is not a positive limit");
  c.eps = float(r.number("rms_norm_eps"));
  if (!(c.eps > 0.0f)) r.bad("rms_norm_eps", "= " + num(c.eps) + " is not positive");
  if (const json* s = r.find("scoring_func"); s && *s != "sigmoid")
    r.bad("scoring_func", "= " + s->dump() + ": K4's router scores with sigmoid");
  if (const json* b = r.find("use_routing_bias"); b && *b != true)
    r.bad("use_routing_bias", "= " + b->dump() + ": K4's router adds e_score_correction_bias");
  if (const json* g = r.find("use_gemma_norm"); g && *g != true)
    r.bad("use_gemma_norm", "= " + g->dump() + ": K4's norm is Gemma's x * rstd * (1 + g)");
  // Layers.
  m.num_layers = to_int(r, "num_hidden_layers", r.integer("num_hidden_layers"));
  const std::vector<bool> moe = r.layer_flags("moe_layer_freq", m.num_layers, true);
  if (!r.find("sparse_attention_config")) r.bad("sparse_attention_config", "is missing (K4 is the sparse-attention layers' kernel)");
  const json& sj = t["sparse_attention_config"];
  if (!sj.is_object()) r.bad("sparse_attention_config", "is not an object");
  const Reader sr{sj, where, r.scope + "sparse_attention_config."};
  c.topk_blocks = to_int(sr, "sparse_topk_blocks", sr.integer("sparse_topk_blocks"));
  c.sparse_block = to_int(sr, "sparse_block_size", sr.integer("sparse_block_size"));
  const int64_t init = sr.integer("sparse_init_block");
  if (init < 0 || init > (1 << 15)) sr.bad("sparse_init_block", "= " + std::to_string(init) + " is outside 0..32768");
  c.init_blocks = int(init);
  c.local_blocks = to_int(sr, "sparse_local_block", sr.integer("sparse_local_block"));
  const std::vector<bool> sparse = sr.layer_flags("sparse_attention_freq", m.num_layers, true);
  for (int l = 0; l < m.num_layers; ++l)
    if (moe[size_t(l)] && sparse[size_t(l)]) m.k4_layers.push_back(l);
  // The same rules as the presets.
  for (const std::string& p : preset_names()) {  // a config that is a preset's takes its name
    Config q;
    try {
      q = preset(p, c.tp);
    } catch (const std::invalid_argument&) {
      continue;  // a tp no preset takes: validate() below names the rule
    }
    q.name = c.name;
    if (golden::config_to_json(q) == golden::config_to_json(c)) c.name = p;
  }
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(where + ": the model cannot run this config: " + e.what());
  }
  if (m.k4_layers.empty())
    throw std::invalid_argument(where + ": no layer is both MoE (moe_layer_freq) and sparse (sparse_attention_freq): K4 has no layer here");
  return m;
}

void require_preset_agrees(const Config& a, const Config& p, const std::string& where) {
  struct F {
    const char* name;
    double x, y;
  };
  const F fs[] = {{"hidden", double(a.hidden), double(p.hidden)},
                  {"heads", double(a.heads), double(p.heads)},
                  {"head_dim", double(a.head_dim), double(p.head_dim)},
                  {"n_routed", double(a.n_routed), double(p.n_routed)},
                  {"top_k", double(a.top_k), double(p.top_k)},
                  {"inter", double(a.inter), double(p.inter)},
                  {"tp", double(a.tp), double(p.tp)},
                  {"route_scale", double(a.route_scale), double(p.route_scale)},
                  {"swiglu_limit", double(a.swiglu_limit), double(p.swiglu_limit)},
                  {"eps", double(a.eps), double(p.eps)},
                  {"sparse_block", double(a.sparse_block), double(p.sparse_block)},
                  {"topk_blocks", double(a.topk_blocks), double(p.topk_blocks)},
                  {"init_blocks", double(a.init_blocks), double(p.init_blocks)},
                  {"local_blocks", double(a.local_blocks), double(p.local_blocks)}};
  std::string diff;
  for (const F& f : fs)
    if (f.x != f.y) diff += std::string(diff.empty() ? "" : ", ") + f.name + " " + num(f.x) + " (preset " + num(f.y) + ")";
  if (!diff.empty())
    throw std::invalid_argument(where + " disagrees with --preset " + p.name + " (tp " + std::to_string(p.tp) + "): " + diff);
}

std::string layer_list(const std::vector<int>& v) {
  bool run = v.size() > 2;
  for (size_t i = 1; i < v.size(); ++i) run = run && v[i] == v[i - 1] + 1;
  if (run) return std::to_string(v.front()) + ".." + std::to_string(v.back());
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

int choose_k4_layer(const HfModel& m, int layer, const std::string& where) {
  if (layer < 0) return m.k4_layers.front();
  for (int l : m.k4_layers)
    if (l == layer) return layer;
  const std::string why = layer >= m.num_layers ? "is past the last layer (" + std::to_string(m.num_layers) + " layers)"
                                                : "is not a K4 layer (dense MLP or not sparse)";
  throw std::invalid_argument(where + ": layer " + std::to_string(layer) + " " + why + "; the K4 layers (MoE and sparse) are " +
                              layer_list(m.k4_layers));
}

}  // namespace k4
