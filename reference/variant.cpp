// variant.cpp -- the switch table, the presets and the spec syntax (variant.hpp).
#include "reference/variant.hpp"

#include <cstdint>
#include <stdexcept>

namespace k4 {

bool operator==(const Variant& a, const Variant& b) {
  for (const VariantSwitch& s : variant_switches())
    if (s.get(a) != s.get(b)) return false;
  return true;
}

const std::vector<VariantSwitch>& variant_switches() {
  // modelled: the values the model (and the kernels) compute; the others are refused until
  // their rules land (VARIANTS.md V4, V6.1, V6.2: issue 14's second half)
  static const std::vector<VariantSwitch> table = {
      {"router.gate", "V1a", "the router's gate operand: the bf16 copy (fdot2 pairs) or the f32 checkpoint gate (fma pairs)",
       {"bf16", "f32"}, {true, true},
       [](const Variant& v) { return int(v.router_gate); },
       [](Variant& v, int i) { v.router_gate = RouterGate(i); }},
      {"router.round_logit", "V1", "round the logit to bf16 before the sigmoid (bf16_round (seed:L1465))",
       {"true", "false"}, {true, true},
       [](const Variant& v) { return v.round_logit ? 0 : 1; },
       [](Variant& v, int i) { v.round_logit = i == 0; }},
      {"moe.wide_live_rows", "V2", "rows whose picks join the wide MoE's experts: all, or the live ones (seq_len > 0)",
       {"all", "exclude_pad"}, {true, true},
       [](const Variant& v) { return int(v.wide_live_rows); },
       [](Variant& v, int i) { v.wide_live_rows = WideRows(i); }},
      {"moe.wide_down_order", "V3", "the wide down's units: flat over the union (seed) or per expert (ATOM)",
       {"flat", "per_expert"}, {true, true},
       [](const Variant& v) { return int(v.wide_down_order); },
       [](Variant& v, int i) { v.wide_down_order = WideDownOrder(i); }},
      {"split.kv_scale", "V4", "the split's K / V scales: one a key, one a cache (aiter), vLLM's static 448, ATOM's vllm cache",
       {"per_key", "scalar", "static448", "atom_vllm"}, {true, true, true, true},
       [](const Variant& v) { return int(v.kv_scale); },
       [](Variant& v, int i) { v.kv_scale = KvScale(i); }},
      {"moe.narrow_final", "V5.1", "the narrow down's final sum: one chain (seed) or routed and shared chains added (ATOM)",
       {"one_chain", "split"}, {true, true},
       [](const Variant& v) { return int(v.narrow_final); },
       [](Variant& v, int i) { v.narrow_final = NarrowFinal(i); }},
      {"moe.shared_fp8", "V6.1", "the shared expert in MXFP8 (the seed's shared_fp8 build)",
       {"off", "on"}, {true, true},
       [](const Variant& v) { return v.shared_fp8 ? 1 : 0; },
       [](Variant& v, int i) { v.shared_fp8 = i == 1; }},
      {"index.cp", "V6.2", "indexer context parallelism (heads.count = TP, long from 288 blocks)",
       {"off", "on"}, {true, true},
       [](const Variant& v) { return v.index_cp ? 1 : 0; },
       [](Variant& v, int i) { v.index_cp = i == 1; }},
      {"moe.experts", "V7", "the experts' format: MXFP4 (E2M1, the seed) or MXFP8 (E4M3, the MXFP8 release), E8M0 1x32 scales",
       {"mxfp4", "mxfp8"}, {true, true},
       [](const Variant& v) { return int(v.experts); },
       [](Variant& v, int i) { v.experts = ExpertFormat(i); }},
  };
  return table;
}

const VariantSwitch& variant_switch(const std::string& name) {
  std::string known;
  for (const VariantSwitch& s : variant_switches()) {
    if (name == s.name) return s;
    known += std::string(known.empty() ? "" : ", ") + s.name;
  }
  throw std::invalid_argument("unknown variant switch '" + name + "' (known: " + known + ")");
}

std::string switch_value(const Variant& v, const VariantSwitch& s) { return s.values[size_t(s.get(v))]; }

void set_switch(Variant& v, const VariantSwitch& s, const std::string& value) {
  std::string known;
  for (size_t i = 0; i < s.values.size(); ++i) {
    if (value == s.values[i]) return s.set(v, int(i));
    known += std::string(i ? ", " : "") + s.values[i];
  }
  throw std::invalid_argument("variant switch " + std::string(s.name) + ": unknown value '" + value + "' (values: " + known + ")");
}

std::vector<std::string> variant_preset_names() { return {"seed", "vllm-mono", "aiter", "atom"}; }

Variant variant_preset(const std::string& name) {
  Variant v;  // the seed
  if (name == "seed") return v;
  if (name == "vllm-mono") {  // vLLM mono a1c6cb73: the bf16 gate copy, the static KV path
    v.kv_scale = KvScale::static448;
    return v;
  }
  if (name == "aiter") {  // aiter op 7edb5dca as its op test builds it (gate_fp32 = True)
    v.router_gate = RouterGate::f32;
    v.round_logit = false;
    v.wide_live_rows = WideRows::exclude_pad;
    return v;
  }
  if (name == "atom") {  // ATOM mono: pad rows out (batch ids), per-expert wide down, split narrow sum
    v.wide_live_rows = WideRows::exclude_pad;
    v.wide_down_order = WideDownOrder::per_expert;
    v.narrow_final = NarrowFinal::split;
    return v;
  }
  throw std::invalid_argument("unknown variant preset '" + name + "' (known: seed, vllm-mono, aiter, atom)");
}

Variant parse_variant(const std::string& spec) {
  Variant v;
  size_t i = 0;
  if (spec.empty()) throw std::invalid_argument("variant '': expected a preset or SWITCH=VALUE items");
  while (i <= spec.size()) {
    size_t j = spec.find(',', i);
    if (j == std::string::npos) j = spec.size();
    const std::string item = spec.substr(i, j - i);
    const size_t eq = item.find('=');
    try {
      if (item.empty()) throw std::invalid_argument("an empty item");
      if (eq == std::string::npos) {
        v = variant_preset(item);
      } else {
        set_switch(v, variant_switch(item.substr(0, eq)), item.substr(eq + 1));
      }
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("variant '" + spec + "': " + e.what());
    }
    i = j + 1;
  }
  return v;
}

std::vector<std::string> variant_diff(const Variant& from, const Variant& to) {
  std::vector<std::string> d;
  for (const VariantSwitch& s : variant_switches())
    if (s.get(from) != s.get(to)) d.push_back(std::string(s.name) + "=" + switch_value(to, s));
  return d;
}

std::string variant_name(const Variant& v) {
  std::string best;
  size_t best_n = SIZE_MAX;
  for (const std::string& p : variant_preset_names()) {
    const std::vector<std::string> d = variant_diff(variant_preset(p), v);
    if (d.size() >= best_n) continue;
    best = p, best_n = d.size();
    for (const std::string& x : d) best += "," + x;
  }
  return best;
}

void check_variant(const Variant& v) {
  std::string missing;
  for (const VariantSwitch& s : variant_switches())
    if (!s.modelled[size_t(s.get(v))])
      missing += std::string(missing.empty() ? "" : "; ") + s.name + " = " + switch_value(v, s) + " (VARIANTS.md " + s.rule + ")";
  if (!missing.empty())
    throw std::invalid_argument("variant " + variant_name(v) + ": declared but not modelled yet: " + missing);
  if (v.shared_fp8 && v.experts == ExpertFormat::mxfp8)
    throw std::invalid_argument("variant " + variant_name(v) +
                                ": moe.shared_fp8 = on with moe.experts = mxfp8 is no build: MXFP8 experts keep the "
                                "shared expert in their tables (VARIANTS.md V7), shared_fp8 takes it out of MXFP4 ones (V6.1)");
  if (v.index_cp && v.kv_scale == KvScale::atom_vllm)
    throw std::invalid_argument("variant " + variant_name(v) +
                                ": index.cp = on with split.kv_scale = atom_vllm is no build: ATOM's vllm cache mode "
                                "requires one index head (VARIANTS.md V4.3), index.cp every head (V6.2)");
  if (v.shared_fp8 && v.wide_down_order == WideDownOrder::per_expert)
    throw std::invalid_argument("variant " + variant_name(v) +
                                ": moe.shared_fp8 = on with moe.wide_down_order = per_expert is no build: ATOM's per-expert "
                                "order (VARIANTS.md V3) runs on MXFP4 tables holding the shared expert, shared_fp8 puts its "
                                "units after the table's (V6.1)");
}

}  // namespace k4
