// named_stage.cpp -- the stage calls run_step makes (reference/model.cpp), on named tensors.
#include "device/kut/named_stage.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

#include "golden/format/kv_pages.hpp"
#include "reference/stacked_experts.hpp"

namespace k4::kut {
namespace {

template <class T>
std::vector<T> take(const NamedTensors& in, const std::string& stage, const std::string& name) {
  auto it = in.find(name);
  if (it == in.end()) throw std::invalid_argument(stage + ": input '" + name + "' is missing");
  if (golden::dtype_bytes(it->second.dtype) != sizeof(T) || it->second.bytes.size() % sizeof(T))
    throw std::invalid_argument(stage + ": input '" + name + "' is not " + std::to_string(sizeof(T)) + "-byte elements");
  std::vector<T> v(it->second.bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), it->second.bytes.data(), it->second.bytes.size());
  return v;
}

uint64_t dim0(const NamedTensors& in, const std::string& stage, const std::string& name, size_t i) {
  auto it = in.find(name);
  if (it == in.end()) throw std::invalid_argument(stage + ": input '" + name + "' is missing");
  if (it->second.shape.size() <= i) throw std::invalid_argument(stage + ": input '" + name + "' has too few dimensions");
  return it->second.shape[i];
}

template <class T>
void give(NamedTensors& out, const std::string& stage, const std::string& name, const golden::DimSizes& d, const std::vector<T>& v) {
  const golden::TensorSpec& s = golden::find_spec(stage + "/outputs", name);
  NamedTensor t;
  t.dtype = s.dtype;
  t.shape = d.shape(s.dims);
  t.bytes.resize(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  out[name] = std::move(t);
}

}  // namespace

StageFns reference_fns() {
  StageFns f;
  f.select_blocks = &k4::select_blocks;
  f.split_attention = &k4::split_attention;
  f.merge_partitions = &k4::merge_partitions;
  f.o_proj_partials = &k4::o_proj_partials;
  f.route_scores = &k4::route_scores;
  f.route_top4 = &k4::route_top4;
  f.experts_up_gate = &k4::experts_up_gate;
  f.experts_down = &k4::experts_down;
  return f;
}

bool rank_output(const std::string& stage, const std::string& name) {
  return !((stage == "oproj" && (name == "a" || name == "h_mid")) || (stage == "moe" && name == "ar_out"));
}

void run_named_stage(const StageFns& fns, const std::string& stage, const Config& cfg, int rank, int tokens, int q_len,
                     const NamedTensors& in, NamedTensors& out) {
  golden::DimSizes d;
  d.cfg = cfg;
  d.tokens = tokens;
  const int S = tokens;
  if (stage == "index") {
    StepShared sh;
    sh.tokens = S;
    sh.q_len = q_len;
    sh.bt_width = int(dim0(in, stage, "block_table", 1));
    sh.score_width = int(dim0(in, stage, "index_scores", 1));
    sh.seq_lens = take<int32_t>(in, stage, "seq_lens");
    sh.block_table = take<int32_t>(in, stage, "block_table");
    const std::vector<float> scores = take<float>(in, stage, "index_scores");  // this rank's own
    IndexOut o;
    fns.select_blocks(o, sh, scores, cfg);
    give(out, stage, "sparse_table", d, o.sparse_table);
    give(out, stage, "blocks", d, o.blocks);
    give(out, stage, "n_ctx", d, o.n_ctx);
    give(out, stage, "long_row", d, o.long_row);
  } else if (stage == "split") {
    StepShared sh;
    sh.tokens = S;
    sh.seq_lens = take<int32_t>(in, stage, "seq_lens");
    StepRank rk;
    rk.q = take<uint16_t>(in, stage, "q");
    const size_t page_bytes = size_t(cfg.page) * cfg.head_dim;
    std::vector<uint8_t> k = take<uint8_t>(in, stage, "k_cache"), v = take<uint8_t>(in, stage, "v_cache");
    std::vector<float> ks = take<float>(in, stage, "k_scale"), vs = take<float>(in, stage, "v_scale");
    const size_t stored = k.size() / page_bytes;
    if (in.count("page_ids")) {  // the selected form: stored page i is cache page page_ids[i]
      const std::vector<int32_t> ids = take<int32_t>(in, stage, "page_ids");
      int32_t top = -1;
      for (int32_t p : ids) top = std::max(top, p);
      if (ids.size() != stored || top >= golden::kMaxPages) throw std::invalid_argument("split: page_ids do not match the stored pages");
      for (int32_t p : ids)
        if (p < 0) throw std::invalid_argument("split: page_ids holds " + std::to_string(p));
      golden::expand_selected_kv(rk, top + 1, ids, k, v, ks, vs, cfg);
    } else {
      rk.n_pages = int(stored);
      rk.k_cache = std::move(k), rk.v_cache = std::move(v), rk.k_scale = std::move(ks), rk.v_scale = std::move(vs);
    }
    IndexOut idx;
    idx.sparse_table = take<int32_t>(in, stage, "sparse_table");
    idx.blocks = take<int32_t>(in, stage, "blocks");
    idx.n_ctx = take<int32_t>(in, stage, "n_ctx");
    idx.long_row = take<uint8_t>(in, stage, "long_row");
    SplitOut o;
    fns.split_attention(o, sh, rk, idx, cfg);
    give(out, stage, "q8", d, o.q8);
    give(out, stage, "o", d, o.o);
    give(out, stage, "m", d, o.m);
    give(out, stage, "l", d, o.l);
  } else if (stage == "merge") {
    SplitOut sp;
    if (in.count("q8")) sp.q8 = take<uint8_t>(in, stage, "q8");
    sp.o = take<uint16_t>(in, stage, "o");
    sp.m = take<float>(in, stage, "m");
    sp.l = take<float>(in, stage, "l");
    MergeOut o;
    fns.merge_partitions(o, sp, S, cfg);
    give(out, stage, "attn", d, o.attn);
    give(out, stage, "attn8", d, o.attn8);
    give(out, stage, "x_scale", d, o.x_scale);
  } else if (stage == "oproj") {
    MergeOut mg;
    if (in.count("attn")) mg.attn = take<uint16_t>(in, stage, "attn");
    mg.attn8 = take<uint8_t>(in, stage, "attn8");
    mg.x_scale = take<float>(in, stage, "x_scale");
    RankWeights w;
    w.w_o = take<uint8_t>(in, stage, "w_o");
    w.s_o = take<float>(in, stage, "s_o");
    OprojOut o;
    fns.o_proj_partials(o, mg, w, S, cfg);
    give(out, stage, "partial", d, o.partial);
  } else if (stage == "router") {
    RankWeights w;
    w.g_post = take<uint16_t>(in, stage, "g_post");
    w.w_gate = take<uint16_t>(in, stage, "w_gate");
    if (cfg.variant.router_gate == RouterGate::f32) w.w_gate_f32 = take<float>(in, stage, "w_gate_f32");  // V1a
    w.bias = take<float>(in, stage, "bias");
    RouterOut o;
    fns.route_scores(o, take<uint16_t>(in, stage, "a"), take<uint16_t>(in, stage, "h_in"), w, S, cfg);
    give(out, stage, "xn", d, o.xn);
    give(out, stage, "xn8", d, o.xn8);
    give(out, stage, "xsc", d, o.xsc);
    give(out, stage, "rstd", d, o.rstd);
    give(out, stage, "logit", d, o.logit);
    give(out, stage, "sig", d, o.sig);
    give(out, stage, "key", d, o.key);
  } else if (stage == "moe") {
    RouterOut ro;
    if (in.count("xn")) ro.xn = take<uint16_t>(in, stage, "xn");
    ro.xn8 = take<uint8_t>(in, stage, "xn8");
    ro.xsc = take<uint8_t>(in, stage, "xsc");
    if (in.count("rstd")) ro.rstd = take<float>(in, stage, "rstd");
    if (in.count("logit")) ro.logit = take<float>(in, stage, "logit");
    ro.sig = take<float>(in, stage, "sig");
    ro.key = take<int32_t>(in, stage, "key");
    const std::vector<int32_t> ids = take<int32_t>(in, stage, "expert_ids");
    d.used_experts = int(ids.size());
    const StackedExperts src(cfg, ids, [&](const char* name) { return take<uint8_t>(in, stage, name); }, "moe");
    RouteOut route;
    MoeOut o;
    fns.route_top4(route, ro, S, cfg);
    if (cfg.variant.wide_live_rows == WideRows::exclude_pad) {  // V2: pad rows join no wide expert
      const std::vector<int32_t> seq_lens = take<int32_t>(in, stage, "seq_lens");
      if (seq_lens.size() != size_t(S))
        throw std::invalid_argument("moe: input 'seq_lens' has " + std::to_string(seq_lens.size()) + " elements, expected tokens = " +
                                    std::to_string(S));
      route.live = live_rows(cfg, seq_lens);
    }
    fns.experts_up_gate(o, route, ro, src, rank, S, cfg);
    fns.experts_down(o, route, src, rank, S, cfg);
    give(out, stage, "route_ids", d, route.ids);
    give(out, stage, "route_weights", d, route.weights);
    give(out, stage, "gate", d, o.gate);
    give(out, stage, "up", d, o.up);
    give(out, stage, "mid", d, o.mid);
    give(out, stage, "mid8", d, o.mid8);
    give(out, stage, "midsc", d, o.midsc);
    give(out, stage, "partial", d, o.partial);
  } else {
    throw std::invalid_argument("'" + stage + "' is not a stage (index, split, merge, oproj, router, moe)");
  }
}

}  // namespace k4::kut
