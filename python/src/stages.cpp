// stages.cpp -- k4.stage.<name>: one stage of the reference on given tensors (the schema's
// inputs of that stage by name), returning its outputs by name. The calls are the ones
// run_step makes (reference/model.cpp), in its order; the all-reduces take every rank's
// partial rows (this rank's from the stage, the others given).
#include <algorithm>
#include <cstring>

#include "golden/format/kv_pages.hpp"
#include "python/src/bind.hpp"
#include "reference/stacked_experts.hpp"

namespace k4::py {
namespace {

// A stage's named input tensors, checked against the schema as they are taken.
struct StageInputs {
  std::string stage;
  const pyb::dict& given;
  golden::DimSizes dims;

  pyb::array array(const std::string& name) const {
    if (!given.contains(name)) throw std::invalid_argument("k4.stage." + stage + ": input '" + name + "' is missing");
    return pyb::array::ensure(given[name.c_str()]);
  }
  bool has(const std::string& name) const { return given.contains(name) && !given[name.c_str()].is_none(); }

  template <class T>
  std::vector<T> take(const std::string& name, bool check_shape = true) const {
    const golden::TensorSpec& s = golden::find_spec(stage + "/inputs", name);
    const std::string what = "k4.stage." + stage + ": " + name;
    pyb::array a = array(name);
    const std::vector<uint8_t> b = bits_of(a, dims.dtype_of(s), what);  // the config's (E4M3 w13 / w2 under moe.experts = mxfp8)
    if (check_shape) {
      const std::vector<uint64_t> want = dims.shape(s.dims);
      std::vector<uint64_t> got;
      for (pyb::ssize_t i = 0; i < a.ndim(); ++i) got.push_back(uint64_t(a.shape(i)));
      if (got != want)
        throw std::invalid_argument(what + ": shape " + golden::shape_str(got) + ", expected " + golden::shape_str(want) + " [" +
                                    dims.dims_of(s.dims) + "]");
    }
    std::vector<T> v(b.size() / sizeof(T));
    if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
};

uint64_t dim(const pyb::array& a, int i, const std::string& what) {
  if (a.ndim() <= i) throw std::invalid_argument(what + ": has " + std::to_string(a.ndim()) + " dimensions, expected " + std::to_string(i + 1) + " or more");
  return uint64_t(a.shape(i));
}

template <class T>
void put(pyb::dict& out, const std::string& stage, const std::string& name, const golden::DimSizes& d, const std::vector<T>& v) {
  const golden::TensorSpec& s = golden::find_spec(stage + "/outputs", name);
  TensorData t;
  t.dtype = d.dtype_of(s);
  t.dims = d.dims_of(s.dims);
  t.shape = d.shape(s.dims);
  t.bytes.resize(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  uint64_t n = 1;
  for (uint64_t x : t.shape) n *= x;
  if (n * sizeof(T) != t.bytes.size()) throw std::logic_error("k4.stage." + stage + ": output " + name + " does not fill its shape");
  out[pyb::str(name)] = to_python(t);
}

golden::DimSizes sizes(const Config& cfg, int tokens) {
  cfg.validate();
  if (tokens < 1 || tokens > cfg.max_tokens)
    throw std::invalid_argument("tokens " + std::to_string(tokens) + " is outside 1.." + std::to_string(cfg.max_tokens));
  golden::DimSizes d;
  d.cfg = cfg;
  d.tokens = tokens;
  return d;
}

int tokens_of(const pyb::dict& t, const char* name, const std::string& stage) {
  if (!t.contains(name)) throw std::invalid_argument("k4.stage." + stage + ": input '" + name + "' is missing");
  return int(dim(pyb::array::ensure(t[name]), 0, "k4.stage." + stage + ": " + name));
}

// Every rank's partial rows, this rank's replaced by `own`, all-reduced in rank order.
std::vector<uint16_t> all_reduce(const Config& cfg, int rank, int tokens, const std::vector<uint16_t>& own,
                                 const pyb::list& partials, const std::string& stage, bool zero_start, int rows) {
  if (int(partials.size()) != cfg.tp)
    throw std::invalid_argument("k4.stage." + stage + ": rank_partials has " + std::to_string(partials.size()) + " entries, expected tp = " +
                                std::to_string(cfg.tp));
  std::vector<std::vector<uint16_t>> held(size_t(cfg.tp));
  std::vector<const std::vector<uint16_t>*> parts;
  for (int r = 0; r < cfg.tp; ++r) {
    if (r == rank || partials[size_t(r)].is_none()) {
      if (r != rank) throw std::invalid_argument("k4.stage." + stage + ": rank_partials[" + std::to_string(r) + "] is None");
      parts.push_back(&own);
      continue;
    }
    const std::vector<uint8_t> b = bits_of(pyb::array::ensure(partials[size_t(r)]), DType::BF16,
                                           "k4.stage." + stage + ": rank_partials[" + std::to_string(r) + "]");
    if (b.size() != own.size() * 2)
      throw std::invalid_argument("k4.stage." + stage + ": rank_partials[" + std::to_string(r) + "] has " + std::to_string(b.size() / 2) +
                                  " elements, expected " + std::to_string(own.size()) + " (token,hidden)");
    held[size_t(r)].resize(own.size());
    std::memcpy(held[size_t(r)].data(), b.data(), b.size());
    parts.push_back(&held[size_t(r)]);
  }
  std::vector<std::vector<uint16_t>> out;
  all_reduce_rows(out, parts, tokens, cfg.hidden, zero_start, cfg.ag_rs(tokens), rows);
  return out.at(size_t(rank));
}

pyb::dict index_stage(const Config& cfg, const pyb::dict& t, int q_len) {
  const int S = tokens_of(t, "seq_lens", "index");
  StageInputs in{"index", t, sizes(cfg, S)};
  StepShared sh;
  sh.tokens = S;
  sh.q_len = q_len;
  in.dims.bt_width = int(dim(in.array("block_table"), 1, "k4.stage.index: block_table"));
  in.dims.score_width = int(dim(in.array("index_scores"), 1, "k4.stage.index: index_scores"));
  sh.bt_width = in.dims.bt_width;
  sh.score_width = in.dims.score_width;
  sh.seq_lens = in.take<int32_t>("seq_lens");
  sh.block_table = in.take<int32_t>("block_table");
  const std::vector<float> scores = in.take<float>("index_scores");  // this rank's own
  sh.h_in.assign(size_t(S) * cfg.hidden, 0);  // not read by the index stage
  IndexOut out;
  {
    pyb::gil_scoped_release nogil;
    if (q_len < 1 || S % q_len != 0) throw std::invalid_argument("q_len " + std::to_string(q_len) + " must divide the token count " + std::to_string(S));
    select_blocks(out, sh, scores, cfg);
  }
  pyb::dict r;
  put(r, "index", "sparse_table", in.dims, out.sparse_table);
  put(r, "index", "blocks", in.dims, out.blocks);
  put(r, "index", "n_ctx", in.dims, out.n_ctx);
  put(r, "index", "long_row", in.dims, out.long_row);
  return r;
}

pyb::dict split_stage(const Config& cfg, const pyb::dict& t) {
  const int S = tokens_of(t, "q", "split");
  StageInputs in{"split", t, sizes(cfg, S)};
  StepShared sh;
  sh.tokens = S;
  sh.seq_lens = in.take<int32_t>("seq_lens");
  StepRank rk;
  rk.q = in.take<uint16_t>("q");
  const size_t page_bytes = size_t(cfg.page) * cfg.head_dim;
  std::vector<uint8_t> k = in.take<uint8_t>("k_cache", false), v = in.take<uint8_t>("v_cache", false);
  std::vector<float> ks = in.take<float>("k_scale", false), vs = in.take<float>("v_scale", false);
  if (k.size() % page_bytes || v.size() != k.size())
    throw std::invalid_argument("k4.stage.split: k_cache / v_cache hold " + std::to_string(k.size()) + " / " + std::to_string(v.size()) +
                                " bytes, expected the same whole number of " + std::to_string(page_bytes) + "-byte pages");
  const size_t stored = k.size() / page_bytes;
  const size_t scales = cfg.one_kv_scale() ? 1 : stored * size_t(cfg.page);
  if (ks.size() != scales || vs.size() != scales)
    throw std::invalid_argument("k4.stage.split: k_scale / v_scale hold " + std::to_string(ks.size()) + " / " + std::to_string(vs.size()) +
                                " values, expected " + std::to_string(scales));
  if (in.has("page_ids")) {  // the selected form: stored page i is cache page page_ids[i]
    in.dims.pages = int(stored);
    const std::vector<int32_t> ids = in.take<int32_t>("page_ids");
    int32_t top = -1;
    for (int32_t p : ids) {
      if (p < 0 || p >= golden::kMaxPages) throw std::invalid_argument("k4.stage.split: page_ids holds " + std::to_string(p));
      top = std::max(top, p);
    }
    golden::expand_selected_kv(rk, top + 1, ids, k, v, ks, vs, cfg);
  } else {
    rk.n_pages = int(stored);
    rk.k_cache = std::move(k), rk.v_cache = std::move(v), rk.k_scale = std::move(ks), rk.v_scale = std::move(vs);
  }
  IndexOut idx;
  idx.sparse_table = in.take<int32_t>("sparse_table");
  idx.blocks = in.take<int32_t>("blocks");
  idx.n_ctx = in.take<int32_t>("n_ctx");
  idx.long_row = in.take<uint8_t>("long_row");
  for (int k2 = 0; k2 < S; ++k2)
    for (int w = 0; w + 1 < cfg.sparse_table_words(); ++w) {
      const int32_t p = idx.sparse_table[size_t(k2) * cfg.sparse_table_words() + w];
      if (p < 0 || p >= rk.n_pages)
        throw std::invalid_argument("k4.stage.split: sparse_table[" + std::to_string(k2) + "][" + std::to_string(w) + "] = page " +
                                    std::to_string(p) + ", the cache has " + std::to_string(rk.n_pages) + " pages");
    }
  SplitOut out;
  {
    pyb::gil_scoped_release nogil;
    split_attention(out, sh, rk, idx, cfg);
  }
  pyb::dict r;
  put(r, "split", "q8", in.dims, out.q8);
  put(r, "split", "o", in.dims, out.o);
  put(r, "split", "m", in.dims, out.m);
  put(r, "split", "l", in.dims, out.l);
  return r;
}

pyb::dict merge_stage(const Config& cfg, const pyb::dict& t) {
  const int S = tokens_of(t, "o", "merge");
  StageInputs in{"merge", t, sizes(cfg, S)};
  SplitOut sp;
  if (in.has("q8")) sp.q8 = in.take<uint8_t>("q8");
  sp.o = in.take<uint16_t>("o");
  sp.m = in.take<float>("m");
  sp.l = in.take<float>("l");
  MergeOut out;
  {
    pyb::gil_scoped_release nogil;
    merge_partitions(out, sp, S, cfg);
  }
  pyb::dict r;
  put(r, "merge", "attn", in.dims, out.attn);
  put(r, "merge", "attn8", in.dims, out.attn8);
  put(r, "merge", "x_scale", in.dims, out.x_scale);
  return r;
}

pyb::dict oproj_stage(const Config& cfg, const pyb::dict& t, int rank, const pyb::object& rank_partials) {
  const int S = tokens_of(t, "attn8", "oproj");
  StageInputs in{"oproj", t, sizes(cfg, S)};
  MergeOut mg;
  if (in.has("attn")) mg.attn = in.take<uint16_t>("attn");
  mg.attn8 = in.take<uint8_t>("attn8");
  mg.x_scale = in.take<float>("x_scale");
  RankWeights w;
  w.w_o = in.take<uint8_t>("w_o");
  w.s_o = in.take<float>("s_o");
  OprojOut out;
  {
    pyb::gil_scoped_release nogil;
    o_proj_partials(out, mg, w, S, cfg);
  }
  pyb::dict r;
  put(r, "oproj", "partial", in.dims, out.partial);
  if (!rank_partials.is_none()) {
    const std::vector<uint16_t> a = all_reduce(cfg, rank, S, out.partial, rank_partials, "oproj", true, cfg.o_rows);
    std::vector<uint16_t> h_mid;
    residual_add(h_mid, a, in.take<uint16_t>("h_in"));
    put(r, "oproj", "a", in.dims, a);
    put(r, "oproj", "h_mid", in.dims, h_mid);
  }
  return r;
}

pyb::dict router_stage(const Config& cfg, const pyb::dict& t) {
  const int S = tokens_of(t, "a", "router");
  StageInputs in{"router", t, sizes(cfg, S)};
  RankWeights w;
  w.g_post = in.take<uint16_t>("g_post");
  w.w_gate = in.take<uint16_t>("w_gate");
  if (cfg.variant.router_gate == RouterGate::f32) w.w_gate_f32 = in.take<float>("w_gate_f32");  // V1a: the gate the logits read
  w.bias = in.take<float>("bias");
  const std::vector<uint16_t> a = in.take<uint16_t>("a"), h_in = in.take<uint16_t>("h_in");
  RouterOut out;
  {
    pyb::gil_scoped_release nogil;
    route_scores(out, a, h_in, w, S, cfg);
  }
  pyb::dict r;
  put(r, "router", "xn", in.dims, out.xn);
  put(r, "router", "xn8", in.dims, out.xn8);
  put(r, "router", "xsc", in.dims, out.xsc);
  put(r, "router", "rstd", in.dims, out.rstd);
  put(r, "router", "logit", in.dims, out.logit);
  put(r, "router", "sig", in.dims, out.sig);
  put(r, "router", "key", in.dims, out.key);
  return r;
}

pyb::dict moe_stage(const Config& cfg, const pyb::dict& t, int rank, const pyb::object& rank_partials) {
  const int S = tokens_of(t, "xn8", "moe");
  StageInputs in{"moe", t, sizes(cfg, S)};
  RouterOut ro;
  if (in.has("xn")) ro.xn = in.take<uint16_t>("xn");
  ro.xn8 = in.take<uint8_t>("xn8");
  ro.xsc = in.take<uint8_t>("xsc");
  if (in.has("rstd")) ro.rstd = in.take<float>("rstd");
  if (in.has("logit")) ro.logit = in.take<float>("logit");
  ro.sig = in.take<float>("sig");
  ro.key = in.take<int32_t>("key");
  in.dims.used_experts = int(dim(in.array("expert_ids"), 0, "k4.stage.moe: expert_ids"));
  const std::vector<int32_t> ids = in.take<int32_t>("expert_ids");
  const StackedExperts src(cfg, ids, [&](const char* name) { return in.take<uint8_t>(name); }, "k4.stage.moe");
  // V2: under moe.wide_live_rows = exclude_pad the live rows come from seq_lens (the raw seq_len > 0)
  const std::vector<int32_t> seq_lens = cfg.variant.wide_live_rows == WideRows::exclude_pad ? in.take<int32_t>("seq_lens") : std::vector<int32_t>{};
  RouteOut route;
  MoeOut out;
  {
    pyb::gil_scoped_release nogil;
    route_top4(route, ro, S, cfg);
    if (cfg.variant.wide_live_rows == WideRows::exclude_pad) route.live = live_rows(cfg, seq_lens);
    experts_up_gate(out, route, ro, src, rank, S, cfg);
    experts_down(out, route, src, rank, S, cfg);
  }
  pyb::dict r;
  put(r, "moe", "route_ids", in.dims, route.ids);
  put(r, "moe", "route_weights", in.dims, route.weights);
  put(r, "moe", "gate", in.dims, out.gate);
  put(r, "moe", "up", in.dims, out.up);
  put(r, "moe", "mid", in.dims, out.mid);
  put(r, "moe", "mid8", in.dims, out.mid8);
  put(r, "moe", "midsc", in.dims, out.midsc);
  put(r, "moe", "partial", in.dims, out.partial);
  if (!rank_partials.is_none())
    put(r, "moe", "ar_out", in.dims, all_reduce(cfg, rank, S, out.partial, rank_partials, "moe", cfg.tp > 1, cfg.dn_rows));
  return r;
}

}  // namespace

void bind_stages(pyb::module_& m) {
  pyb::module_ s = m.def_submodule("_stage", "one stage of the reference on given tensors (use k4.stage)");
  s.def("index", &index_stage, pyb::arg("config"), pyb::arg("tensors"), pyb::arg("q_len") = 1);
  s.def("split", &split_stage, pyb::arg("config"), pyb::arg("tensors"));
  s.def("merge", &merge_stage, pyb::arg("config"), pyb::arg("tensors"));
  s.def("oproj", &oproj_stage, pyb::arg("config"), pyb::arg("tensors"), pyb::arg("rank"), pyb::arg("rank_partials"));
  s.def("router", &router_stage, pyb::arg("config"), pyb::arg("tensors"));
  s.def("moe", &moe_stage, pyb::arg("config"), pyb::arg("tensors"), pyb::arg("rank"), pyb::arg("rank_partials"));
}

}  // namespace k4::py
