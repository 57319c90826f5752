// replay.cpp -- replay: each stage's reference function run on the dump's own
// upstream tensors, compared with the dump's outputs of that stage (compare.hpp).
//
// An input of a step is taken from, in order: the dump's copy at the stage's inputs, the
// dump's tensor that the schema links it to (another stage's output or a shared input),
// else the golden's. Weights and KV pages always come from the golden. Steps:
//   index   select_blocks      seq_lens, block_table, index_scores -> index outputs
//   split   split_attention    q, the index outputs (+ golden KV)  -> q8, o, m, l
//   merge   merge_partitions   o, m, l                             -> attn, attn8, x_scale
//   oproj   partial rows       attn8, x_scale (+ golden w_o, s_o)  -> partial
//           all-reduce         every rank's partial                -> a
//           residual           a, h_in                             -> h_mid
//   router  route_scores       a, h_in (+ golden g, gate, bias)    -> xn .. key
//   moe     routing            key, sig                            -> route_ids, route_weights
//           up/gate            route, xn8, xsc (+ golden experts)  -> gate, up, mid, mid8, midsc
//           down               route, mid8, midsc                  -> partial
//           all-reduce         every rank's partial                -> ar_out
#include <algorithm>
#include <functional>
#include <map>

#include "golden/diff/compare.hpp"
#include "reference/model.hpp"

namespace k4::golden {
namespace {

const TensorSpec& spec_of(const std::string& group, const std::string& name) {
  for (const TensorSpec& s : tensor_specs())
    if (group == s.group && name == s.name) return s;
  throw std::logic_error("replay: no tensor " + group + "/" + name);
}

std::string rank_path(int r) { return "/rank" + std::to_string(r); }

// One input of a step, resolved.
struct Input {
  RawTensor t;
  std::string from;     // "split/outputs/o (dump)"
  bool differs = false; // its bits differ from the golden's
};

struct Ctx {
  const DumpReader& g;
  const DumpReader& d;
  const GoldenReader& gr;
  const LayerWeights& lw;
  Config cfg;
  int S = 0, tp = 0;

  RawTensor golden(const std::string& path, DType dt) const {
    RawTensor t;
    std::string why;
    if (g.read(path, dt, {}, t, why) != TensorDiff::Status::Match)
      throw FormatError("golden " + g.path() + ": " + path + ": " + why);
    return t;
  }

  // Candidates in the dump, the first that holds the tensor at the golden's shape wins.
  Input resolve(const std::string& golden_path, const std::vector<std::pair<std::string, std::string>>& candidates,
                DType dt, const std::string& golden_label) const {
    Input in;
    const RawTensor gold = golden(golden_path, dt);
    for (const auto& [path, label] : candidates) {
      RawTensor t;
      std::string why;
      if (!d.has_dataset(path) || d.read(path, dt, gold.shape, t, why) != TensorDiff::Status::Match) continue;
      t.dims = gold.dims;
      in.differs = t.bits != gold.bits;
      in.t = std::move(t);
      in.from = label + " (dump)";
      return in;
    }
    in.t = gold;
    in.from = golden_label + " (golden: not in the dump)";
    return in;
  }

  // An input of `stage` as the schema names it ("merge", "o" -> split/outputs/o).
  Input input(int r, const std::string& stage, const std::string& name) const {
    const TensorSpec& s = spec_of(stage + "/inputs", name);
    const std::string here = rank_path(r) + "/" + stage + "/inputs/" + name;
    std::vector<std::pair<std::string, std::string>> cand = {{here, stage + "/inputs/" + name}};
    std::string label = stage + "/inputs/" + name;
    if (s.link[0] == '/') {
      cand.push_back({s.link, std::string(s.link).substr(1)});
      label = std::string(s.link).substr(1);
    } else if (s.link[0] == '@') {
      cand.push_back({rank_path(r) + "/" + (s.link + 1), s.link + 1});
      label = s.link + 1;
    }
    return resolve(here, cand, s.dtype, label);
  }

  // An output of another step (of this or another rank), as the dump holds it.
  Input output(int r, const std::string& group, const std::string& name) const {
    const TensorSpec& s = spec_of(group, name);
    const std::string p = rank_path(r) + "/" + group + "/" + name;
    const std::string label = "rank " + std::to_string(r) + " " + group + "/" + name;
    return resolve(p, {{p, label}}, s.dtype, label);
  }
};

using Inputs = std::map<std::string, Input>;
using Compute = std::function<std::map<std::string, RawTensor>(const Inputs&)>;

template <class T>
std::vector<T> in_vec(const Inputs& in, const std::string& name) {
  return typed<T>(in.at(name).t);
}

// Runs one step: recompute (or take the golden's when no input differs), then compare with
// the dump's outputs.
ReplayStep replay_step(const Ctx& c, int r, const std::string& name, const std::string& out_group,
                       const std::vector<std::string>& outs, const Inputs& inputs, const Compute& compute, size_t max_list) {
  ReplayStep st;
  st.name = name;
  for (const auto& [n, in] : inputs) {
    st.inputs.push_back(in.from);
    if (in.differs) st.differing.push_back(in.from);
  }
  bool any = false;
  for (const std::string& o : outs) any = any || c.d.has_dataset(rank_path(r) + "/" + out_group + "/" + o);
  if (!any) {
    st.not_replayed = "the dump holds none of its outputs";
    return st;
  }
  std::map<std::string, RawTensor> res;
  if (!st.differing.empty()) {
    try {
      res = compute(inputs);
      st.recomputed = true;
    } catch (const std::exception& e) {
      st.not_replayed = e.what();
      return st;
    }
  }
  for (const std::string& o : outs) {
    const TensorSpec& s = spec_of(out_group, o);
    const std::string p = rank_path(r) + "/" + out_group + "/" + o;
    RawTensor gold = c.golden(p, s.dtype);
    RawTensor ref = st.recomputed ? res.at(o) : gold;
    ref.dtype = s.dtype;
    ref.dims = gold.dims;
    ref.shape = gold.shape;
    if (ref.bits.size() != gold.bits.size())
      throw std::logic_error("replay: " + p + " has " + std::to_string(ref.bits.size()) + " elements, expected " +
                             std::to_string(gold.bits.size()));
    TensorDiff td;
    td.name = o;
    td.group = out_group;
    td.path = p;
    RawTensor got;
    td.status = c.d.read(p, s.dtype, gold.shape, got, td.why);
    td.dtype = s.dtype;
    td.dims = gold.dims;
    td.shape = gold.shape;
    td.elements = gold.bits.size();
    if (td.status == TensorDiff::Status::Match) diff_tensor(td, ref, got, max_list);
    st.outputs.push_back(std::move(td));
  }
  return st;
}

template <class T>
RawTensor out_tensor(DType d, const std::vector<T>& v) {
  return raw_tensor(d, {}, {uint64_t(v.size())}, v);
}

// ---- the stages ------------------------------------------------------------------------

std::vector<ReplayStep> replay_index(const Ctx& c, int r, size_t ml) {
  Inputs in;
  for (const char* n : {"seq_lens", "block_table", "index_scores"}) in[n] = c.input(r, "index", n);
  return {replay_step(c, r, "select_blocks", "index/outputs", {"sparse_table", "blocks", "n_ctx", "long_row"}, in,
                      [&](const Inputs& x) {
                        IndexStage st = c.gr.index(r);
                        st.in.seq_lens = in_vec<int32_t>(x, "seq_lens");
                        st.in.block_table = in_vec<int32_t>(x, "block_table");
                        st.index_scores = in_vec<float>(x, "index_scores");  // this rank's
                        // select_blocks reads by these values: they must be inputs the model serves
                        // (seq_lens in range, block-table entries inside every rank's cache), as
                        // run_step checks (found by fuzzing: a seq_len of 2^28 read index_scores out
                        // of bounds, a block-table entry of 1886226432 overflowed page * stride)
                        StepInputs si = c.gr.inputs();
                        si.shared = st.in;
                        si.ranks[size_t(r)].index_scores = st.index_scores;
                        validate_inputs(si, c.cfg);
                        IndexOut o;
                        select_blocks(o, st.in, st.index_scores, c.cfg);
                        return std::map<std::string, RawTensor>{{"sparse_table", out_tensor(DType::I32, o.sparse_table)},
                                                                {"blocks", out_tensor(DType::I32, o.blocks)},
                                                                {"n_ctx", out_tensor(DType::I32, o.n_ctx)},
                                                                {"long_row", out_tensor(DType::U8, o.long_row)}};
                      },
                      ml)};
}

std::vector<ReplayStep> replay_split(const Ctx& c, int r, size_t ml) {
  Inputs in;
  for (const char* n : {"q", "sparse_table", "blocks", "n_ctx", "long_row"}) in[n] = c.input(r, "split", n);
  return {replay_step(c, r, "split_attention", "split/outputs", {"q8", "o", "m", "l"}, in,
                      [&](const Inputs& x) {
                        SplitStage st = c.gr.split(r);
                        st.rank.q = in_vec<uint16_t>(x, "q");
                        st.index.sparse_table = in_vec<int32_t>(x, "sparse_table");
                        st.index.blocks = in_vec<int32_t>(x, "blocks");
                        st.index.n_ctx = in_vec<int32_t>(x, "n_ctx");
                        st.index.long_row = in_vec<uint8_t>(x, "long_row");
                        // the sparse table names pages: check them before the reference reads them, and
                        // (selected KV form) that the golden stores the ones holding keys below n_ctx
                        const int TW = c.cfg.sparse_table_words();
                        std::vector<int32_t> stored;
                        const std::string ids = rank_path(r) + "/split/inputs/page_ids";
                        if (c.g.has_dataset(ids)) {
                          stored = typed<int32_t>(c.golden(ids, DType::I32));
                          std::sort(stored.begin(), stored.end());
                        }
                        for (size_t i = 0; i < st.index.sparse_table.size(); ++i) {
                          const size_t k = i / TW, w = i % TW;
                          const int32_t pg = st.index.sparse_table[i];
                          if (w == size_t(TW - 1)) continue;
                          if (pg < 0 || pg >= st.rank.n_pages)
                            throw std::invalid_argument("the dump's sparse_table word " + std::to_string(i) + " = " +
                                                        std::to_string(pg) + " is not a page of the cache");
                          const bool used = int64_t(w) * c.cfg.page < st.index.n_ctx[k];
                          if (used && c.g.has_dataset(ids) && !std::binary_search(stored.begin(), stored.end(), pg))
                            throw std::invalid_argument("the dump's sparse table reads page " + std::to_string(pg) +
                                                        ", which the golden (selected KV form) does not store");
                        }
                        SplitOut o;
                        split_attention(o, st.shared, st.rank, st.index, c.cfg);
                        return std::map<std::string, RawTensor>{{"q8", out_tensor(DType::E4M3, o.q8)},
                                                                {"o", out_tensor(DType::BF16, o.o)},
                                                                {"m", out_tensor(DType::F32, o.m)},
                                                                {"l", out_tensor(DType::F32, o.l)}};
                      },
                      ml)};
}

std::vector<ReplayStep> replay_merge(const Ctx& c, int r, size_t ml) {
  Inputs in;
  for (const char* n : {"o", "m", "l"}) in[n] = c.input(r, "merge", n);
  return {replay_step(c, r, "merge_partitions", "merge/outputs", {"attn", "attn8", "x_scale"}, in,
                      [&](const Inputs& x) {
                        SplitOut sp;
                        sp.o = in_vec<uint16_t>(x, "o");
                        sp.m = in_vec<float>(x, "m");
                        sp.l = in_vec<float>(x, "l");
                        MergeOut o;
                        merge_partitions(o, sp, c.S, c.cfg);
                        return std::map<std::string, RawTensor>{{"attn", out_tensor(DType::BF16, o.attn)},
                                                                {"attn8", out_tensor(DType::E4M3, o.attn8)},
                                                                {"x_scale", out_tensor(DType::F32, o.x_scale)}};
                      },
                      ml)};
}

// The rank-ordered all-reduce of every rank's `group/partial` -> this rank's `out`.
ReplayStep replay_all_reduce(const Ctx& c, int r, const std::string& group, const std::string& out, bool zero_start,
                             int rows_per_task, size_t ml) {
  Inputs in;
  for (int j = 0; j < c.tp; ++j) in["partial" + std::to_string(j)] = c.output(j, group, "partial");
  return replay_step(c, r, "all-reduce", group, {out}, in,
                     [&, zero_start, rows_per_task](const Inputs& x) {
                       std::vector<std::vector<uint16_t>> parts;
                       for (int j = 0; j < c.tp; ++j) parts.push_back(in_vec<uint16_t>(x, "partial" + std::to_string(j)));
                       std::vector<const std::vector<uint16_t>*> ptr;
                       for (const auto& p : parts) ptr.push_back(&p);
                       std::vector<std::vector<uint16_t>> sum;
                       all_reduce_rows(sum, ptr, c.S, c.cfg.hidden, zero_start, c.cfg.ag_rs(c.S), rows_per_task);
                       return std::map<std::string, RawTensor>{{out, out_tensor(DType::BF16, sum[size_t(r)])}};
                     },
                     ml);
}

std::vector<ReplayStep> replay_oproj(const Ctx& c, int r, size_t ml) {
  std::vector<ReplayStep> steps;
  Inputs in;
  for (const char* n : {"attn8", "x_scale"}) in[n] = c.input(r, "oproj", n);
  steps.push_back(replay_step(c, r, "partial rows", "oproj/outputs", {"partial"}, in,
                              [&](const Inputs& x) {
                                MergeOut mg;
                                mg.attn8 = in_vec<uint8_t>(x, "attn8");
                                mg.x_scale = in_vec<float>(x, "x_scale");
                                OprojOut o;
                                o_proj_partials(o, mg, c.lw.ranks[size_t(r)], c.S, c.cfg);
                                return std::map<std::string, RawTensor>{{"partial", out_tensor(DType::BF16, o.partial)}};
                              },
                              ml));
  steps.push_back(replay_all_reduce(c, r, "oproj/outputs", "a", true, c.cfg.o_rows, ml));
  Inputs res;
  res["a"] = c.output(r, "oproj/outputs", "a");
  res["h_in"] = c.input(r, "oproj", "h_in");
  steps.push_back(replay_step(c, r, "residual", "oproj/outputs", {"h_mid"}, res,
                              [&](const Inputs& x) {
                                std::vector<uint16_t> h;
                                residual_add(h, in_vec<uint16_t>(x, "a"), in_vec<uint16_t>(x, "h_in"));
                                return std::map<std::string, RawTensor>{{"h_mid", out_tensor(DType::BF16, h)}};
                              },
                              ml));
  return steps;
}

std::vector<ReplayStep> replay_router(const Ctx& c, int r, size_t ml) {
  Inputs in;
  for (const char* n : {"a", "h_in"}) in[n] = c.input(r, "router", n);
  return {replay_step(c, r, "route_scores", "router/outputs", {"xn", "xn8", "xsc", "rstd", "logit", "sig", "key"}, in,
                      [&](const Inputs& x) {
                        RouterOut o;
                        route_scores(o, in_vec<uint16_t>(x, "a"), in_vec<uint16_t>(x, "h_in"), c.lw.ranks[size_t(r)], c.S, c.cfg);
                        return std::map<std::string, RawTensor>{
                            {"xn", out_tensor(DType::BF16, o.xn)},     {"xn8", out_tensor(DType::E4M3, o.xn8)},
                            {"xsc", out_tensor(DType::E8M0, o.xsc)},   {"rstd", out_tensor(DType::F32, o.rstd)},
                            {"logit", out_tensor(DType::F32, o.logit)}, {"sig", out_tensor(DType::F32, o.sig)},
                            {"key", out_tensor(DType::I32, o.key)}};
                      },
                      ml)};
}

RouteOut route_of(const Ctx& c, const Inputs& x) {
  RouteOut rt;
  rt.ids = in_vec<int32_t>(x, "route_ids");
  rt.weights = in_vec<float>(x, "route_weights");
  rt.live = c.gr.moe_live();  // V2: the golden's rows that join the wide experts
  return rt;
}

std::vector<ReplayStep> replay_moe(const Ctx& c, int r, size_t ml) {
  std::vector<ReplayStep> steps;
  Inputs rin;
  for (const char* n : {"key", "sig"}) rin[n] = c.input(r, "moe", n);
  steps.push_back(replay_step(c, r, "routing", "moe/outputs", {"route_ids", "route_weights"}, rin,
                              [&](const Inputs& x) {
                                RouterOut ro;
                                ro.key = in_vec<int32_t>(x, "key");
                                ro.sig = in_vec<float>(x, "sig");
                                RouteOut o;
                                route_top4(o, ro, c.S, c.cfg);
                                return std::map<std::string, RawTensor>{{"route_ids", out_tensor(DType::I32, o.ids)},
                                                                        {"route_weights", out_tensor(DType::F32, o.weights)}};
                              },
                              ml));
  Inputs uin;
  uin["route_ids"] = c.output(r, "moe/outputs", "route_ids");
  uin["route_weights"] = c.output(r, "moe/outputs", "route_weights");
  for (const char* n : {"xn8", "xsc"}) uin[n] = c.input(r, "moe", n);
  steps.push_back(replay_step(c, r, "up/gate", "moe/outputs", {"gate", "up", "mid", "mid8", "midsc"}, uin,
                              [&](const Inputs& x) {
                                RouterOut ro;
                                ro.xn8 = in_vec<uint8_t>(x, "xn8");
                                ro.xsc = in_vec<uint8_t>(x, "xsc");
                                MoeOut o;
                                experts_up_gate(o, route_of(c, x), ro, *c.lw.experts, r, c.S, c.cfg);
                                return std::map<std::string, RawTensor>{
                                    {"gate", out_tensor(DType::F32, o.gate)}, {"up", out_tensor(DType::F32, o.up)},
                                    {"mid", out_tensor(DType::BF16, o.mid)},  {"mid8", out_tensor(DType::E4M3, o.mid8)},
                                    {"midsc", out_tensor(DType::E8M0, o.midsc)}};
                              },
                              ml));
  Inputs din;
  for (const char* n : {"route_ids", "route_weights", "mid8", "midsc"}) din[n] = c.output(r, "moe/outputs", n);
  steps.push_back(replay_step(c, r, "down", "moe/outputs", {"partial"}, din,
                              [&](const Inputs& x) {
                                MoeOut o;
                                o.mid8 = in_vec<uint8_t>(x, "mid8");
                                o.midsc = in_vec<uint8_t>(x, "midsc");
                                experts_down(o, route_of(c, x), *c.lw.experts, r, c.S, c.cfg);
                                return std::map<std::string, RawTensor>{{"partial", out_tensor(DType::BF16, o.partial)}};
                              },
                              ml));
  steps.push_back(replay_all_reduce(c, r, "moe/outputs", "ar_out", c.tp > 1, c.cfg.dn_rows, ml));
  return steps;
}

std::string count_text(const TensorDiff& t) {
  return t.name + " " + std::to_string(t.mismatches) + " of " + std::to_string(t.elements);
}

// The verdict of one stage from its steps and its diff against the golden.
void judge(StageDiff& sd) {
  StageReplay& rp = sd.replay;
  if (sd.status == StageDiff::Status::Missing) {
    rp.verdict = Verdict::NotReplayed;
    rp.text = "not replayed: " + sd.why;
    return;
  }
  std::vector<std::string> own, reasons, differing;
  bool compared = false;
  for (const ReplayStep& st : rp.steps) {
    if (!st.not_replayed.empty()) reasons.push_back(st.name + ": " + st.not_replayed);
    for (const std::string& s : st.differing)
      if (std::find(differing.begin(), differing.end(), s) == differing.end()) differing.push_back(s);
    for (const TensorDiff& t : st.outputs) {
      compared = compared || t.compared();
      if (t.status == TensorDiff::Status::Mismatch) own.push_back(count_text(t) + " (" + st.name + ")");
    }
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s;
  };
  bool out_mismatch = false;
  for (const TensorDiff& t : sd.tensors)
    if (t.group.find("/outputs") != std::string::npos && t.status == TensorDiff::Status::Mismatch) out_mismatch = true;
  if (!own.empty()) {
    rp.verdict = Verdict::Own;
    rp.text = "this stage is wrong: the replay on the dump's inputs differs from the dump in " + join(own);
  } else if (!compared) {
    rp.verdict = Verdict::NotReplayed;
    rp.text = "not replayed: " + (reasons.empty() ? std::string("nothing to compare") : join(reasons));
  } else if (out_mismatch) {
    rp.verdict = Verdict::Inherited;
    rp.text = "inherited a bad input: the replay on the dump's inputs matches the dump" +
              (differing.empty() ? std::string() : "; inputs that differ from the golden's: " + join(differing));
    if (!reasons.empty()) rp.text += "; not replayed: " + join(reasons);
  } else {
    rp.verdict = Verdict::Match;
    rp.text = "match";
    if (!reasons.empty()) rp.text += " (not replayed: " + join(reasons) + ")";
  }
}

}  // namespace

void replay_stages(DiffReport& rep, const std::string& golden_path, const DumpReader& g, const DumpReader& d) {
  const GoldenReader gr(golden_path);
  const LayerWeights lw = gr.weights();
  Ctx c{g, d, gr, lw, gr.config(), gr.tokens(), gr.tp()};
  for (StageDiff& sd : rep.stages) {
    if (sd.status != StageDiff::Status::Missing) {
      const int r = sd.rank;
      const size_t ml = rep.max_list;
      if (sd.stage == "index") sd.replay.steps = replay_index(c, r, ml);
      else if (sd.stage == "split") sd.replay.steps = replay_split(c, r, ml);
      else if (sd.stage == "merge") sd.replay.steps = replay_merge(c, r, ml);
      else if (sd.stage == "oproj") sd.replay.steps = replay_oproj(c, r, ml);
      else if (sd.stage == "router") sd.replay.steps = replay_router(c, r, ml);
      else if (sd.stage == "moe") sd.replay.steps = replay_moe(c, r, ml);
    }
    judge(sd);
  }
  rep.replayed = true;
}

}  // namespace k4::golden
