// writer.cpp -- write_golden: a step's inputs, weights and results as a golden (schema.hpp).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "golden/format/schema.hpp"
#include "golden/format/weights_file.hpp"
#include "golden/io/atomic_file.hpp"
#include "golden/io/hdf5.hpp"

namespace k4::golden {

namespace {

struct Writer {
  h5::File file;
  DimSizes dims;
  uint64_t done = 0, total = 0;
  const WriteOptions* opt = nullptr;
  std::string weights_file;  // the name the virtual datasets give their source (relative to the golden's directory)

  void tick(uint64_t bytes) {
    count_written(bytes);  // K4_FAIL_AFTER_BYTES (golden/io/atomic_file.hpp)
    done += bytes;
    if (opt->progress) opt->progress(done, total);
  }

  void describe(const h5::Dataset& d, const TensorSpec& s) const {
    d.set_attr("dtype", dtype_name(dims.dtype_of(s)));
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

void put_links(const h5::Group& g, const std::string& group, int rank, const Config& c) {
  for (const TensorSpec& s : tensor_specs()) {
    if (group != s.group || s.link[0] == '\0' || !spec_present(s, c)) continue;
    std::string target = s.link;
    if (target[0] == '@') target = "/rank" + std::to_string(rank) + "/" + target.substr(1);
    g.link_soft(s.name, target);
  }
}

// A stage's outputs, each from its result field (the table's order: byte-identical files).
void put_outputs(const Writer& W, const h5::Group& o, const std::string& stage, const RankResult& R) {
  for (const TensorSpec* s : specs_of(stage + "/outputs"))
    with_field(*s, R, [&](const auto& v) { W.put(o, s->group, s->name, v); });
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
  if (cfg.variant.shared_fp8) out.pop_back();  // V6.1: the MXFP8 shared expert is stored apart (sh_*)
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
  const bool virt = !W.weights_file.empty();  // virtual datasets over the weights file's rows ids
  const std::vector<uint64_t> rows(ids.begin(), ids.end());
  for (const Part& p : parts) {
    const TensorSpec& s = find_spec("moe/inputs", p.name);
    const std::vector<uint64_t> shape = W.dims.shape(s.dims);
    if (virt) {
      std::vector<uint64_t> src = shape;
      src[0] = uint64_t(c.n_routed) + (c.variant.shared_fp8 ? 0 : 1);  // the file's stacked tables (weights_file.hpp)
      ds.push_back(g.create_virtual(p.name, h5::Elem::U8, shape, W.weights_file, "/rank" + std::to_string(rank) + "/" + p.name,
                                    src, rows));
    } else {
      ds.push_back(g.create_dataset(p.name, h5::Elem::U8, shape));
    }
    W.describe(ds.back(), s);
  }
  Fnv64 hash[4];  // virtual: the bytes each table reads, for its source_hash
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
        if (virt) {
          hash[k].add(v.data(), v.size());
        } else {
          ds[k].write_rows(i, 1, v.data(), h5::Elem::U8);
          W.tick(per);
        }
      }
    }
  }
  if (virt)
    for (size_t k = 0; k < 4; ++k) ds[k].set_attr("source_hash", hash[k].hex());
  if (c.variant.shared_fp8) {  // V6.1: the MXFP8 shared expert's own tables
    const std::shared_ptr<const ExpertWeights> sh = lw.experts->expert(rank, c.shared_expert());
    for (size_t k = 0; k < 4; ++k) {
      const std::string name = std::string("sh_") + parts[k].name;
      const std::vector<uint8_t>& v = (*sh).*(parts[k].field);
      if (!virt) {
        W.put(g, "moe/inputs", name, v);
        continue;
      }
      // a virtual dataset over the weights file's one-row /rank<r>/sh_* table
      const TensorSpec& s = find_spec("moe/inputs", name);
      const std::vector<uint64_t> shape = W.dims.shape(s.dims);
      if (v.size() != shape[1] * shape[2])
        throw std::invalid_argument("golden: the shared expert of rank " + std::to_string(rank) + ": " + name + " has " +
                                    std::to_string(v.size()) + " bytes, expected " + std::to_string(shape[1] * shape[2]));
      h5::Dataset d = g.create_virtual(name, h5::Elem::U8, shape, W.weights_file, "/rank" + std::to_string(rank) + "/" + name,
                                       shape, {0});
      W.describe(d, s);
      Fnv64 h;
      h.add(v.data(), v.size());
      d.set_attr("source_hash", h.hex());
    }
  }
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
    put_links(g, "index/inputs", r, c);
    put_or_link(W, g, "index/inputs", "index_scores", I.index_scores, in.ranks[0].index_scores, r);
    put_outputs(W, stage("index", "outputs"), "index", R);
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
      if (c.one_kv_scale()) {
        W.put(g, "split/inputs", "k_scale", I.k_scale);
        W.put(g, "split/inputs", "v_scale", I.v_scale);
      } else {
        W.put(g, "split/inputs", "k_scale", gather_rows(I.k_scale, pages, size_t(c.page)));
        W.put(g, "split/inputs", "v_scale", gather_rows(I.v_scale, pages, size_t(c.page)));
      }
    }
    put_links(g, "split/inputs", r, c);
    put_outputs(W, stage("split", "outputs"), "split", R);
  }
  // stage 2
  {
    put_links(stage("merge", "inputs"), "merge/inputs", r, c);
    put_outputs(W, stage("merge", "outputs"), "merge", R);
  }
  // stage 3
  {
    h5::Group g = stage("oproj", "inputs");
    put_links(g, "oproj/inputs", r, c);
    if (W.weights_file.empty()) {
      W.put(g, "oproj/inputs", "w_o", w.w_o);
    } else {  // a virtual dataset over the weights file's /rank<r>/w_o
      const TensorSpec& s = find_spec("oproj/inputs", "w_o");
      const std::vector<uint64_t> shape = W.dims.shape(s.dims);
      if (w.w_o.size() != shape[0] * shape[1]) throw std::invalid_argument("golden: w_o of rank " + std::to_string(r) + " has the wrong size");
      std::vector<uint64_t> rows(shape[0]);
      for (uint64_t i = 0; i < shape[0]; ++i) rows[i] = i;
      h5::Dataset d = g.create_virtual("w_o", h5::Elem::U8, shape, W.weights_file, "/rank" + std::to_string(r) + "/w_o", shape, rows);
      W.describe(d, s);
      Fnv64 h;
      h.add(w.w_o.data(), w.w_o.size());
      d.set_attr("source_hash", h.hex());
    }
    put_or_link(W, g, "oproj/inputs", "s_o", w.s_o, w0.s_o, r);
    put_outputs(W, stage("oproj", "outputs"), "oproj", R);
  }
  // stage 4
  {
    h5::Group g = stage("router", "inputs");
    put_links(g, "router/inputs", r, c);
    put_or_link(W, g, "router/inputs", "g_post", w.g_post, w0.g_post, r);
    put_or_link(W, g, "router/inputs", "w_gate", w.w_gate, w0.w_gate, r);
    if (c.variant.router_gate == RouterGate::f32) put_or_link(W, g, "router/inputs", "w_gate_f32", w.w_gate_f32, w0.w_gate_f32, r);
    put_or_link(W, g, "router/inputs", "bias", w.bias, w0.bias, r);
    put_outputs(W, stage("router", "outputs"), "router", R);
  }
  // stage 5
  {
    h5::Group g = stage("moe", "inputs");
    put_links(g, "moe/inputs", r, c);
    const std::vector<int32_t> ids = used_experts(R.route, c);
    W.dims.used_experts = int(ids.size());
    g.set_attr("n_experts", int64_t(ids.size()));
    put_experts(W, g, lw, r, ids);
    put_outputs(W, stage("moe", "outputs"), "moe", R);
  }
}

// Bytes of tensor data the file will hold, roughly (the progress bar's total: the attributes, the
// small tensors and the dumps' extras are not counted; the bar stops at 100%).
uint64_t estimate_bytes(const LayerWeights& lw, const StepInputs& in, const StepResult& res) {
  const Config& c = lw.cfg;
  uint64_t t = 0;
  const uint64_t wb = c.variant.experts == ExpertFormat::mxfp8 || c.variant.shared_fp8 ? 1 : 2;  // E4M3 or E2M1 pairs
  const uint64_t per_expert =
      uint64_t(2 * c.inter) * (c.hidden / wb + c.hidden / 32) + uint64_t(c.hidden) * (c.inter / wb + c.inter / 32);
  for (int r = 0; r < c.tp; ++r) {
    t += in.ranks[r].k_cache.size() * 2 + lw.ranks[r].w_o.size();
    t += (used_experts(res.ranks[r].route, c).size() + 1) * per_expert;
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
    if (!meta.weights_file.empty()) {
      namespace fs = std::filesystem;
      const fs::path wf = fs::absolute(meta.weights_file).lexically_normal();
      const fs::path dir = fs::absolute(path).lexically_normal().parent_path();
      W.weights_file = wf.lexically_relative(dir).string();
      if (W.weights_file.empty()) W.weights_file = wf.string();
    }
    h5::Group root = W.file.root();
    root.set_attr("magic", kMagic);
    root.set_attr("schema_version", int64_t(kSchemaVersion));
    root.set_attr("contract_version", kContractVersion);
    root.set_attr("tool_version", tool_version());
    root.set_attr("config", config_to_json(c));
    root.set_attr("variant", variant_name(c.variant));  // for people: the config's variant is the truth
    root.set_attr("scenario", meta.scenario_json);
    nlohmann::ordered_json seeds;
    seeds["weights"] = meta.weight_seed;
    seeds["inputs"] = meta.input_seed;
    root.set_attr("seeds", seeds.dump());
    root.set_attr("tp", int64_t(c.tp));
    root.set_attr("tokens", int64_t(in.shared.tokens));
    root.set_attr("weights", meta.weights);
    if (!W.weights_file.empty()) {
      nlohmann::ordered_json wj;
      wj["path"] = W.weights_file;
      wj["hash"] = meta.weights_file_hash;
      root.set_attr("weights_file", wj.dump());
    }
    if (!meta.weight_prep.empty()) {
      root.set_attr("weight_prep", meta.weight_prep);
      root.set_attr("weight_layer", int64_t(meta.weight_layer));
    }
    h5::Group ig = root.create_group("inputs");
    ig.set_attr("tokens", int64_t(in.shared.tokens));
    ig.set_attr("q_len", int64_t(in.shared.q_len));
    ig.set_attr("bt_width", int64_t(in.shared.bt_width));
    ig.set_attr("score_width", int64_t(in.shared.score_width));
    W.put(ig, "/inputs", "seq_lens", in.shared.seq_lens);
    W.put(ig, "/inputs", "block_table", in.shared.block_table);
    W.put(ig, "/inputs", "h_in", in.shared.h_in);
    for (int r = 0; r < c.tp; ++r) write_rank(W, root, lw, in, res, meta, r);
    W.file.close();
  }
  out.commit();
}

}  // namespace k4::golden
