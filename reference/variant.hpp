// variant.hpp -- the switches of K4's numerics where a deployment's build differs from the
// seed, and the deployments' sets of them (presets). A Config carries one Variant; the
// default is the seed.
//
// Each switch is a rule of docs/numerics.md §13 (V1-V7), stated from
// ../shared/design/VARIANTS.md with the seed lines it replaces:
//   router.gate          bf16 | f32            V1a  the router's gate operand (aiter gate_fp32)
//   router.round_logit   true | false          V1   bf16-round the logit before the sigmoid
//   moe.wide_live_rows   all | exclude_pad     V2   pad rows (seq_len <= 0) join no wide expert
//   moe.wide_down_order  flat | per_expert     V3   the wide down's unit -> quarter order (ATOM)
//   split.kv_scale       per_key | scalar | static448 | atom_vllm    V4  the split's K / V scales
//   moe.narrow_final     one_chain | split     V5.1 the narrow down's final sum (ATOM fork)
//   moe.shared_fp8       off | on              V6.1 an MXFP8 shared expert
//   index.cp             off | on              V6.2 indexer context parallelism
//   moe.experts          mxfp4 | mxfp8         V7   every expert E4M3 with E8M0 1x32 scales (the MXFP8 release)
// The first value of each is the seed's. Presets: seed, vllm-mono, aiter, atom (VARIANTS.md
// §1). A value that is declared but not modelled yet is refused by check_variant, naming it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k4 {

enum class RouterGate : uint8_t { bf16, f32 };
enum class WideRows : uint8_t { all, exclude_pad };
enum class WideDownOrder : uint8_t { flat, per_expert };
enum class KvScale : uint8_t { per_key, scalar, static448, atom_vllm };
enum class NarrowFinal : uint8_t { one_chain, split };
enum class ExpertFormat : uint8_t { mxfp4, mxfp8 };

struct Variant {
  RouterGate router_gate = RouterGate::bf16;
  bool round_logit = true;
  WideRows wide_live_rows = WideRows::all;
  WideDownOrder wide_down_order = WideDownOrder::flat;
  KvScale kv_scale = KvScale::per_key;
  NarrowFinal narrow_final = NarrowFinal::one_chain;
  bool shared_fp8 = false;
  bool index_cp = false;
  ExpertFormat experts = ExpertFormat::mxfp4;
};
bool operator==(const Variant& a, const Variant& b);
inline bool operator!=(const Variant& a, const Variant& b) { return !(a == b); }

// One switch: its name, the numerics.md rule, a line of what it does, its values (the seed's
// first), which of them are modelled, and access to its value as an index into `values`.
struct VariantSwitch {
  const char* name;
  const char* rule;
  const char* doc;
  std::vector<const char*> values;
  std::vector<bool> modelled;
  int (*get)(const Variant&);
  void (*set)(Variant&, int);
};
const std::vector<VariantSwitch>& variant_switches();  // in the order of the table above
const VariantSwitch& variant_switch(const std::string& name);  // throws std::invalid_argument
std::string switch_value(const Variant& v, const VariantSwitch& s);
// Sets switch s from its value's name; throws std::invalid_argument listing the values.
void set_switch(Variant& v, const VariantSwitch& s, const std::string& value);

std::vector<std::string> variant_preset_names();  // seed, vllm-mono, aiter, atom
Variant variant_preset(const std::string& name);  // throws std::invalid_argument

// "aiter", "atom,router.round_logit=false", "router.gate=f32": comma-separated items applied
// left to right to the seed, each a preset name or SWITCH=VALUE. Throws
// std::invalid_argument naming the item. Modelled or not is check_variant's question.
Variant parse_variant(const std::string& spec);
// The switches of `to` that differ from `from`, as SWITCH=VALUE, in table order.
std::vector<std::string> variant_diff(const Variant& from, const Variant& to);
// The canonical spec: a preset's name, or the preset with the fewest differing switches
// (earlier presets first) followed by those switches, e.g. "aiter,moe.wide_live_rows=all".
// parse_variant(variant_name(v)) == v.
std::string variant_name(const Variant& v);

// Throws std::invalid_argument naming every switch value that is declared but not modelled.
void check_variant(const Variant& v);

}  // namespace k4
