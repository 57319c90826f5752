// schema.cpp -- the schema table (tensors.hpp), the dtypes, the named dimensions and the
// config's JSON form.
#include "golden/format/schema.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>

#include "golden/io/hdf5.hpp"

namespace k4::golden {

#ifndef K4_TOOL_VERSION
#define K4_TOOL_VERSION "k4 0.1.0"
#endif

std::string tool_version() { return K4_TOOL_VERSION; }

const char* dtype_name(DType d) {
  switch (d) {
    case DType::BF16: return "bf16";
    case DType::F32: return "f32";
    case DType::I32: return "i32";
    case DType::U8: return "u8";
    case DType::E4M3: return "e4m3";
    case DType::E8M0: return "e8m0";
    case DType::E2M1X2: return "e2m1x2";
  }
  return "?";
}

bool dtype_from_name(const std::string& s, DType& out) {
  for (DType d : {DType::BF16, DType::F32, DType::I32, DType::U8, DType::E4M3, DType::E8M0, DType::E2M1X2})
    if (s == dtype_name(d)) {
      out = d;
      return true;
    }
  return false;
}

size_t dtype_bytes(DType d) {
  switch (d) {
    case DType::BF16: return 2;
    case DType::F32:
    case DType::I32: return 4;
    default: return 1;
  }
}

// A stage output's field of the model's RankResult (reference/model.hpp).
#define F(member) [](RankResult& r) -> ResultVec { return &r.member; }

// clang-format off
// The one table. Order = write order (fixed: byte-identical files).
const std::vector<TensorSpec>& tensor_specs() {
  using D = DType;
  static const std::vector<TensorSpec> t = {
    // shared inputs
    {"/inputs", "seq_lens", D::I32, "token", "", "keys a row attends to (0 = pad row: one key of page 0)"},
    {"/inputs", "block_table", D::I32, "token,bt_block", "", "page id of each 128-key block; its 8 pages are entry * kv_page_stride + j"},
    {"/inputs", "h_in", D::BF16, "token,hidden", "", "residual stream entering the layer's post-attention"},
    // stage 0: index
    {"index/inputs", "seq_lens", D::I32, "token", "/inputs/seq_lens", "shared input"},
    {"index/inputs", "block_table", D::I32, "token,bt_block", "/inputs/block_table", "shared input"},
    {"index/inputs", "index_scores", D::F32, "token,score_block", "", "K1's per-block index score from this rank's own index head (pinned blocks' unread)"},
    {"index/outputs", "sparse_table", D::I32, "token,table_word", "", "page ids of slot s at s*8 + j; the last word n_ctx; unselected 0", F(index.sparse_table)},
    {"index/outputs", "blocks", D::I32, "token,topk_slot", "", "block id in each slot, -1 where none", F(index.blocks)},
    {"index/outputs", "n_ctx", D::I32, "token", "", "sparse context length (keys)", F(index.n_ctx)},
    {"index/outputs", "long_row", D::U8, "token", "", "1 where the row took the split-candidate path", F(index.long_row)},
    // stage 1: split
    {"split/inputs", "q", D::BF16, "token,dim", "", "this rank's q heads (16 x 128)"},
    {"split/inputs", "k_cache", D::E4M3, "page,page_byte", "", "K pages, K at byte (d/16)*256 + t*16 + d%16 (see page_ids)"},
    {"split/inputs", "v_cache", D::E4M3, "page,page_byte", "", "V pages, V at byte d*16 + t (see page_ids)"},
    {"split/inputs", "k_scale", D::F32, "kv_scale", "", "K dequant scale a key (page,page_key), or one a cache (static)"},
    {"split/inputs", "v_scale", D::F32, "kv_scale", "", "V dequant scale a key (page,page_key), or one a cache (static)"},
    {"split/inputs", "page_ids", D::I32, "page", "", "selected form only: the cache page id of each stored page"},
    {"split/inputs", "seq_lens", D::I32, "token", "/inputs/seq_lens", "shared input"},
    {"split/inputs", "sparse_table", D::I32, "token,table_word", "@index/outputs/sparse_table", "stage 0 output"},
    {"split/inputs", "blocks", D::I32, "token,topk_slot", "@index/outputs/blocks", "stage 0 output"},
    {"split/inputs", "n_ctx", D::I32, "token", "@index/outputs/n_ctx", "stage 0 output"},
    {"split/inputs", "long_row", D::U8, "token", "@index/outputs/long_row", "stage 0 output"},
    {"split/outputs", "q8", D::E4M3, "token,dim", "", "E4M3(q), NoSaturate", F(split.q8)},
    {"split/outputs", "o", D::BF16, "token,split,dim", "", "partition outputs", F(split.o)},
    {"split/outputs", "m", D::F32, "token,split,head", "", "partition score max", F(split.m)},
    {"split/outputs", "l", D::F32, "token,split,head", "", "partition exp-sum", F(split.l)},
    // stage 2: merge
    {"merge/inputs", "q8", D::E4M3, "token,dim", "@split/outputs/q8", "stage 1 output"},
    {"merge/inputs", "o", D::BF16, "token,split,dim", "@split/outputs/o", "stage 1 output"},
    {"merge/inputs", "m", D::F32, "token,split,head", "@split/outputs/m", "stage 1 output"},
    {"merge/inputs", "l", D::F32, "token,split,head", "@split/outputs/l", "stage 1 output"},
    {"merge/outputs", "attn", D::BF16, "token,dim", "", "LSE-merged attention (before the quant)", F(merge.attn)},
    {"merge/outputs", "attn8", D::E4M3, "token,dim", "", "E4M3(attn * rcp(x_scale)), NoSaturate", F(merge.attn8)},
    {"merge/outputs", "x_scale", D::F32, "token", "", "per-token scale amax * f32(1/448)", F(merge.x_scale)},
    // stage 3: o_proj and the first all-reduce
    {"oproj/inputs", "attn", D::BF16, "token,dim", "@merge/outputs/attn", "stage 2 output"},
    {"oproj/inputs", "attn8", D::E4M3, "token,dim", "@merge/outputs/attn8", "stage 2 output"},
    {"oproj/inputs", "x_scale", D::F32, "token", "@merge/outputs/x_scale", "stage 2 output"},
    {"oproj/inputs", "w_o", D::E4M3, "hidden,dim", "", "o_proj shard: this rank's o_k input columns"},
    {"oproj/inputs", "s_o", D::F32, "hidden", "", "o_proj row scale"},
    {"oproj/inputs", "h_in", D::BF16, "token,hidden", "/inputs/h_in", "shared input"},
    {"oproj/outputs", "partial", D::BF16, "token,hidden", "", "this rank's o_proj partial rows", F(oproj.partial)},
    {"oproj/outputs", "a", D::BF16, "token,hidden", "", "all-reduced o_proj rows (every rank's partial, rank order)", F(a)},
    {"oproj/outputs", "h_mid", D::BF16, "token,hidden", "", "bf16(f32(a) + f32(h_in))", F(h_mid)},
    // stage 4: router
    {"router/inputs", "a", D::BF16, "token,hidden", "@oproj/outputs/a", "stage 3 output"},
    {"router/inputs", "h_in", D::BF16, "token,hidden", "/inputs/h_in", "shared input"},
    {"router/inputs", "g_post", D::BF16, "hidden", "", "Gemma RMSNorm weight (x * (1 + g))"},
    {"router/inputs", "w_gate", D::BF16, "expert,hidden", "", "router gate (the bf16 copy of the F32 gate)"},
    {"router/inputs", "w_gate_f32", D::F32, "expert,hidden", "", "router.gate = f32 only: the F32 gate the logits read (V1a)"},
    {"router/inputs", "bias", D::F32, "expert", "", "e_score_correction_bias"},
    {"router/outputs", "xn", D::BF16, "token,hidden", "", "normed row", F(router.xn)},
    {"router/outputs", "xn8", D::E4M3, "token,hidden", "", "MXFP8 elements of xn", F(router.xn8)},
    {"router/outputs", "xsc", D::E8M0, "token,hidden_block", "", "MXFP8 scales of xn, one a 32-block", F(router.xsc)},
    {"router/outputs", "rstd", D::F32, "token", "", "RMSNorm rsq(ss / hidden + eps)", F(router.rstd)},
    {"router/outputs", "logit", D::F32, "token,expert", "", "gate logit (before bf16)", F(router.logit)},
    {"router/outputs", "sig", D::F32, "token,expert", "", "sigmoid(bf16(logit)), unbiased", F(router.sig)},
    {"router/outputs", "key", D::I32, "token,expert", "", "route key of sig + bias", F(router.key)},
    // stage 5: experts and the second all-reduce
    {"moe/inputs", "xn", D::BF16, "token,hidden", "@router/outputs/xn", "stage 4 output"},
    {"moe/inputs", "xn8", D::E4M3, "token,hidden", "@router/outputs/xn8", "stage 4 output"},
    {"moe/inputs", "xsc", D::E8M0, "token,hidden_block", "@router/outputs/xsc", "stage 4 output"},
    {"moe/inputs", "rstd", D::F32, "token", "@router/outputs/rstd", "stage 4 output"},
    {"moe/inputs", "logit", D::F32, "token,expert", "@router/outputs/logit", "stage 4 output"},
    {"moe/inputs", "sig", D::F32, "token,expert", "@router/outputs/sig", "stage 4 output"},
    {"moe/inputs", "key", D::I32, "token,expert", "@router/outputs/key", "stage 4 output"},
    {"moe/inputs", "seq_lens", D::I32, "token", "/inputs/seq_lens", "moe.wide_live_rows = exclude_pad only: shared input (live rows: seq_len > 0, V2)"},
    {"moe/inputs", "expert_ids", D::I32, "used_expert", "", "the experts stored below: every id routed this step, ascending (the shared expert last)"},
    {"moe/inputs", "w13", D::E2M1X2, "expert_w13", "", "gate rows then up rows, E2M1 pairs (E4M3 under moe.experts = mxfp8)"},
    {"moe/inputs", "s13", D::E8M0, "used_expert,gate_up_row,hidden_block", "", "w13 block scales"},
    {"moe/inputs", "w2", D::E2M1X2, "expert_w2", "", "down projection, E2M1 pairs (E4M3 under moe.experts = mxfp8)"},
    {"moe/inputs", "s2", D::E8M0, "used_expert,hidden,inter_block", "", "w2 block scales"},
    {"moe/inputs", "sh_w13", D::E4M3, "sh_expert,gate_up_row,hidden", "", "moe.shared_fp8 only: the MXFP8 shared expert, gate rows then up rows, E4M3"},
    {"moe/inputs", "sh_s13", D::E8M0, "sh_expert,gate_up_row,hidden_block", "", "moe.shared_fp8 only: sh_w13 block scales"},
    {"moe/inputs", "sh_w2", D::E4M3, "sh_expert,hidden,inter", "", "moe.shared_fp8 only: the MXFP8 shared expert's down projection, E4M3"},
    {"moe/inputs", "sh_s2", D::E8M0, "sh_expert,hidden,inter_block", "", "moe.shared_fp8 only: sh_w2 block scales"},
    {"moe/outputs", "route_ids", D::I32, "token,slot", "", "slots 0..3 the picks in pick order, 4 the shared expert", F(route.ids)},
    {"moe/outputs", "route_weights", D::F32, "token,slot", "", "routing weights", F(route.weights)},
    {"moe/outputs", "gate", D::F32, "token,slot,inter", "", "gate GEMV (before swiglu)", F(moe.gate)},
    {"moe/outputs", "up", D::F32, "token,slot,inter", "", "up GEMV", F(moe.up)},
    {"moe/outputs", "mid", D::BF16, "token,slot,inter", "", "swiglu output", F(moe.mid)},
    {"moe/outputs", "mid8", D::E4M3, "token,slot,inter", "", "MXFP8 elements of mid", F(moe.mid8)},
    {"moe/outputs", "midsc", D::E8M0, "token,slot,inter_block", "", "MXFP8 scales of mid", F(moe.midsc)},
    {"moe/outputs", "partial", D::BF16, "token,hidden", "", "this rank's FFN partial rows", F(moe.partial)},
    {"moe/outputs", "ar_out", D::BF16, "token,hidden", "", "all-reduced FFN rows (every rank's partial, rank order)", F(ar_out)},
  };
  return t;
}
// clang-format on
#undef F

std::vector<const TensorSpec*> specs_of(const std::string& group) {
  std::vector<const TensorSpec*> out;
  for (const TensorSpec& s : tensor_specs())
    if (group == s.group) out.push_back(&s);
  return out;
}

const TensorSpec* result_spec(const TensorSpec& s) {
  if (s.field) return &s;
  if (s.link[0] != '@') return nullptr;  // stored here (a weight, a KV page) or a shared input
  const std::string target = s.link + 1;  // "<stage>/<io>/<name>"
  const size_t slash = target.rfind('/');
  const TensorSpec& t = find_spec(target.substr(0, slash), target.substr(slash + 1));
  return t.field ? &t : nullptr;
}

const std::vector<std::string>& stage_names() {
  static const std::vector<std::string> s = {"index", "split", "merge", "oproj", "router", "moe"};
  return s;
}

int64_t DimSizes::of(const std::string& d) const {
  const Config& c = cfg;
  if (d == "token") return tokens;
  if (d == "dim") return c.o_k();
  if (d == "split") return c.n_split;
  if (d == "head") return c.heads;
  if (d == "hidden") return c.hidden;
  if (d == "hidden_pair") return c.hidden / 2;
  if (d == "hidden_block") return c.hidden / 32;
  if (d == "expert") return c.n_routed;
  if (d == "slot") return c.moe_slots();
  if (d == "inter") return c.inter;
  if (d == "inter_pair") return c.inter / 2;
  if (d == "inter_block") return c.inter / 32;
  if (d == "gate_up_row") return 2 * c.inter;
  if (d == "table_word") return c.sparse_table_words();
  if (d == "topk_slot") return c.topk_blocks;
  if (d == "bt_block") return bt_width;
  if (d == "score_block") return score_width;
  if (d == "page") return pages;
  if (d == "page_byte") return int64_t(c.page) * c.head_dim;
  if (d == "page_key") return c.page;
  if (d == "one") return 1;
  if (d == "used_expert") return used_experts;
  if (d == "sh_expert") return 1;
  throw std::logic_error("schema: unknown dimension '" + d + "'");
}

std::string DimSizes::dims_of(const char* dims) const {
  const std::string d = dims;
  if (d == "kv_scale") return cfg.one_kv_scale() ? "one" : "page,page_key";
  // the stored experts' weights: E2M1 pairs, or one E4M3 byte an element (moe.experts = mxfp8)
  const bool fp8 = cfg.variant.experts == ExpertFormat::mxfp8;
  if (d == "expert_w13") return fp8 ? "used_expert,gate_up_row,hidden" : "used_expert,gate_up_row,hidden_pair";
  if (d == "expert_w2") return fp8 ? "used_expert,hidden,inter" : "used_expert,hidden,inter_pair";
  return d;
}

DType DimSizes::dtype_of(const TensorSpec& s) const { return spec_dtype(s, cfg); }

// (schema.hpp) ... and the link moe/inputs/seq_lens only under moe.wide_live_rows = exclude_pad
// (V2: the moe stage alone derives its live rows from it).
bool spec_present(const TensorSpec& s, const Config& c) {
  if (std::string(s.name) == "w_gate_f32") return c.variant.router_gate == RouterGate::f32;
  if (std::string(s.group) == "moe/inputs" && std::string(s.name) == "seq_lens")  // V2: the stage derives its live rows
    return c.variant.wide_live_rows == WideRows::exclude_pad;
  return std::string(s.dims).rfind("sh_expert,", 0) != 0 || c.variant.shared_fp8;
}

DType spec_dtype(const TensorSpec& s, const Config& c) {
  const std::string d = s.dims;
  if ((d == "expert_w13" || d == "expert_w2") && c.variant.experts == ExpertFormat::mxfp8) return DType::E4M3;
  return s.dtype;
}

int stage_of(const TensorSpec& s) {
  const std::string g = s.group;
  const std::vector<std::string>& st = stage_names();
  for (size_t i = 0; i < st.size(); ++i)
    if (g.compare(0, st[i].size() + 1, st[i] + "/") == 0) return int(i);
  return -1;
}

uint64_t DimSizes::count(const char* dims) const {
  uint64_t n = 1;
  for (uint64_t x : shape(dims)) n *= x;
  return n;
}

std::vector<uint64_t> DimSizes::shape(const char* dims) const {
  std::vector<uint64_t> s;
  const std::string d = dims_of(dims);
  size_t i = 0;
  while (i <= d.size()) {
    size_t j = d.find(',', i);
    if (j == std::string::npos) j = d.size();
    s.push_back(uint64_t(of(d.substr(i, j - i))));
    i = j + 1;
  }
  return s;
}

// ---- config JSON -----------------------------------------------------------------------

#define K4_CONFIG_FIELDS(X)                                                                          \
  X(name) X(heads) X(head_dim) X(hidden) X(n_routed) X(top_k) X(inter) X(sparse_block) X(topk_blocks) \
  X(page) X(n_split) X(max_tokens) X(max_context) X(kv_page_stride) X(waves)                         \
  X(lanes) X(o_rows) X(dn_rows) X(ug_rows) X(sh_rows) X(tp) X(sm_scale) X(eps) X(route_scale)        \
  X(shared_weight) X(swiglu_limit) X(init_blocks) X(local_blocks) X(wide_from) X(ag_rs_from)

std::string config_to_json(const Config& c) {
  nlohmann::ordered_json j;
#define X(f) j[#f] = c.f;
  K4_CONFIG_FIELDS(X)
#undef X
  nlohmann::ordered_json v;  // every switch of the variant, by name (reference/variant.hpp)
  for (const VariantSwitch& s : variant_switches()) v[s.name] = switch_value(c.variant, s);
  j["variant"] = v;
  return j.dump();
}

namespace {

// One config field, of its own type: an int must be a JSON integer in the int range, a float
// a finite number in the float range (nlohmann's get_to would convert 1e20 to int: undefined
// behaviour, found by fuzzing), a bool a boolean, the name a string.
[[noreturn]] void bad_field(const std::string& where, const char* f, const nlohmann::json& v, const char* want) {
  throw FormatError(where + ": config field '" + f + "' is " + v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                    ", expected " + want);
}
void config_field(const nlohmann::json& v, const char* f, int& out, const std::string& where) {
  if (!v.is_number_integer()) bad_field(where, f, v, "an integer");
  if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT32_MAX) : (v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX))
    bad_field(where, f, v, "an integer in the int range");
  out = int(v.get<int64_t>());
}
void config_field(const nlohmann::json& v, const char* f, float& out, const std::string& where) {
  if (!v.is_number()) bad_field(where, f, v, "a number");
  const double d = v.get<double>();
  if (!(std::fabs(d) <= double(FLT_MAX))) bad_field(where, f, v, "a finite number in the float range");
  out = float(d);
}
void config_field(const nlohmann::json& v, const char* f, std::string& out, const std::string& where) {
  if (!v.is_string()) bad_field(where, f, v, "a string");
  out = v.get<std::string>();
}

// The variant object: every switch of this tool's table, each a known value. moe.experts
// came after the others: a variant object without it is of the MXFP4 experts (mxfp4).
void config_variant(const nlohmann::json& v, Variant& out, const std::string& where) {
  if (!v.is_object()) bad_field(where, "variant", v, "an object of variant switches");
  for (const VariantSwitch& s : variant_switches()) {
    if (!v.contains(s.name) && std::string(s.name) == "moe.experts") continue;
    if (!v.contains(s.name)) throw FormatError(where + ": config variant lacks switch '" + s.name + "'");
    const nlohmann::json& x = v.at(s.name);
    if (!x.is_string()) bad_field(where, s.name, x, "a string");
    try {
      set_switch(out, s, x.get<std::string>());
    } catch (const std::invalid_argument& e) {
      throw FormatError(where + ": config " + e.what());
    }
  }
  for (auto it = v.begin(); it != v.end(); ++it) {
    bool known = false;
    for (const VariantSwitch& s : variant_switches()) known = known || it.key() == s.name;
    if (!known) throw FormatError(where + ": config variant has switch '" + it.key() + "' this tool does not know");
  }
}

}  // namespace

Config config_from_json(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw FormatError(where + ": config is not JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw FormatError(where + ": config is not a JSON object");
  Config c;
  std::set<std::string> known;
#define X(f)                                                                      \
  known.insert(#f);                                                               \
  if (!j.contains(#f)) throw FormatError(where + ": config lacks field '" #f "'"); \
  config_field(j.at(#f), #f, c.f, where);
  K4_CONFIG_FIELDS(X)
#undef X
  if (j.contains("variant")) {
    known.insert("variant");
    config_variant(j.at("variant"), c.variant, where);
  } else if (j.contains("static_kv_scale")) {
    // a schema version 1 config (before the variants): the seed's build, one k / v scale a
    // cache or one a key
    known.insert("static_kv_scale");
    if (!j.at("static_kv_scale").is_boolean()) bad_field(where, "static_kv_scale", j.at("static_kv_scale"), "true or false");
    c.variant.kv_scale = j.at("static_kv_scale").get<bool>() ? KvScale::scalar : KvScale::per_key;
  } else {
    throw FormatError(where + ": config lacks field 'variant'");
  }
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) throw FormatError(where + ": config has field '" + it.key() + "' this tool does not know");
  try {
    c.validate();
  } catch (const std::exception& e) {
    throw FormatError(where + ": " + e.what());
  }
  return c;
}

// ---- stored form -----------------------------------------------------------------------

h5::Elem stored_elem(DType d) {
  switch (d) {
    case DType::BF16: return h5::Elem::U16;
    case DType::F32: return h5::Elem::U32;
    case DType::I32: return h5::Elem::I32;
    default: return h5::Elem::U8;
  }
}

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string o = "(";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(s[i]);
  return o + ")";
}

const TensorSpec& find_spec(const std::string& group, const std::string& name) {
  for (const TensorSpec& s : tensor_specs())
    if (group == s.group && name == s.name) return s;
  throw std::logic_error("schema: no tensor " + group + "/" + name);
}

}  // namespace k4::golden
