// step.cpp -- k4.run (the model's whole step in memory), k4.open (a golden or dump read a
// tensor at a time), and their tensors by schema path; Step.save writes the golden with the
// writer `k4 golden` uses (golden/format/writer.cpp), so the bytes are the CLI's.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "golden/format/schema.hpp"
#include "golden/format/weights_file.hpp"
#include "golden/io/atomic_file.hpp"
#include "golden/io/crash_guard.hpp"
#include "golden/io/file_check.hpp"
#include "golden/io/hdf5.hpp"
#include "python/src/bind.hpp"

namespace k4::py {
namespace {

template <class T>
TensorData tensor_of(const golden::TensorSpec& s, const golden::DimSizes& dims, const std::vector<T>& v) {
  TensorData t;
  t.dtype = dims.dtype_of(s);  // the config's: w13 / w2 are E4M3 under moe.experts = mxfp8
  t.dims = dims.dims_of(s.dims);
  t.shape = dims.shape(s.dims);
  uint64_t n = 1;
  for (uint64_t x : t.shape) n *= x;
  if (sizeof(T) != golden::dtype_bytes(t.dtype) || v.size() != n)
    throw std::logic_error(std::string("k4: in-memory tensor ") + s.group + "/" + s.name + " does not fill its schema shape");
  t.bytes.resize(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

// The experts a rank's route uses, ascending, as the golden writer stores them
// (golden/format/writer.cpp used_experts): under moe.shared_fp8 the MXFP8 shared expert is
// stored apart (sh_w13 .. sh_s2), not in the stacks.
std::vector<int32_t> used_experts(const RouteOut& route, const Config& c) {
  std::set<int32_t> ids(route.ids.begin(), route.ids.end());
  if (c.variant.shared_fp8) ids.erase(c.shared_expert());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

// The experts a rank's route uses, one field stacked in id order (what the golden stores).
std::vector<uint8_t> stacked(const LayerWeights& w, int rank, const std::vector<int32_t>& ids,
                             std::vector<uint8_t> ExpertWeights::*field) {
  std::vector<uint8_t> out;
  for (int32_t e : ids) {
    const std::shared_ptr<const ExpertWeights> x = w.experts->expert(rank, e);
    const std::vector<uint8_t>& v = (*x).*field;
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TensorData MemStep::tensor(const std::string& path) const {
  int rank = -1;
  std::string canon;
  const golden::TensorSpec& s = spec_of(path, rank, canon);
  const Config& c = w->cfg;
  if (rank >= c.tp) throw std::invalid_argument("'" + path + "': rank " + std::to_string(rank) + " is outside 0.." + std::to_string(c.tp - 1));
  if (s.link[0] != '\0') {  // a stage input that is another stage's output or a shared input
    const std::string target = s.link[0] == '@' ? "rank" + std::to_string(rank) + "/" + (s.link + 1) : std::string(s.link);
    return tensor(target);
  }
  golden::DimSizes d;
  d.cfg = c;
  d.tokens = in->shared.tokens;
  d.bt_width = in->shared.bt_width;
  d.score_width = in->shared.score_width;
  const std::string g = s.group, n = s.name;
  if (g == "/inputs") {
    if (n == "seq_lens") return tensor_of(s, d, in->shared.seq_lens);
    if (n == "block_table") return tensor_of(s, d, in->shared.block_table);
    if (n == "h_in") return tensor_of(s, d, in->shared.h_in);
  }
  const RankResult& R = res.ranks.at(size_t(rank));
  const StepRank& I = in->ranks.at(size_t(rank));
  const RankWeights& W = w->ranks.at(size_t(rank));
  d.pages = I.n_pages;  // in memory the caches are whole
  const std::vector<int32_t> ids = used_experts(R.route, c);
  d.used_experts = int(ids.size());
#define K4_T(group, name, expr) \
  if (g == group && n == name) return tensor_of(s, d, expr);
  K4_T("index/inputs", "index_scores", I.index_scores)  // this rank's own index head's scores
  K4_T("index/outputs", "sparse_table", R.index.sparse_table)
  K4_T("index/outputs", "blocks", R.index.blocks)
  K4_T("index/outputs", "n_ctx", R.index.n_ctx)
  K4_T("index/outputs", "long_row", R.index.long_row)
  K4_T("split/inputs", "q", I.q)
  K4_T("split/inputs", "k_cache", I.k_cache)
  K4_T("split/inputs", "v_cache", I.v_cache)
  K4_T("split/inputs", "k_scale", I.k_scale)
  K4_T("split/inputs", "v_scale", I.v_scale)
  K4_T("split/outputs", "q8", R.split.q8)
  K4_T("split/outputs", "o", R.split.o)
  K4_T("split/outputs", "m", R.split.m)
  K4_T("split/outputs", "l", R.split.l)
  K4_T("merge/outputs", "attn", R.merge.attn)
  K4_T("merge/outputs", "attn8", R.merge.attn8)
  K4_T("merge/outputs", "x_scale", R.merge.x_scale)
  K4_T("oproj/inputs", "w_o", W.w_o)
  K4_T("oproj/inputs", "s_o", W.s_o)
  K4_T("oproj/outputs", "partial", R.oproj.partial)
  K4_T("oproj/outputs", "a", R.a)
  K4_T("oproj/outputs", "h_mid", R.h_mid)
  K4_T("router/inputs", "g_post", W.g_post)
  K4_T("router/inputs", "w_gate", W.w_gate)
  K4_T("router/inputs", "w_gate_f32", W.w_gate_f32)  // listed only under router.gate = f32 (spec_present)
  K4_T("router/inputs", "bias", W.bias)
  K4_T("router/outputs", "xn", R.router.xn)
  K4_T("router/outputs", "xn8", R.router.xn8)
  K4_T("router/outputs", "xsc", R.router.xsc)
  K4_T("router/outputs", "rstd", R.router.rstd)
  K4_T("router/outputs", "logit", R.router.logit)
  K4_T("router/outputs", "sig", R.router.sig)
  K4_T("router/outputs", "key", R.router.key)
  K4_T("moe/inputs", "expert_ids", ids)
  K4_T("moe/inputs", "w13", stacked(*w, rank, ids, &ExpertWeights::w13))
  K4_T("moe/inputs", "s13", stacked(*w, rank, ids, &ExpertWeights::s13))
  K4_T("moe/inputs", "w2", stacked(*w, rank, ids, &ExpertWeights::w2))
  K4_T("moe/inputs", "s2", stacked(*w, rank, ids, &ExpertWeights::s2))
  if (c.variant.shared_fp8) {  // V6.1: the MXFP8 shared expert's own tables
    const std::vector<int32_t> sh = {c.shared_expert()};
    K4_T("moe/inputs", "sh_w13", stacked(*w, rank, sh, &ExpertWeights::w13))
    K4_T("moe/inputs", "sh_s13", stacked(*w, rank, sh, &ExpertWeights::s13))
    K4_T("moe/inputs", "sh_w2", stacked(*w, rank, sh, &ExpertWeights::w2))
    K4_T("moe/inputs", "sh_s2", stacked(*w, rank, sh, &ExpertWeights::s2))
  }
  K4_T("moe/outputs", "route_ids", R.route.ids)
  K4_T("moe/outputs", "route_weights", R.route.weights)
  K4_T("moe/outputs", "gate", R.moe.gate)
  K4_T("moe/outputs", "up", R.moe.up)
  K4_T("moe/outputs", "mid", R.moe.mid)
  K4_T("moe/outputs", "mid8", R.moe.mid8)
  K4_T("moe/outputs", "midsc", R.moe.midsc)
  K4_T("moe/outputs", "partial", R.moe.partial)
  K4_T("moe/outputs", "ar_out", R.ar_out)
#undef K4_T
  // page_ids: only the golden's "selected" KV form stores it; in memory the caches are whole.
  throw std::invalid_argument("'" + path + "': not held by a step in memory (the caches are whole: no page_ids)");
}

std::vector<std::string> MemStep::paths() const {
  std::vector<std::string> out;
  for (const golden::TensorSpec& s : golden::tensor_specs()) {
    if (std::string(s.group) == "/inputs") {
      out.push_back(std::string("/inputs/") + s.name);
      continue;
    }
    if (std::string(s.name) == "page_ids") continue;
    if (!golden::spec_present(s, w->cfg)) continue;  // e.g. sh_w13 .. only under moe.shared_fp8
    for (int r = 0; r < w->cfg.tp; ++r) out.push_back("/rank" + std::to_string(r) + "/" + s.group + "/" + s.name);
  }
  return out;
}

void MemStep::save(const std::string& path, bool overwrite, const std::string& kv_form,
                   const std::string& weights_file) const {
  golden::GoldenMeta m = meta;
  m.kv_form = kv_form;
  golden::WriteOptions o;
  o.overwrite = overwrite;
  pyb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(hdf5_lock());
  if (!weights_file.empty()) {  // k4 golden's order: the output refused first, then the weights file
    golden::refuse_weights_file(w->cfg, weight_injections, "weights_file");
    { AtomicOutput probe(path, overwrite); }
    golden::WeightsSource src;
    src.weights = m.weights, src.weight_seed = m.weight_seed, src.weight_prep = m.weight_prep, src.weight_layer = m.weight_layer;
    if (std::filesystem::exists(weights_file)) {
      const golden::WeightsFile f(weights_file);
      f.require_matches(w->cfg, src);
      f.verify();
      m.weights_file_hash = f.hash();
    } else {
      m.weights_file_hash = golden::write_weights_file(weights_file, *w, src);
    }
    m.weights_file = weights_file;
  }
  golden::write_golden(path, *w, *in, res, m, o);
}

// ---- files -------------------------------------------------------------------------------

namespace {

// What k4.open reads of a file at once: its reader, kind, config, tp, tokens, q_len.
void read_header(FileStep& step, const std::string& path) {
  FileStep* f = &step;
  f->reader = std::make_shared<golden::DumpReader>(path, "golden");
  const golden::DumpReader& r = *f->reader;
  f->kind = r.has_root_attr("kind") ? r.root_attr_string("kind") : "golden";
  f->cfg = golden::config_from_json(r.root_attr_string("config"), "golden " + path);
  f->tp = int(r.root_attr_int("tp"));
  f->tokens = int(r.root_attr_int("tokens"));
  {  // the index stage's q_len (a golden's /inputs attribute)
    h5::File file(path, h5::File::Mode::ReadOnly);
    const h5::Group root = file.root();
    if (root.exists("inputs") && root.is_group("inputs")) {
      const h5::Group g = root.open_group("inputs");
      if (g.has_attr("q_len") && g.attr_kind("q_len") == "int") f->q_len = int(g.attr_int("q_len"));
    }
  }
}

}  // namespace

std::shared_ptr<FileStep> open_file(const std::string& path) {
  auto f = std::make_shared<FileStep>();
  std::lock_guard<std::mutex> lock(hdf5_lock());
  // libhdf5 crashes on some corrupt files (docs/reliability.md L2) where the tools' crash guard
  // can end the command; an interpreter must go on: the same reads in a forked child first, and
  // a crash there is this file's FormatError, with the tools' message
  throw_if_crashed(guard::probe_in_child(path, [&] { read_header(*f, path); }));
  read_header(*f, path);
  return f;
}

TensorData FileStep::tensor(const std::string& path) const {
  int rank = -1;
  std::string canon;
  const golden::TensorSpec& s = spec_of(path, rank, canon);
  golden::RawTensor raw;
  std::string why;
  std::lock_guard<std::mutex> lock(hdf5_lock());
  const DType want = golden::spec_dtype(s, cfg);  // the file's config's (moe.experts = mxfp8: E4M3 w13 / w2)
  if (!probed.count(canon)) {  // until a read has passed in a forked child, as open_file's
    const std::string file = reader->path();
    throw_if_crashed(guard::probe_in_child(file, [&] {
      golden::RawTensor r;
      std::string w;
      golden::DumpReader(file, "golden").read(canon, want, {}, r, w);
    }));
    probed.insert(canon);
  }
  const auto st = reader->read(canon, want, {}, raw, why);
  if (st != golden::TensorDiff::Status::Match) throw golden::FormatError(reader->path() + ": " + canon + ": " + why);
  TensorData t;
  t.dtype = want;
  std::string dims;
  for (const std::string& x : raw.dims) dims += (dims.empty() ? "" : ",") + x;
  t.dims = dims;
  t.shape = raw.shape;
  const size_t w = golden::dtype_bytes(t.dtype);
  t.bytes.resize(raw.bits.size() * w);
  for (size_t i = 0; i < raw.bits.size(); ++i) std::memcpy(t.bytes.data() + i * w, &raw.bits[i], w);  // little-endian
  return t;
}

std::vector<std::string> FileStep::paths() const {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(hdf5_lock());
  for (const golden::TensorSpec& s : golden::tensor_specs()) {
    if (std::string(s.group) == "/inputs") {
      const std::string p = std::string("/inputs/") + s.name;
      if (reader->has_dataset(p)) out.push_back(p);
      continue;
    }
    for (int r = 0; r < tp; ++r) {
      const std::string p = "/rank" + std::to_string(r) + "/" + s.group + "/" + s.name;
      if (reader->has_dataset(p)) out.push_back(p);
    }
  }
  return out;
}

std::string FileStep::attr(const std::string& name) const {
  std::lock_guard<std::mutex> lock(hdf5_lock());
  if (!reader->has_root_attr(name)) throw std::invalid_argument(reader->path() + ": no attribute '" + name + "' at /");
  try {
    return reader->root_attr_string(name);
  } catch (const golden::FormatError&) {
    return std::to_string(reader->root_attr_int(name));
  }
}

namespace {

MemStep run(const Weights& W, const Inputs& I) {
  std::shared_ptr<const LayerWeights> w = W.w;
  if (I.made_from == W.w.get()) {
    w = I.weights;  // the scenario's overrides and weight injections applied
  } else {
    if (I.weight_injections)
      throw std::invalid_argument("k4.run: these inputs were made with weight injections on other weights; run them with the weights given to k4.inputs");
    if (golden::config_to_json(W.w->cfg) != golden::config_to_json(I.cfg))
      throw std::invalid_argument("k4.run: the inputs were made for config " + golden::config_to_json(I.cfg) + ", the weights are " +
                                  golden::config_to_json(W.w->cfg));
  }
  MemStep s;
  s.w = w;
  s.in = I.in;
  s.meta.scenario_json = I.scenario_json;
  s.meta.weight_seed = W.checkpoint.empty() ? W.seed : 0;
  s.meta.input_seed = I.seed;
  s.meta.weights = W.source;
  s.weight_injections = I.made_from == W.w.get() && I.weight_injections;
  if (!W.checkpoint.empty()) s.meta.weight_prep = W.weight_prep, s.meta.weight_layer = W.layer;  // as k4 golden records them
  pyb::gil_scoped_release nogil;
  validate_inputs(*s.in, w->cfg);
  s.res = run_step(*w, *s.in);
  return s;
}

pyb::dict mem_attrs(const MemStep& s) {
  pyb::dict a;
  a["magic"] = golden::kMagic;
  a["config"] = golden::config_to_json(s.w->cfg);
  a["variant"] = variant_name(s.w->cfg.variant);
  a["scenario"] = s.meta.scenario_json;
  a["weights"] = s.meta.weights;
  a["tp"] = s.w->cfg.tp;
  a["tokens"] = s.in->shared.tokens;
  return a;
}

}  // namespace

void bind_step(pyb::module_& m) {
  pyb::class_<MemStep>(m, "MemStep")
      .def_property_readonly("config", &MemStep::cfg)
      .def_property_readonly("tp", [](const MemStep& s) { return s.w->cfg.tp; })
      .def_property_readonly("tokens", [](const MemStep& s) { return s.in->shared.tokens; })
      .def_property_readonly("q_len", [](const MemStep& s) { return s.in->shared.q_len; })
      .def_property_readonly("attrs", &mem_attrs)
      .def("tensor", [](const MemStep& s, const std::string& p) { return to_python(s.tensor(p)); }, pyb::arg("path"))
      .def("paths", &MemStep::paths)
      .def("save", &MemStep::save, pyb::arg("path"), pyb::arg("overwrite") = false, pyb::arg("kv_form") = "auto",
           pyb::arg("weights_file") = "");
  pyb::class_<FileStep, std::shared_ptr<FileStep>>(m, "FileStep")
      .def_readonly("config", &FileStep::cfg)
      .def_readonly("tp", &FileStep::tp)
      .def_readonly("tokens", &FileStep::tokens)
      .def_readonly("kind", &FileStep::kind)
      .def_readonly("q_len", &FileStep::q_len)
      .def_property_readonly("path", [](const FileStep& f) { return f.reader->path(); })
      .def("attr", &FileStep::attr, pyb::arg("name"))
      .def("tensor", [](const FileStep& s, const std::string& p) { return to_python(s.tensor(p)); }, pyb::arg("path"))
      .def("paths", &FileStep::paths);
  m.def("_run", &run, pyb::arg("weights"), pyb::arg("inputs"));
  m.def("_open", &open_file, pyb::arg("path"));
  m.def("tool_version", &golden::tool_version);
}

}  // namespace k4::py
