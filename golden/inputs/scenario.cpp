// scenario.cpp -- see scenario.hpp.
#include "golden/inputs/scenario.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <memory>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

#include "golden/inputs/synth.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"

namespace k4 {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw std::invalid_argument(where + ": " + what);
}

// A seeded stream for one purpose: word c of key(seed, purpose).
struct Rng {
  uint64_t key;
  uint64_t c = 0;
  Rng(uint64_t seed, const std::string& purpose) : key(synth::tensor_key(seed, "scenario/" + purpose)) {}
  uint64_t next() { return synth::word(key, c++); }
  // Uniform in [lo, hi] (inclusive); the modulo bias is irrelevant here.
  int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
  double unit() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {
    const uint64_t w = next();
    double s = 0;
    for (int k = 0; k < 4; ++k) s += (double((w >> (16 * k)) & 0xFFFFu) + 0.5) * (1.0 / 65536.0);
    return (s - 2.0) * 1.7320508075688772;
  }
};

template <class T>
void get_opt(const json& j, const char* key, T& out, const std::string& where) {
  if (!j.contains(key)) return;
  try {
    j.at(key).get_to(out);
  } catch (const std::exception& e) {
    bad(where, std::string("key '") + key + "' has the wrong type (" + e.what() + ")");
  }
}

// An integer that fits an int: 2.5, 1e3, "3" and 2^40 are errors (nlohmann would truncate or
// wrap them).
int int_of(const json& v, const std::string& key, const std::string& where) {
  if (!v.is_number_integer()) bad(where, "key '" + key + "' is " + v.dump() + ", expected an integer");
  const bool neg = v.is_number_unsigned() ? false : v.get<int64_t>() < 0;
  if (neg ? v.get<int64_t>() < INT32_MIN : v.get<uint64_t>() > uint64_t(INT32_MAX))
    bad(where, "key '" + key + "' is " + v.dump() + ", outside the int range");
  return int(v.get<int64_t>());
}
void get_opt(const json& j, const char* key, int& out, const std::string& where) {
  if (j.contains(key)) out = int_of(j.at(key), key, where);
}
void get_opt(const json& j, const char* key, std::vector<int>& out, const std::string& where) {
  if (!j.contains(key)) return;
  const json& v = j.at(key);
  if (!v.is_array()) bad(where, std::string("key '") + key + "' is " + v.dump() + ", expected a list of integers");
  out.clear();
  for (size_t i = 0; i < v.size(); ++i) out.push_back(int_of(v[i], std::string(key) + "[" + std::to_string(i) + "]", where));
}

// KV codes: E4M3 (Saturate) of 48 * N(0, 1), N(0, 1) by the Irwin-Hall sum of four bytes,
// read from a table of the 1021 possible sums (two codes a 64-bit word: fast for big caches).
struct KvTable {
  uint8_t code[1021];
  KvTable() {
    for (int t = 0; t < 1021; ++t)
      code[t] = e4m3_bits(float(48.0 * ((double(t) + 2.0) / 256.0 - 2.0) * 1.7320508075688772), Fp8Overflow::Saturate);
  }
};
const KvTable kKv;

void kv_codes(Rng& rng, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; i += 2) {
    const uint64_t w = rng.next();
    const int a = int(w & 0xFF) + int((w >> 8) & 0xFF) + int((w >> 16) & 0xFF) + int((w >> 24) & 0xFF);
    const int b = int((w >> 32) & 0xFF) + int((w >> 40) & 0xFF) + int((w >> 48) & 0xFF) + int((w >> 56) & 0xFF);
    out[i] = kKv.code[a];
    if (i + 1 < n) out[i + 1] = kKv.code[b];
  }
}

int blocks_of(const Config& c, int64_t keys) {
  const int64_t ctx = std::max<int64_t>(keys, 1);
  return int((ctx + c.sparse_block - 1) / c.sparse_block);
}

int64_t draw_context(const Config& c, const std::string& spec, Rng& rng, const std::string& where) {
  const int64_t blk = c.sparse_block, short_max = int64_t(c.topk_blocks) * blk,
                medium_max = int64_t(c.long_from_blocks()) * blk, max = c.max_context;
  // A config's max_context may be below a helper's range (found by review with the scenario
  // fuzz target's configs: "long" with max_context 65536 divided by zero in Rng::range, and
  // "medium" drew contexts past max_context).
  auto helper = [&](int64_t lo, int64_t hi) {
    hi = std::min(hi, max);
    if (lo > hi)
      bad(where, "context '" + spec + "' needs more than " + std::to_string(lo - 1) + " keys, past the config's max_context " +
                     std::to_string(max));
    return rng.range(lo, hi);
  };
  if (spec == "short") return helper(1, short_max);
  if (spec == "medium") return helper(short_max + 1, medium_max);
  if (spec == "long") return helper(medium_max + 1, max);
  if (spec == "max") return max;
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(spec, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != spec.size() || v < 0 || v > max)
    bad(where, "context '" + spec + "' is neither a key count in 0.." + std::to_string(max) +
                   " nor one of short, medium, long, max");
  return v;
}

}  // namespace

// clang-format off
#define K(member) [](Scenario& s) -> ScenarioField { return &s.member; }
const std::vector<ScenarioKey>& scenario_keys() {
  using KK = KeyKind;
  static const std::vector<ScenarioKey> t = {
    {"tokens", false, "--tokens", KK::Int, true, "decode rows S (1..16)", K(tokens)},
    {"q_len", false, "--q-len", KK::Int, true, "rows a request (divides S)", K(q_len)},
    {"context", false, "--context", KK::Contexts, true,
     "contexts: one, one a request or one a row, comma-separated key counts or short / medium / long / max", K(context)},
    {"pad_rows", false, "--pad-rows", KK::Rows, true, "comma-separated rows with seq_len 0", K(pad_rows)},
    {"static_kv_scale", false, "--static-kv-scale", KK::ConfigFlag, false, "one k / v scale a cache", K(static_kv_scale)},
    {"kv_page_stride", false, "--kv-page-stride", KK::OptInt, false, "8 or 16", K(kv_page_stride)},
    {"cache_blocks", false, "--cache-blocks", KK::Int, true, "block allocations in the cache at most (default 256)", K(cache_blocks)},
    {"rank_scores", false, "--rank-scores", KK::Text, true,
     "index scores a rank: own (each rank's index head), shared (rank 0's everywhere), distinct (own, other blocks a rank)",
     K(rank_scores)},
    {"score_ties", true, "--ties", KK::Flag, true, "inject index-score ties", K(inject.score_ties)},
    {"nan_scores", true, "--nan-scores", KK::Int, true, "NaN index scores a row", K(inject.nan_scores)},
    {"neg_zero_scores", true, "--neg-zero-scores", KK::Int, true, "-0 (and +0) index scores a row", K(inject.neg_zero_scores)},
    {"inf_scores", true, "--inf-scores", KK::Int, true, "+-Inf index scores a row", K(inject.inf_scores)},
    {"repeated_expert", true, "--repeated-expert", KK::Expert, true,
     "expert id every token routes to, or 'any' (the same picks)", K(inject.repeated_expert)},
    {"extreme_q", true, "--extreme-q", KK::Flag, true, "q at and beyond the E4M3 range, Inf, NaN, -0", K(inject.extreme_q)},
    {"huge_residual", true, "--huge-residual", KK::Flag, true, "h_in rows scaled up to 1e37", K(inject.huge_residual)},
    {"extreme_kv", true, "--extreme-kv", KK::Flag, true, "K / V codes at +-448 and subnormals, scales 0 and 1e3", K(inject.extreme_kv)},
    {"zero_rows", true, "--zero-rows", KK::Rows, true, "comma-separated rows of all-zero q, h_in and scores", K(inject.zero_rows)},
    {"special_q", true, "--special-q", KK::Flag, false,
     "q: token 0 NaN / +Inf / 466, every token -0, +-448, 464, +-2^-10", K(inject.special_q)},
    {"special_h_in", true, "--special-h-in", KK::Flag, false,
     "h_in: a NaN, +Inf, -Inf element or 64 -0 a row (row % 4)", K(inject.special_h_in)},
    {"special_kv", true, "--special-kv", KK::Flag, false,
     "NaN K / V codes and NaN / Inf scales where no row reads, -0 where rows read", K(inject.special_kv)},
    {"special_weights", true, "--special-weights", KK::Flag, false,
     "-0, +-Inf and NaN in the weights where their effect is contained", K(inject.special_weights)},
    {"nan_weight", true, "--nan-weight", KK::Text, false, "one NaN in w_o, s_o, g_post or w_gate; s2: a NaN s2 scale in every routed expert (row 16e + 7)", K(inject.nan_weight)},
    {"zero_attn_rows", true, "--zero-attn-rows", KK::Rows, false,
     "comma-separated rows whose keys get v_scale 0 (attention 0)", K(inject.zero_attn_rows)},
    {"nan_kv_rows", true, "--nan-kv-rows", KK::Rows, false,
     "comma-separated rows with a NaN K and a NaN V code at keys they read", K(inject.nan_kv_rows)},
  };
  return t;
}
#undef K
// clang-format on

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int> int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  for (const std::string& t : split_list(s)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.size()) throw std::invalid_argument(std::string(what) + ": '" + t + "' is not an integer");
    out.push_back(v);
  }
  return out;
}

// The context list of the JSON form: one entry or a list, each a key count or a name.
void read_contexts(const json& c, std::vector<std::string>& out, const std::string& where) {
  out.clear();
  const json list = c.is_array() ? c : json::array({c});
  for (const json& e : list) {
    if (e.is_number_unsigned()) out.push_back(std::to_string(e.get<uint64_t>()));
    else if (e.is_number_integer()) out.push_back(std::to_string(e.get<int64_t>()));
    else if (e.is_string()) out.push_back(e.get<std::string>());
    else bad(where, "context entries are key counts or short / medium / long / max");
  }
}

nlohmann::ordered_json contexts_json(const std::vector<std::string>& context) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::array();
  for (const std::string& c : context) {
    // a key count as a number; digits past the int64 range stay a string (std::stoll would
    // throw std::out_of_range: found by fuzzing; validate_scenario refuses such a context)
    bool num = !c.empty() && c.size() <= 18 && std::all_of(c.begin(), c.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (num) ctx.push_back(std::stoll(c));
    else ctx.push_back(c);
  }
  return ctx;
}

// One key of the JSON form into s (present in j).
void read_key(const json& j, const ScenarioKey& k, Scenario& s, const std::string& where) {
  const ScenarioField f = k.field(s);
  switch (k.kind) {
    case KeyKind::Int:
    case KeyKind::OptInt: get_opt(j, k.key, *std::get<int*>(f), where); break;
    case KeyKind::Flag: get_opt(j, k.key, *std::get<bool*>(f), where); break;
    case KeyKind::ConfigFlag: {
      bool b = false;
      get_opt(j, k.key, b, where);
      *std::get<int*>(f) = b ? 1 : 0;
      break;
    }
    case KeyKind::Rows: get_opt(j, k.key, *std::get<std::vector<int>*>(f), where); break;
    case KeyKind::Contexts: read_contexts(j[k.key], *std::get<std::vector<std::string>*>(f), where); break;
    case KeyKind::Text: get_opt(j, k.key, *std::get<std::string*>(f), where); break;
    case KeyKind::Expert: {
      const json& r = j[k.key];
      int& x = *std::get<int*>(f);
      if (r.is_boolean()) x = r.get<bool>() ? -2 : -1;
      else if (r.is_number_integer()) x = int_of(r, k.key, where);
      else bad(where, std::string(k.key) + " is an expert id or true / false");
      break;
    }
  }
}

// One key of s into the JSON form, unless it is written only when set and is not.
void write_key(nlohmann::ordered_json& j, const ScenarioKey& k, Scenario& s) {
  const ScenarioField f = k.field(s);
  switch (k.kind) {
    case KeyKind::Int: j[k.key] = *std::get<int*>(f); break;
    case KeyKind::OptInt:
      if (k.always_written || *std::get<int*>(f) >= 0) j[k.key] = *std::get<int*>(f);
      break;
    case KeyKind::Flag:
      if (k.always_written || *std::get<bool*>(f)) j[k.key] = *std::get<bool*>(f);
      break;
    case KeyKind::ConfigFlag:
      if (k.always_written || *std::get<int*>(f) >= 0) j[k.key] = *std::get<int*>(f) == 1;
      break;
    case KeyKind::Rows:
      if (k.always_written || !std::get<std::vector<int>*>(f)->empty()) j[k.key] = *std::get<std::vector<int>*>(f);
      break;
    case KeyKind::Contexts: j[k.key] = contexts_json(*std::get<std::vector<std::string>*>(f)); break;
    case KeyKind::Text:
      if (k.always_written || !std::get<std::string*>(f)->empty()) j[k.key] = *std::get<std::string*>(f);
      break;
    case KeyKind::Expert: {
      const int x = *std::get<int*>(f);
      if (x == -2) j[k.key] = true;
      else if (x == -1) j[k.key] = false;
      else j[k.key] = x;
      break;
    }
  }
}

}  // namespace

void set_key_from_text(Scenario& s, const ScenarioKey& k, const std::string& text) {
  const ScenarioField f = k.field(s);
  switch (k.kind) {
    case KeyKind::Rows: *std::get<std::vector<int>*>(f) = int_list(text, k.flag); break;
    case KeyKind::Contexts: *std::get<std::vector<std::string>*>(f) = split_list(text); break;
    case KeyKind::Text: *std::get<std::string*>(f) = text; break;
    case KeyKind::Expert: {
      if (text == "any") {
        *std::get<int*>(f) = -2;
        break;
      }
      const std::vector<int> v = int_list(text, k.flag);
      if (v.size() != 1) throw std::invalid_argument(std::string(k.flag) + ": '" + text + "' is not one integer");
      *std::get<int*>(f) = v[0];
      break;
    }
    default: throw std::logic_error(std::string("scenario: ") + k.flag + " takes no text");
  }
}

Scenario scenario_from_json(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    bad(where, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) bad(where, "a scenario is a JSON object");
  std::set<std::string> keys = {"inject"}, ik;
  for (const ScenarioKey& k : scenario_keys()) (k.injection ? ik : keys).insert(k.key);
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!keys.count(it.key())) bad(where, "unknown key '" + it.key() + "'");
  Scenario s;
  for (const ScenarioKey& k : scenario_keys())
    if (!k.injection && j.contains(k.key)) read_key(j, k, s, where);
  if (j.contains("inject")) {
    const json& i = j["inject"];
    if (!i.is_object()) bad(where, "inject is a JSON object");
    for (auto it = i.begin(); it != i.end(); ++it)
      if (!ik.count(it.key())) bad(where, "unknown inject key '" + it.key() + "'");
    for (const ScenarioKey& k : scenario_keys())
      if (k.injection && i.contains(k.key)) read_key(i, k, s, where);
  }
  return s;
}

std::string scenario_to_json(const Scenario& s) {
  Scenario x = s;  // the table's fields are of a mutable Scenario
  nlohmann::ordered_json j, i;
  for (const ScenarioKey& k : scenario_keys()) write_key(k.injection ? i : j, k, x);
  j["inject"] = i;
  return j.dump();
}

void validate_scenario(const Scenario& s, const Config& cfg, const std::string& where) {
  const std::string& w = where;
  if (s.tokens < 1 || s.tokens > cfg.max_tokens)
    bad(w, "tokens " + std::to_string(s.tokens) + " is outside 1.." + std::to_string(cfg.max_tokens));
  if (s.q_len < 1 || s.tokens % s.q_len != 0)
    bad(w, "q_len " + std::to_string(s.q_len) + " must divide tokens " + std::to_string(s.tokens));
  const size_t req = size_t(s.tokens / s.q_len);
  if (s.context.empty() || (s.context.size() != 1 && s.context.size() != req && s.context.size() != size_t(s.tokens)))
    bad(w, "context has " + std::to_string(s.context.size()) + " entries; give 1, one a request (" +
               std::to_string(req) + ") or one a row (" + std::to_string(s.tokens) + ")");
  Rng probe(0, "probe");
  for (const std::string& c : s.context) draw_context(cfg, c, probe, w);
  for (int r : s.pad_rows)
    if (r < 0 || r >= s.tokens) bad(w, "pad row " + std::to_string(r) + " is outside 0.." + std::to_string(s.tokens - 1));
  // Every row of a request takes the path of its last row (plan_rows), and the long path
  // needs each of its rows long: in a request of q_len > 1 rows, the rows are all long or
  // none, and a pad row (one key) is not long. (Found by fuzzing: a pad row in a long request
  // gave inputs that validate_inputs refuses.)
  if (s.q_len > 1) {
    const int64_t medium_max = int64_t(cfg.long_from_blocks()) * cfg.sparse_block;
    const bool per_row = s.context.size() == size_t(s.tokens) && req != size_t(s.tokens);
    auto spec_of = [&](int k) -> const std::string& {
      return per_row ? s.context[size_t(k)] : s.context.size() == 1 ? s.context[0] : s.context[size_t(k / s.q_len)];
    };
    auto is_long = [&](int k) {
      if (std::find(s.pad_rows.begin(), s.pad_rows.end(), k) != s.pad_rows.end()) return false;
      const std::string& c = spec_of(k);
      if (c == "long") return true;
      if (c == "short" || c == "medium") return false;
      return (c == "max" ? int64_t(cfg.max_context) : int64_t(std::stoll(c))) > medium_max;
    };
    auto what = [&](int k) {
      const bool pad = std::find(s.pad_rows.begin(), s.pad_rows.end(), k) != s.pad_rows.end();
      return "row " + std::to_string(k) + (pad ? " (a pad row)" : " (context '" + spec_of(k) + "')");
    };
    for (int r0 = 0; r0 < s.tokens; r0 += s.q_len)
      for (int k = r0; k < r0 + s.q_len; ++k)
        if (is_long(k) != is_long(r0 + s.q_len - 1))
          bad(w, "request " + std::to_string(r0 / s.q_len) + " (rows " + std::to_string(r0) + ".." +
                     std::to_string(r0 + s.q_len - 1) + ") mixes long and not-long rows: " + what(k) + " is " +
                     (is_long(k) ? "" : "not ") + "long, its last " + what(r0 + s.q_len - 1) + " is " +
                     (is_long(k) ? "not " : "") + "long; a request's rows all take its last row's path, and the long "
                     "path (more than " + std::to_string(cfg.long_from_blocks()) + " blocks) needs every row long");
  }
  for (int r : s.inject.zero_rows)
    if (r < 0 || r >= s.tokens) bad(w, "zero row " + std::to_string(r) + " is outside 0.." + std::to_string(s.tokens - 1));
  if (s.kv_page_stride != -1 && s.kv_page_stride != 8 && s.kv_page_stride != 16)
    bad(w, "kv_page_stride " + std::to_string(s.kv_page_stride) + " is none of 8, 16");
  if (s.rank_scores != "own" && s.rank_scores != "shared" && s.rank_scores != "distinct")
    bad(w, "rank_scores '" + s.rank_scores + "' is none of own, shared, distinct");
  if (s.cache_blocks < 1 || s.cache_blocks > kMaxCacheBlocks)
    bad(w, "cache_blocks " + std::to_string(s.cache_blocks) + " is outside 1.." + std::to_string(kMaxCacheBlocks) +
               " (a rank's K + V caches at most 1 GiB)");
  const Injections& x = s.inject;
  for (const auto& [name, n] : {std::pair<const char*, int>{"nan_scores", x.nan_scores}, {"neg_zero_scores", x.neg_zero_scores},
                                {"inf_scores", x.inf_scores}})
    if (n < 0 || n > 1000000) bad(w, std::string("inject ") + name + " " + std::to_string(n) + " is outside 0..1000000");
  if (x.repeated_expert < -2 || x.repeated_expert >= cfg.n_routed)
    bad(w, "repeated_expert " + std::to_string(x.repeated_expert) + " is outside 0.." + std::to_string(cfg.n_routed - 1));
  if (!x.nan_weight.empty() && x.nan_weight != "w_o" && x.nan_weight != "s_o" && x.nan_weight != "g_post" &&
      x.nan_weight != "w_gate" && x.nan_weight != "s2")
    bad(w, "nan_weight '" + x.nan_weight + "' is none of w_o, s_o, g_post, w_gate, s2");
  for (int r : x.zero_attn_rows)
    if (r < 0 || r >= s.tokens) bad(w, "zero_attn_row " + std::to_string(r) + " is outside 0.." + std::to_string(s.tokens - 1));
  for (int r : x.nan_kv_rows)
    if (r < 0 || r >= s.tokens) bad(w, "nan_kv_row " + std::to_string(r) + " is outside 0.." + std::to_string(s.tokens - 1));
  const bool static_kv = s.static_kv_scale == 1 || (s.static_kv_scale == -1 && cfg.one_kv_scale());
  if (!x.zero_attn_rows.empty() && static_kv) bad(w, "zero_attn_rows needs per-key KV scales (not static_kv_scale)");
}

void apply_scenario(const Scenario& s, Config& cfg) {
  // static_kv_scale: one scale a cache (split.kv_scale = scalar, unless the variant already
  // has one scale a cache) or one a key (per_key)
  if (s.static_kv_scale == 0) cfg.variant.kv_scale = KvScale::per_key;
  if (s.static_kv_scale == 1 && !cfg.one_kv_scale()) cfg.variant.kv_scale = KvScale::scalar;
  if (s.kv_page_stride > 0) cfg.kv_page_stride = s.kv_page_stride;
  cfg.validate();
}

std::vector<int32_t> scenario_seq_lens(const Config& cfg, const Scenario& s, uint64_t seed) {
  validate_scenario(s, cfg);
  const int S = s.tokens, Q = s.q_len, R = S / Q;
  Rng rng(seed, "context");
  std::vector<int32_t> seq(static_cast<size_t>(S));
  if (s.context.size() == size_t(S) && !(S == R && s.context.size() == 1)) {
    for (int k = 0; k < S; ++k) seq[size_t(k)] = int32_t(draw_context(cfg, s.context[size_t(k)], rng, "scenario"));
  } else {
    for (int i = 0; i < R; ++i) {
      const std::string& spec = s.context.size() == 1 ? s.context[0] : s.context[size_t(i)];
      int64_t L = draw_context(cfg, spec, rng, "scenario");
      L = std::max<int64_t>(L, Q);
      for (int j = 0; j < Q; ++j) seq[size_t(i * Q + j)] = int32_t(L - (Q - 1 - j));
    }
  }
  for (int r : s.pad_rows) seq[size_t(r)] = 0;
  return seq;
}

namespace {

// Rank r's index scores (S, score_width): K1's scores from the rank's own index head, drawn
// independently a rank (rank 0 from the streams a one-head step used), then the score
// injections. rank_scores "distinct" adds 32 to the blocks b = r (mod tp) of every scored
// row (more than TOPK_BLOCKS blocks), so that each rank selects a different set.
std::vector<float> rank_index_scores(const Config& c, const Scenario& s, uint64_t seed, const StepShared& sh,
                                     const std::vector<int>& nblk, const std::vector<bool>& zero, int r) {
  const int S = sh.tokens;
  const std::string rk = r == 0 ? "" : "/rank" + std::to_string(r);
  std::vector<float> v(size_t(S) * sh.score_width);
  Rng rng(seed, "index_scores" + rk);
  for (float& f : v) f = float(4.0 * rng.normal());
  const Injections& x = s.inject;
  Rng pick(seed, "score_injections" + rk);
  for (int k = 0; k < S; ++k) {
    float* row = &v[size_t(k) * sh.score_width];
    const int n = nblk[size_t(k)];
    if (s.rank_scores == "distinct" && n > c.topk_blocks)
      for (int b = r; b < n; b += c.tp) row[b] += 32.0f;
    if (x.score_ties) {
      float best = -std::numeric_limits<float>::infinity();
      for (int b = 0; b < n; ++b) {
        row[b] = std::floor(row[b] * 2.0f) * 0.5f;
        best = std::max(best, row[b]);
      }
      for (int t = 0; t < std::min(n, 3); ++t) row[pick.range(0, n - 1)] = best;
    }
    for (int t = 0; t < x.nan_scores; ++t)
      row[pick.range(0, n - 1)] = f32_from_bits((t % 2) ? 0xFFC00000u : 0x7FC00000u);
    for (int t = 0; t < x.neg_zero_scores; ++t) {
      row[pick.range(0, n - 1)] = -0.0f;
      row[pick.range(0, n - 1)] = 0.0f;
    }
    for (int t = 0; t < x.inf_scores; ++t)
      row[pick.range(0, n - 1)] = (t % 2) ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
    if (zero[size_t(k)]) std::fill(row, row + sh.score_width, 0.0f);
  }
  return v;
}

}  // namespace

namespace {

// The rows a list names, as flags (pad_rows, zero_rows).
std::vector<bool> row_flags(const std::vector<int>& rows, int S) {
  std::vector<bool> f(size_t(S), false);
  for (int r : rows) f[size_t(r)] = true;
  return f;
}

// Block tables: a request's rows share its blocks, request i's block b is allocation
// perm[(offset_i + b) % n_alloc] of a seeded permutation. Returns each row's block count;
// n_alloc receives the allocations the cache holds.
std::vector<int> make_block_tables(StepShared& sh, const Config& c, const Scenario& s, uint64_t seed, int64_t& n_alloc) {
  const int S = s.tokens, Q = s.q_len, R = S / Q;
  const std::vector<bool> pad = row_flags(s.pad_rows, S);
  std::vector<int> nblk(static_cast<size_t>(S));
  for (int k = 0; k < S; ++k) nblk[size_t(k)] = blocks_of(c, sh.seq_lens[size_t(k)]);
  sh.bt_width = *std::max_element(nblk.begin(), nblk.end());
  sh.score_width = sh.bt_width;
  std::vector<int64_t> req_blocks(static_cast<size_t>(R)), offset(static_cast<size_t>(R));
  int64_t total = 0;
  for (int i = 0; i < R; ++i) {
    int64_t m = 0;
    for (int j = 0; j < Q; ++j) m = std::max<int64_t>(m, nblk[size_t(i * Q + j)]);
    req_blocks[size_t(i)] = m;
    offset[size_t(i)] = total;
    total += m;
  }
  n_alloc = std::max<int64_t>(1, std::min<int64_t>(total, s.cache_blocks));
  std::vector<int32_t> perm(static_cast<size_t>(n_alloc));
  for (int64_t a = 0; a < n_alloc; ++a) perm[size_t(a)] = int32_t(a);
  {
    Rng rng(seed, "block_table");
    for (int64_t a = n_alloc - 1; a > 0; --a) std::swap(perm[size_t(a)], perm[size_t(rng.range(0, a))]);
  }
  sh.block_table.assign(size_t(S) * sh.bt_width, 0);
  for (int k = 0; k < S; ++k) {
    if (pad[size_t(k)]) continue;
    const int i = k / Q;
    for (int b = 0; b < nblk[size_t(k)]; ++b)
      sh.block_table[size_t(k) * sh.bt_width + b] = perm[size_t((offset[size_t(i)] + b) % n_alloc)];
  }
  return nblk;
}

// The residual h_in: bf16 N(0, 1), then repeated_expert, huge_residual, special_h_in, zero_rows.
void make_residual(StepShared& sh, const Config& c, const Scenario& s, uint64_t seed, const LayerWeights* w) {
  const int S = s.tokens, H = c.hidden;
  const std::vector<bool> zero = row_flags(s.inject.zero_rows, S);
  sh.h_in.resize(size_t(S) * H);
  Rng rng(seed, "h_in");
  for (uint16_t& v : sh.h_in) v = bf16_bits_rne(float(rng.normal()));
  const Injections& x = s.inject;
  if (x.repeated_expert >= 0 && w && !w->ranks.empty()) {
    const uint16_t* g = &w->ranks[0].w_gate[size_t(x.repeated_expert) * H];
    for (int k = 0; k < S; ++k)
      for (int i = 0; i < H; ++i) sh.h_in[size_t(k) * H + i] = bf16_bits_rne((g[i] & 0x8000u) ? -32.0f : 32.0f);
  } else if (x.repeated_expert != -1) {  // the same row everywhere (no weights to aim with)
    for (int k = 1; k < S; ++k) std::copy_n(&sh.h_in[0], H, &sh.h_in[size_t(k) * H]);
    for (uint16_t& v : sh.h_in) v = bf16_bits_rne(bf16_to_f32(v) * 32.0f);
  }
  if (x.huge_residual) {
    const float scale[3] = {256.0f, 1e20f, 1e37f};
    for (int k = 0; k < S; ++k)
      for (int i = 0; i < H; ++i) {
        uint16_t& v = sh.h_in[size_t(k) * H + i];
        v = bf16_bits_rne(bf16_to_f32(v) * scale[k % 3]);
      }
  }
  if (x.special_h_in) {
    Rng sp(seed, "special_h_in");
    const uint16_t one[3] = {0x7FC0, 0x7F80, 0xFF80};  // NaN, +Inf, -Inf
    for (int k = 0; k < S; ++k) {
      uint16_t* row = &sh.h_in[size_t(k) * H];
      if (k % 4 < 3) row[sp.range(0, H - 1)] = one[k % 4];
      else
        for (int t = 0; t < 64; ++t) row[sp.range(0, H - 1)] = 0x8000;  // -0
    }
  }
  for (int k = 0; k < S; ++k)
    if (zero[size_t(k)]) std::fill_n(&sh.h_in[size_t(k) * H], H, uint16_t(0));
}

// Rank r's q heads: bf16 N(0, 1), then extreme_q, special_q, zero_rows.
void make_q(StepRank& R0, const Config& c, const Scenario& s, uint64_t seed, int r) {
  const int S = s.tokens, OK = c.o_k();
  const std::vector<bool> zero = row_flags(s.inject.zero_rows, S);
  const std::string rk = "/rank" + std::to_string(r);
  R0.q.resize(size_t(S) * OK);
  Rng rq(seed, "q" + rk);
  for (uint16_t& v : R0.q) v = bf16_bits_rne(float(rq.normal()));
  if (s.inject.extreme_q) {
    const float specials[] = {448.0f, -448.0f, 464.0f, 466.0f, -480.0f, 1e4f, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                              0x1p-10f, 0x1p-9f, -0.0f};
    for (int k = 0; k < S; ++k)
      for (int h = 0; h < c.heads; ++h)
        for (int t = 0; t < 12; ++t) {
          const int d = int(rq.range(0, c.head_dim - 1));
          R0.q[size_t(k) * OK + size_t(h) * c.head_dim + d] = bf16_bits_rne(specials[(t + k + h) % 12]);
        }
  }
  if (s.inject.special_q) {
    Rng sp(seed, "special_q" + rk);
    // contained: E4M3 NoSaturate keeps them finite (464 ties to 448, 2^-10 to 0)
    const uint16_t fine[7] = {0x8000, bf16_bits_rne(448.0f), bf16_bits_rne(-448.0f), bf16_bits_rne(464.0f),
                              bf16_bits_rne(0x1p-10f), bf16_bits_rne(-0x1p-10f), bf16_bits_rne(0x1p-9f)};
    for (int k = 0; k < S; ++k)
      for (int h = 3; h < c.heads; ++h)
        for (int t = 0; t < 7; ++t) R0.q[size_t(k) * OK + size_t(h) * c.head_dim + size_t(sp.range(0, c.head_dim - 1))] = fine[t];
    // token 0 poisoned: NaN, +Inf, 466 (E4M3 NoSaturate: NaN) in heads 0, 1, 2
    const uint16_t poison[3] = {0x7FC0, 0x7F80, bf16_bits_rne(466.0f)};
    for (int h = 0; h < 3; ++h) R0.q[size_t(h) * c.head_dim + size_t(sp.range(0, c.head_dim - 1))] = poison[h];
  }
  for (int k = 0; k < S; ++k)
    if (zero[size_t(k)]) std::fill_n(&R0.q[size_t(k) * OK], OK, uint16_t(0));
}

// Rank r's KV cache: the pages of n_alloc block allocations (codes and scales from one
// seeded stream, extreme_kv continuing it); pages no block uses stay zero.
void make_kv_cache(StepRank& R0, const Config& c, const Scenario& s, uint64_t seed, int r, int64_t n_alloc) {
  const int stride = c.kv_page_stride, ppb = c.pages_per_block(), pb = c.page * c.head_dim;
  const int n_pages = int((n_alloc - 1) * stride + ppb);
  R0.n_pages = n_pages;
  R0.k_cache.assign(size_t(n_pages) * pb, 0);
  R0.v_cache.assign(size_t(n_pages) * pb, 0);
  const size_t n_scales = c.one_kv_scale() ? 1 : size_t(n_pages) * c.page;
  R0.k_scale.assign(n_scales, 0.0f);
  R0.v_scale.assign(n_scales, 0.0f);
  Rng rkv(seed, "kv/rank" + std::to_string(r));
  for (int64_t a = 0; a < n_alloc; ++a)
    for (int j = 0; j < ppb; ++j) {
      const size_t p = size_t(a * stride + j);
      kv_codes(rkv, &R0.k_cache[p * pb], size_t(pb));
      kv_codes(rkv, &R0.v_cache[p * pb], size_t(pb));
      if (!c.one_kv_scale())
        for (int t = 0; t < c.page; ++t) {
          R0.k_scale[p * c.page + t] = float(0.002 + 0.018 * rkv.unit());
          R0.v_scale[p * c.page + t] = float(0.002 + 0.018 * rkv.unit());
        }
    }
  if (c.one_kv_scale()) {
    R0.k_scale[0] = float(0.002 + 0.018 * rkv.unit());
    R0.v_scale[0] = float(0.002 + 0.018 * rkv.unit());
  }
  if (s.inject.extreme_kv) {
    const uint8_t codes[] = {0x7E, 0xFE, 0x01, 0x81, 0x00, 0x80};
    for (int64_t a = 0; a < n_alloc; ++a)
      for (int j = 0; j < ppb; ++j) {
        const size_t p = size_t(a * stride + j);
        for (int t = 0; t < 16; ++t) {
          R0.k_cache[p * pb + size_t(rkv.range(0, pb - 1))] = codes[t % 6];
          R0.v_cache[p * pb + size_t(rkv.range(0, pb - 1))] = codes[(t + 3) % 6];
        }
        if (!c.one_kv_scale()) {
          R0.k_scale[p * c.page + size_t(rkv.range(0, c.page - 1))] = 0.0f;
          R0.v_scale[p * c.page + size_t(rkv.range(0, c.page - 1))] = 1e3f;
        }
      }
  }
}

// The injections placed by the keys rows read: special_kv, zero_attn_rows, nan_kv_rows.
void inject_read_keys(StepRank& R0, const Config& c, const StepShared& sh, const std::vector<int>& nblk, const Scenario& s) {
  const Injections& x = s.inject;
  if (!x.special_kv && x.zero_attn_rows.empty() && x.nan_kv_rows.empty()) return;
  const int stride = c.kv_page_stride, pb = c.page * c.head_dim;
  // The keys some row reads (key t of a row's block b: page entry * stride + t / 16 for
  // b * 128 + t < the row's context): a superset of what the split reads.
  std::vector<uint8_t> read(size_t(R0.n_pages) * c.page, 0);
  auto each_key = [&](int k, const std::function<void(size_t)>& fn) {
    const int64_t ctx = std::max<int32_t>(sh.seq_lens[size_t(k)], 1);
    for (int b = 0; b < nblk[size_t(k)]; ++b) {
      const int64_t entry = sh.block_table[size_t(k) * sh.bt_width + b];
      for (int64_t t = 0; t < c.sparse_block && b * int64_t(c.sparse_block) + t < ctx; ++t)
        fn(size_t((entry * stride + t / c.page) * c.page + t % c.page));
    }
  };
  for (int k = 0; k < s.tokens; ++k) each_key(k, [&](size_t key) { read[key] = 1; });
  if (x.special_kv) {
    for (size_t key = 0; key < read.size(); ++key) {
      const size_t p = key / size_t(c.page);
      const int t = int(key % size_t(c.page));
      if (!read[key]) {  // junk: never in an output
        for (int d = 0; d < c.head_dim; ++d) {
          R0.k_cache[p * pb + size_t(k_byte(t, d))] = (d % 2) ? 0xFF : 0x7F;
          R0.v_cache[p * pb + size_t(v_byte(t, d))] = (d % 2) ? 0x7F : 0xFF;
        }
        if (!c.one_kv_scale()) {
          R0.k_scale[key] = (t % 2) ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
          R0.v_scale[key] = (t % 2) ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
        }
      } else if (t < 2) {  // the first keys of a page that is read: -0 scales and codes
        if (!c.one_kv_scale()) (t == 0 ? R0.k_scale : R0.v_scale)[key] = -0.0f;
        R0.k_cache[p * pb + size_t(k_byte(t, 3))] = 0x80;
        R0.v_cache[p * pb + size_t(v_byte(t, 5))] = 0x80;
      }
    }
  }
  for (int k : x.zero_attn_rows) each_key(k, [&](size_t key) { R0.v_scale[key] = 0.0f; });
  // the key at position pos of row k: (page entry * stride + t / page) * page + t % page
  auto key_at = [&](int k, int64_t pos) {
    const int64_t entry = sh.block_table[size_t(k) * sh.bt_width + pos / c.sparse_block];
    const int64_t t = pos % c.sparse_block;
    return size_t((entry * stride + t / c.page) * c.page + t % c.page);
  };
  for (int k : x.nan_kv_rows) {
    const int64_t ctx = sh.seq_lens[size_t(k)];
    if (ctx < 2) throw std::invalid_argument("nan_kv_row " + std::to_string(k) + " reads " + std::to_string(ctx) +
                                             " keys; it needs 2 (a NaN K and a NaN V key)");
    const size_t kk = key_at(k, ctx - 1), kv = key_at(k, ctx - 2);
    R0.k_cache[kk / size_t(c.page) * pb + size_t(k_byte(int(kk % size_t(c.page)), 0))] = 0x7F;
    R0.v_cache[kv / size_t(c.page) * pb + size_t(v_byte(int(kv % size_t(c.page)), 1))] = 0xFF;
  }
}

}  // namespace

StepInputs make_inputs(const Config& cfg, const Scenario& s, uint64_t seed, const LayerWeights* w) {
  validate_scenario(s, cfg);
  StepInputs in;
  StepShared& sh = in.shared;
  sh.tokens = s.tokens;
  sh.q_len = s.q_len;
  sh.seq_lens = scenario_seq_lens(cfg, s, seed);
  int64_t n_alloc = 0;
  const std::vector<int> nblk = make_block_tables(sh, cfg, s, seed, n_alloc);
  // Index scores: each rank's own index head (rank_scores), or rank 0's everywhere.
  const std::vector<bool> zero = row_flags(s.inject.zero_rows, s.tokens);
  std::vector<std::vector<float>> scores(size_t(cfg.tp));
  for (int r = 0; r < cfg.tp; ++r)
    scores[size_t(r)] = s.rank_scores == "shared" && r > 0 ? scores[0] : rank_index_scores(cfg, s, seed, sh, nblk, zero, r);
  make_residual(sh, cfg, s, seed, w);
  for (int r = 0; r < cfg.tp; ++r) {
    StepRank R0;
    R0.index_scores = std::move(scores[size_t(r)]);
    make_q(R0, cfg, s, seed, r);
    make_kv_cache(R0, cfg, s, seed, r, n_alloc);
    inject_read_keys(R0, cfg, sh, nblk, s);
    in.ranks.push_back(std::move(R0));
  }
  return in;
}

namespace {

// Expert 3 of special_weights: an s2 NaN scale, an s13 zero byte, -0 nibbles.
class InjectedExperts : public ExpertSource {
 public:
  InjectedExperts(std::shared_ptr<const ExpertSource> base, const Config& cfg) : base_(std::move(base)), cfg_(cfg) {}
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    std::shared_ptr<const ExpertWeights> w = base_->expert(rank, e);
    if (e != kExpert) return w;
    auto x = std::make_shared<ExpertWeights>(*w);
    x->s2[size_t(kRow) * size_t(cfg_.inter / 32)] = 0xFF;  // s2[row 7][block 0]: NaN
    x->s13[1] = 0x00;                                        // s13[row 0][block 1]: 2^-127
    x->w13[0] = 0x88;                                        // two -0 (E2M1 0x8)
    x->w2[5] = 0x08;
    return x;
  }
  static constexpr int kExpert = 3, kRow = 7;

 private:
  std::shared_ptr<const ExpertSource> base_;
  Config cfg_;
};

// nan_weight "s2": every routed expert e a NaN s2 scale at hidden row nan_s2_row(e), block 0.
class NanS2Experts : public ExpertSource {
 public:
  NanS2Experts(std::shared_ptr<const ExpertSource> base, const Config& cfg) : base_(std::move(base)), cfg_(cfg) {}
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    std::shared_ptr<const ExpertWeights> w = base_->expert(rank, e);
    if (e >= cfg_.n_routed) return w;  // the shared expert stays finite
    auto x = std::make_shared<ExpertWeights>(*w);
    x->s2[size_t(nan_s2_row(cfg_, e)) * size_t(cfg_.inter / 32)] = 0xFF;
    return x;
  }

 private:
  std::shared_ptr<const ExpertSource> base_;
  Config cfg_;
};

}  // namespace

int nan_s2_row(const Config& cfg, int e) { return (16 * e + 7) % cfg.hidden; }

void apply_weight_injections(LayerWeights& w, const Scenario& s) {
  const Injections& x = s.inject;
  if (!x.special_weights && x.nan_weight.empty()) return;
  const Config& c = w.cfg;
  const int H = c.hidden, OK = c.o_k();
  if (x.special_weights) {
    Rng rng(0, "special_weights");
    std::vector<size_t> wo, gp, wg;
    for (int t = 0; t < 64; ++t) wo.push_back(size_t(rng.range(0, int64_t(H) * OK - 1)));
    for (int t = 0; t < 16; ++t) gp.push_back(size_t(rng.range(0, H - 1)));
    for (int t = 0; t < 16; ++t) wg.push_back(size_t(rng.range(0, int64_t(c.n_routed) * H - 1)));
    const size_t inf_at = size_t(1) * H + size_t(rng.range(0, H - 1)), ninf_at = size_t(2) * H + size_t(rng.range(0, H - 1));
    for (RankWeights& r : w.ranks) {
      for (size_t i : wo) r.w_o[i] = 0x80;  // -0
      r.s_o[3] = -0.0f;
      for (size_t i : gp) r.g_post[i] = 0x8000;
      for (size_t i : wg) r.w_gate[i] = 0x8000;
      r.w_gate[inf_at] = 0x7F80;   // +Inf in expert 1's gate row
      r.w_gate[ninf_at] = 0xFF80;  // -Inf in expert 2's
      if (!r.w_gate_f32.empty()) {  // the F32 gate alike (router.gate = f32)
        for (size_t i : wg) r.w_gate_f32[i] = -0.0f;
        r.w_gate_f32[inf_at] = std::numeric_limits<float>::infinity();
        r.w_gate_f32[ninf_at] = -std::numeric_limits<float>::infinity();
      }
      r.bias[3] = std::numeric_limits<float>::quiet_NaN();
      r.bias[4] = -std::numeric_limits<float>::infinity();
      r.bias[5] = std::numeric_limits<float>::infinity();
      r.bias[6] = -0.0f;
    }
    w.experts = std::make_shared<InjectedExperts>(w.experts, c);
  }
  if (x.nan_weight == "w_o") w.ranks[0].w_o[size_t(5) * OK + 9] = 0x7F;
  if (x.nan_weight == "s2") w.experts = std::make_shared<NanS2Experts>(w.experts, c);
  for (RankWeights& r : w.ranks) {
    if (x.nan_weight == "s_o") r.s_o[5] = std::numeric_limits<float>::quiet_NaN();
    if (x.nan_weight == "g_post") r.g_post[9] = 0x7FC0;
    if (x.nan_weight == "w_gate") {
      r.w_gate[size_t(2) * H + 9] = 0x7FC0;
      if (!r.w_gate_f32.empty()) r.w_gate_f32[size_t(2) * H + 9] = std::numeric_limits<float>::quiet_NaN();
    }
  }
}

}  // namespace k4
