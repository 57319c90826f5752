// schema.cpp -- the schema table, the config's JSON form, and the golden writer.
#include "golden/schema.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>

#include "golden/atomic_file.hpp"
#include "golden/hdf5.hpp"

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

// clang-format off
// The one table. Order = write order (fixed: byte-identical files).
const std::vector<TensorSpec>& tensor_specs() {
  using D = DType;
  static const std::vector<TensorSpec> t = {
    // shared inputs
    {"/inputs", "seq_lens", D::I32, "token", "", "keys a row attends to (0 = pad row: one key of page 0)"},
    {"/inputs", "block_table", D::I32, "token,bt_block", "", "page id of each 128-key block; its 8 pages are entry * kv_page_stride + j"},
    {"/inputs", "index_scores", D::F32, "token,score_block", "", "K1's per-block index score (pinned blocks' unread)"},
    {"/inputs", "h_in", D::BF16, "token,hidden", "", "residual stream entering the layer's post-attention"},
    // stage 0: index
    {"index/inputs", "seq_lens", D::I32, "token", "/inputs/seq_lens", "shared input"},
    {"index/inputs", "block_table", D::I32, "token,bt_block", "/inputs/block_table", "shared input"},
    {"index/inputs", "index_scores", D::F32, "token,score_block", "/inputs/index_scores", "shared input"},
    {"index/outputs", "sparse_table", D::I32, "token,table_word", "", "page ids of slot s at s*8 + j; the last word n_ctx; unselected 0"},
    {"index/outputs", "blocks", D::I32, "token,topk_slot", "", "block id in each slot, -1 where none"},
    {"index/outputs", "n_ctx", D::I32, "token", "", "sparse context length (keys)"},
    {"index/outputs", "long_row", D::U8, "token", "", "1 where the row took the split-candidate path"},
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
    {"split/outputs", "q8", D::E4M3, "token,dim", "", "E4M3(q), NoSaturate"},
    {"split/outputs", "o", D::BF16, "token,split,dim", "", "partition outputs"},
    {"split/outputs", "m", D::F32, "token,split,head", "", "partition score max"},
    {"split/outputs", "l", D::F32, "token,split,head", "", "partition exp-sum"},
    // stage 2: merge
    {"merge/inputs", "q8", D::E4M3, "token,dim", "@split/outputs/q8", "stage 1 output"},
    {"merge/inputs", "o", D::BF16, "token,split,dim", "@split/outputs/o", "stage 1 output"},
    {"merge/inputs", "m", D::F32, "token,split,head", "@split/outputs/m", "stage 1 output"},
    {"merge/inputs", "l", D::F32, "token,split,head", "@split/outputs/l", "stage 1 output"},
    {"merge/outputs", "attn", D::BF16, "token,dim", "", "LSE-merged attention (before the quant)"},
    {"merge/outputs", "attn8", D::E4M3, "token,dim", "", "E4M3(attn * rcp(x_scale)), NoSaturate"},
    {"merge/outputs", "x_scale", D::F32, "token", "", "per-token scale amax * f32(1/448)"},
    // stage 3: o_proj and the first all-reduce
    {"oproj/inputs", "attn", D::BF16, "token,dim", "@merge/outputs/attn", "stage 2 output"},
    {"oproj/inputs", "attn8", D::E4M3, "token,dim", "@merge/outputs/attn8", "stage 2 output"},
    {"oproj/inputs", "x_scale", D::F32, "token", "@merge/outputs/x_scale", "stage 2 output"},
    {"oproj/inputs", "w_o", D::E4M3, "hidden,dim", "", "o_proj shard: this rank's o_k input columns"},
    {"oproj/inputs", "s_o", D::F32, "hidden", "", "o_proj row scale"},
    {"oproj/inputs", "h_in", D::BF16, "token,hidden", "/inputs/h_in", "shared input"},
    {"oproj/outputs", "partial", D::BF16, "token,hidden", "", "this rank's o_proj partial rows"},
    {"oproj/outputs", "a", D::BF16, "token,hidden", "", "all-reduced o_proj rows (every rank's partial, rank order)"},
    {"oproj/outputs", "h_mid", D::BF16, "token,hidden", "", "bf16(f32(a) + f32(h_in))"},
    // stage 4: router
    {"router/inputs", "a", D::BF16, "token,hidden", "@oproj/outputs/a", "stage 3 output"},
    {"router/inputs", "h_in", D::BF16, "token,hidden", "/inputs/h_in", "shared input"},
    {"router/inputs", "g_post", D::BF16, "hidden", "", "Gemma RMSNorm weight (x * (1 + g))"},
    {"router/inputs", "w_gate", D::BF16, "expert,hidden", "", "router gate"},
    {"router/inputs", "bias", D::F32, "expert", "", "e_score_correction_bias"},
    {"router/outputs", "xn", D::BF16, "token,hidden", "", "normed row"},
    {"router/outputs", "xn8", D::E4M3, "token,hidden", "", "MXFP8 elements of xn"},
    {"router/outputs", "xsc", D::E8M0, "token,hidden_block", "", "MXFP8 scales of xn, one a 32-block"},
    {"router/outputs", "rstd", D::F32, "token", "", "RMSNorm rsq(ss / hidden + eps)"},
    {"router/outputs", "logit", D::F32, "token,expert", "", "gate logit (before bf16)"},
    {"router/outputs", "sig", D::F32, "token,expert", "", "sigmoid(bf16(logit)), unbiased"},
    {"router/outputs", "key", D::I32, "token,expert", "", "route key of sig + bias"},
    // stage 5: experts and the second all-reduce
    {"moe/inputs", "xn", D::BF16, "token,hidden", "@router/outputs/xn", "stage 4 output"},
    {"moe/inputs", "xn8", D::E4M3, "token,hidden", "@router/outputs/xn8", "stage 4 output"},
    {"moe/inputs", "xsc", D::E8M0, "token,hidden_block", "@router/outputs/xsc", "stage 4 output"},
    {"moe/inputs", "rstd", D::F32, "token", "@router/outputs/rstd", "stage 4 output"},
    {"moe/inputs", "logit", D::F32, "token,expert", "@router/outputs/logit", "stage 4 output"},
    {"moe/inputs", "sig", D::F32, "token,expert", "@router/outputs/sig", "stage 4 output"},
    {"moe/inputs", "key", D::I32, "token,expert", "@router/outputs/key", "stage 4 output"},
    {"moe/inputs", "expert_ids", D::I32, "used_expert", "", "the experts stored below: every id routed this step, ascending (the shared expert last)"},
    {"moe/inputs", "w13", D::E2M1X2, "used_expert,gate_up_row,hidden_pair", "", "gate rows then up rows, E2M1 pairs"},
    {"moe/inputs", "s13", D::E8M0, "used_expert,gate_up_row,hidden_block", "", "w13 block scales"},
    {"moe/inputs", "w2", D::E2M1X2, "used_expert,hidden,inter_pair", "", "down projection, E2M1 pairs"},
    {"moe/inputs", "s2", D::E8M0, "used_expert,hidden,inter_block", "", "w2 block scales"},
    {"moe/outputs", "route_ids", D::I32, "token,slot", "", "slots 0..3 the picks in pick order, 4 the shared expert"},
    {"moe/outputs", "route_weights", D::F32, "token,slot", "", "routing weights"},
    {"moe/outputs", "gate", D::F32, "token,slot,inter", "", "gate GEMV (before swiglu)"},
    {"moe/outputs", "up", D::F32, "token,slot,inter", "", "up GEMV"},
    {"moe/outputs", "mid", D::BF16, "token,slot,inter", "", "swiglu output"},
    {"moe/outputs", "mid8", D::E4M3, "token,slot,inter", "", "MXFP8 elements of mid"},
    {"moe/outputs", "midsc", D::E8M0, "token,slot,inter_block", "", "MXFP8 scales of mid"},
    {"moe/outputs", "partial", D::BF16, "token,hidden", "", "this rank's FFN partial rows"},
    {"moe/outputs", "ar_out", D::BF16, "token,hidden", "", "all-reduced FFN rows (every rank's partial, rank order)"},
  };
  return t;
}
// clang-format on

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
  throw std::logic_error("schema: unknown dimension '" + d + "'");
}

std::string DimSizes::dims_of(const char* dims) const {
  if (std::string(dims) == "kv_scale") return cfg.static_kv_scale ? "one" : "page,page_key";
  return dims;
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
  X(page) X(n_split) X(max_tokens) X(max_context) X(kv_page_stride) X(static_kv_scale) X(waves)      \
  X(lanes) X(o_rows) X(dn_rows) X(ug_rows) X(sh_rows) X(tp) X(sm_scale) X(eps) X(route_scale)        \
  X(shared_weight) X(swiglu_limit) X(init_blocks) X(local_blocks) X(wide_from) X(ag_rs_from)

std::string config_to_json(const Config& c) {
  nlohmann::ordered_json j;
#define X(f) j[#f] = c.f;
  K4_CONFIG_FIELDS(X)
#undef X
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
void config_field(const nlohmann::json& v, const char* f, bool& out, const std::string& where) {
  if (!v.is_boolean()) bad_field(where, f, v, "true or false");
  out = v.get<bool>();
}
void config_field(const nlohmann::json& v, const char* f, std::string& out, const std::string& where) {
  if (!v.is_string()) bad_field(where, f, v, "a string");
  out = v.get<std::string>();
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
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) throw FormatError(where + ": config has field '" + it.key() + "' this tool does not know");
  try {
    c.validate();
  } catch (const std::exception& e) {
    throw FormatError(where + ": " + e.what());
  }
  return c;
}

// ---- writer ----------------------------------------------------------------------------

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

namespace {

struct Writer {
  h5::File file;
  DimSizes dims;
  uint64_t done = 0, total = 0;
  const WriteOptions* opt = nullptr;

  void tick(uint64_t bytes) {
    count_written(bytes);  // K4_FAIL_AFTER_BYTES (atomic_file.hpp)
    done += bytes;
    if (opt->progress) opt->progress(done, total);
  }

  void describe(const h5::Dataset& d, const TensorSpec& s) const {
    d.set_attr("dtype", dtype_name(s.dtype));
    d.set_attr("dims", dims.dims_of(s.dims));
    d.set_attr("meaning", s.meaning);
  }

  // One stored tensor: shape from the table, one H5Dwrite.
  template <class T>
  void put(const h5::Group& g, const std::string& group, const std::string& name, const std::vector<T>& v) const {
    const TensorSpec& s = find_spec(group, name);
    static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4, "raw-bit element");
    if (sizeof(T) != dtype_bytes(s.dtype)) throw std::logic_error("schema: element size of " + group + "/" + name);
    const std::vector<uint64_t> shape = dims.shape(s.dims);
    uint64_t n = 1;
    for (uint64_t x : shape) n *= x;
    if (v.size() != n)
      throw std::invalid_argument("golden " + file.path() + ": " + g.child_path(name) + " has " +
                                  std::to_string(v.size()) + " elements, expected " + std::to_string(n) + " (" +
                                  dims.dims_of(s.dims) + ")");
    h5::Dataset d = g.create_dataset(name, stored_elem(s.dtype), shape);
    d.write_raw(v.data(), stored_elem(s.dtype));
    describe(d, s);
    const_cast<Writer*>(this)->tick(n * sizeof(T));
  }
};

void put_links(const h5::Group& g, const std::string& group, int rank) {
  for (const TensorSpec& s : tensor_specs()) {
    if (group != s.group || s.link[0] == '\0') continue;
    std::string target = s.link;
    if (target[0] == '@') target = "/rank" + std::to_string(rank) + "/" + target.substr(1);
    g.link_soft(s.name, target);
  }
}

// A replicated weight: rank r > 0 links to rank 0's copy when the bits are equal.
template <class T>
void put_or_link(const Writer& W, const h5::Group& g, const std::string& group, const std::string& name,
                 const std::vector<T>& v, const std::vector<T>& rank0, int rank) {
  if (rank > 0 && v == rank0)
    g.link_soft(name, "/rank0/" + group + "/" + name);
  else
    W.put(g, group, name, v);
}

std::vector<int32_t> used_experts(const RouteOut& route, const Config& cfg) {
  std::set<int32_t> ids(route.ids.begin(), route.ids.end());
  std::vector<int32_t> out;
  for (int32_t e : ids)
    if (e < 0 || e > cfg.n_routed)
      throw std::invalid_argument("golden: route id " + std::to_string(e) + " is outside 0.." + std::to_string(cfg.n_routed));
  out.assign(ids.begin(), ids.end());  // ascending: the shared expert (n_routed) last
  return out;
}

void put_experts(Writer& W, const h5::Group& g, const LayerWeights& lw, int rank, const std::vector<int32_t>& ids) {
  const Config& c = lw.cfg;
  W.put(g, "moe/inputs", "expert_ids", ids);
  struct Part {
    const char* name;
    std::vector<uint8_t> ExpertWeights::*field;
  } parts[] = {{"w13", &ExpertWeights::w13}, {"s13", &ExpertWeights::s13}, {"w2", &ExpertWeights::w2},
               {"s2", &ExpertWeights::s2}};
  std::vector<h5::Dataset> ds;
  for (const Part& p : parts) {
    const TensorSpec& s = find_spec("moe/inputs", p.name);
    ds.push_back(g.create_dataset(p.name, h5::Elem::U8, W.dims.shape(s.dims)));
    W.describe(ds.back(), s);
  }
  // A batch of experts is materialized in parallel (the source is thread-safe), then written
  // one hyperslab each, in id order.
  constexpr size_t kBatch = 8;
  for (size_t i0 = 0; i0 < ids.size(); i0 += kBatch) {
    const size_t nb = std::min(kBatch, ids.size() - i0);
    std::vector<std::shared_ptr<const ExpertWeights>> batch(nb);
    std::vector<std::string> errors(nb);
#pragma omp parallel for schedule(dynamic)
    for (size_t j = 0; j < nb; ++j) {
      try {
        batch[j] = lw.experts->expert(rank, ids[i0 + j]);
      } catch (const std::exception& e) {
        errors[j] = e.what();
      }
    }
    for (size_t j = 0; j < nb; ++j)
      if (!errors[j].empty()) throw std::invalid_argument("golden: expert " + std::to_string(ids[i0 + j]) + ": " + errors[j]);
    for (size_t j = 0; j < nb; ++j) {
      const size_t i = i0 + j;
      for (size_t k = 0; k < 4; ++k) {
        const std::vector<uint8_t>& v = (*batch[j]).*(parts[k].field);
        const std::vector<uint64_t> sh = ds[k].shape();
        const uint64_t per = sh[1] * sh[2];
        if (v.size() != per)
          throw std::invalid_argument("golden: expert " + std::to_string(ids[i]) + " of rank " + std::to_string(rank) +
                                      ": " + parts[k].name + " has " + std::to_string(v.size()) + " bytes, expected " +
                                      std::to_string(per));
        ds[k].write_rows(i, 1, v.data(), h5::Elem::U8);
        W.tick(per);
      }
    }
  }
  (void)c;
}

// Pages the split reads: every page id of the sparse tables (unselected slots name page 0).
std::vector<int32_t> selected_pages(const IndexOut& idx, const Config& cfg, int tokens, int n_pages) {
  std::set<int32_t> pages;
  const int words = cfg.sparse_table_words();
  for (int k = 0; k < tokens; ++k)
    for (int w = 0; w + 1 < words; ++w) {
      const int32_t p = idx.sparse_table[size_t(k) * words + w];
      if (p >= 0 && p < n_pages) pages.insert(p);
    }
  return std::vector<int32_t>(pages.begin(), pages.end());
}

template <class T>
std::vector<T> gather_rows(const std::vector<T>& v, const std::vector<int32_t>& rows, size_t row_len) {
  std::vector<T> out(rows.size() * row_len);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.data() + i * row_len, v.data() + size_t(rows[i]) * row_len, row_len * sizeof(T));
  return out;
}

void write_rank(Writer& W, const h5::Group& root, const LayerWeights& lw, const StepInputs& in, const StepResult& res,
                const GoldenMeta& meta, int r) {
  const Config& c = lw.cfg;
  const RankResult& R = res.ranks[r];
  const StepRank& I = in.ranks[r];
  const RankWeights& w = lw.ranks[r];
  const RankWeights& w0 = lw.ranks[0];
  h5::Group rg = root.create_group("rank" + std::to_string(r));
  rg.set_attr("rank", int64_t(r));
  auto stage = [&](const std::string& s, const std::string& io) {
    h5::Group sg = rg.exists(s) ? rg.open_group(s) : rg.create_group(s);
    return sg.create_group(io);
  };
  // stage 0
  {
    h5::Group g = stage("index", "inputs");
    g.set_attr("tokens", int64_t(in.shared.tokens));
    g.set_attr("q_len", int64_t(in.shared.q_len));
    put_links(g, "index/inputs", r);
    h5::Group o = stage("index", "outputs");
    W.put(o, "index/outputs", "sparse_table", R.index.sparse_table);
    W.put(o, "index/outputs", "blocks", R.index.blocks);
    W.put(o, "index/outputs", "n_ctx", R.index.n_ctx);
    W.put(o, "index/outputs", "long_row", R.index.long_row);
  }
  // stage 1: the KV pages, whole or the selection
  {
    h5::Group g = stage("split", "inputs");
    const size_t page_bytes = size_t(c.page) * c.head_dim;
    const uint64_t kv_bytes = uint64_t(I.n_pages) * page_bytes * 2;
    std::string form = meta.kv_form;
    if (form == "auto") form = kv_bytes <= meta.whole_kv_limit ? "whole" : "selected";
    if (form != "whole" && form != "selected")
      throw std::invalid_argument("kv form '" + meta.kv_form + "' is none of whole, selected, auto");
    g.set_attr("kv_form", form);
    g.set_attr("n_pages", int64_t(I.n_pages));
    W.put(g, "split/inputs", "q", I.q);
    if (form == "whole") {
      W.dims.pages = I.n_pages;
      g.set_attr("n_stored_pages", int64_t(I.n_pages));
      W.put(g, "split/inputs", "k_cache", I.k_cache);
      W.put(g, "split/inputs", "v_cache", I.v_cache);
      W.put(g, "split/inputs", "k_scale", I.k_scale);
      W.put(g, "split/inputs", "v_scale", I.v_scale);
    } else {
      const std::vector<int32_t> pages = selected_pages(R.index, c, in.shared.tokens, I.n_pages);
      W.dims.pages = int(pages.size());
      g.set_attr("n_stored_pages", int64_t(pages.size()));
      W.put(g, "split/inputs", "page_ids", pages);
      W.put(g, "split/inputs", "k_cache", gather_rows(I.k_cache, pages, page_bytes));
      W.put(g, "split/inputs", "v_cache", gather_rows(I.v_cache, pages, page_bytes));
      if (c.static_kv_scale) {
        W.put(g, "split/inputs", "k_scale", I.k_scale);
        W.put(g, "split/inputs", "v_scale", I.v_scale);
      } else {
        W.put(g, "split/inputs", "k_scale", gather_rows(I.k_scale, pages, size_t(c.page)));
        W.put(g, "split/inputs", "v_scale", gather_rows(I.v_scale, pages, size_t(c.page)));
      }
    }
    put_links(g, "split/inputs", r);
    h5::Group o = stage("split", "outputs");
    W.put(o, "split/outputs", "q8", R.split.q8);
    W.put(o, "split/outputs", "o", R.split.o);
    W.put(o, "split/outputs", "m", R.split.m);
    W.put(o, "split/outputs", "l", R.split.l);
  }
  // stage 2
  {
    put_links(stage("merge", "inputs"), "merge/inputs", r);
    h5::Group o = stage("merge", "outputs");
    W.put(o, "merge/outputs", "attn", R.merge.attn);
    W.put(o, "merge/outputs", "attn8", R.merge.attn8);
    W.put(o, "merge/outputs", "x_scale", R.merge.x_scale);
  }
  // stage 3
  {
    h5::Group g = stage("oproj", "inputs");
    put_links(g, "oproj/inputs", r);
    W.put(g, "oproj/inputs", "w_o", w.w_o);
    put_or_link(W, g, "oproj/inputs", "s_o", w.s_o, w0.s_o, r);
    h5::Group o = stage("oproj", "outputs");
    W.put(o, "oproj/outputs", "partial", R.oproj.partial);
    W.put(o, "oproj/outputs", "a", R.a);
    W.put(o, "oproj/outputs", "h_mid", R.h_mid);
  }
  // stage 4
  {
    h5::Group g = stage("router", "inputs");
    put_links(g, "router/inputs", r);
    put_or_link(W, g, "router/inputs", "g_post", w.g_post, w0.g_post, r);
    put_or_link(W, g, "router/inputs", "w_gate", w.w_gate, w0.w_gate, r);
    put_or_link(W, g, "router/inputs", "bias", w.bias, w0.bias, r);
    h5::Group o = stage("router", "outputs");
    W.put(o, "router/outputs", "xn", R.router.xn);
    W.put(o, "router/outputs", "xn8", R.router.xn8);
    W.put(o, "router/outputs", "xsc", R.router.xsc);
    W.put(o, "router/outputs", "rstd", R.router.rstd);
    W.put(o, "router/outputs", "logit", R.router.logit);
    W.put(o, "router/outputs", "sig", R.router.sig);
    W.put(o, "router/outputs", "key", R.router.key);
  }
  // stage 5
  {
    h5::Group g = stage("moe", "inputs");
    put_links(g, "moe/inputs", r);
    const std::vector<int32_t> ids = used_experts(R.route, c);
    W.dims.used_experts = int(ids.size());
    g.set_attr("n_experts", int64_t(ids.size()));
    put_experts(W, g, lw, r, ids);
    h5::Group o = stage("moe", "outputs");
    W.put(o, "moe/outputs", "route_ids", R.route.ids);
    W.put(o, "moe/outputs", "route_weights", R.route.weights);
    W.put(o, "moe/outputs", "gate", R.moe.gate);
    W.put(o, "moe/outputs", "up", R.moe.up);
    W.put(o, "moe/outputs", "mid", R.moe.mid);
    W.put(o, "moe/outputs", "mid8", R.moe.mid8);
    W.put(o, "moe/outputs", "midsc", R.moe.midsc);
    W.put(o, "moe/outputs", "partial", R.moe.partial);
    W.put(o, "moe/outputs", "ar_out", R.ar_out);
  }
}

// Bytes of tensor data the file will hold (for the progress bar): an upper bound is enough.
uint64_t estimate_bytes(const LayerWeights& lw, const StepInputs& in, const StepResult& res) {
  const Config& c = lw.cfg;
  uint64_t t = 0;
  const uint64_t per_expert = uint64_t(2 * c.inter) * (c.hidden / 2 + c.hidden / 32) + uint64_t(c.hidden) * (c.inter / 2 + c.inter / 32);
  for (int r = 0; r < c.tp; ++r) {
    t += in.ranks[r].k_cache.size() * 2 + lw.ranks[r].w_o.size();
    t += used_experts(res.ranks[r].route, c).size() * per_expert;
  }
  return t;
}

}  // namespace

void write_golden(const std::string& path, const LayerWeights& lw, const StepInputs& in, const StepResult& res,
                  const GoldenMeta& meta, const WriteOptions& opt) {
  const Config& c = lw.cfg;
  if (int(res.ranks.size()) != c.tp || int(in.ranks.size()) != c.tp || int(lw.ranks.size()) != c.tp)
    throw std::invalid_argument("golden: results, inputs and weights must each hold tp = " + std::to_string(c.tp) + " ranks");
  AtomicOutput out(path, opt.overwrite);
  {
    Writer W;
    W.opt = &opt;
    W.file = h5::File(out.temp_path(), h5::File::Mode::CreateExclusive);
    W.dims.cfg = c;
    W.dims.tokens = in.shared.tokens;
    W.dims.bt_width = in.shared.bt_width;
    W.dims.score_width = in.shared.score_width;
    W.total = estimate_bytes(lw, in, res);
    h5::Group root = W.file.root();
    root.set_attr("magic", kMagic);
    root.set_attr("schema_version", int64_t(kSchemaVersion));
    root.set_attr("contract_version", kContractVersion);
    root.set_attr("tool_version", tool_version());
    root.set_attr("config", config_to_json(c));
    root.set_attr("scenario", meta.scenario_json);
    nlohmann::ordered_json seeds;
    seeds["weights"] = meta.weight_seed;
    seeds["inputs"] = meta.input_seed;
    root.set_attr("seeds", seeds.dump());
    root.set_attr("tp", int64_t(c.tp));
    root.set_attr("tokens", int64_t(in.shared.tokens));
    root.set_attr("weights", meta.weights);
    h5::Group ig = root.create_group("inputs");
    ig.set_attr("tokens", int64_t(in.shared.tokens));
    ig.set_attr("q_len", int64_t(in.shared.q_len));
    ig.set_attr("bt_width", int64_t(in.shared.bt_width));
    ig.set_attr("score_width", int64_t(in.shared.score_width));
    W.put(ig, "/inputs", "seq_lens", in.shared.seq_lens);
    W.put(ig, "/inputs", "block_table", in.shared.block_table);
    W.put(ig, "/inputs", "index_scores", in.shared.index_scores);
    W.put(ig, "/inputs", "h_in", in.shared.h_in);
    for (int r = 0; r < c.tp; ++r) write_rank(W, root, lw, in, res, meta, r);
    W.file.close();
  }
  out.commit();
}

}  // namespace k4::golden
