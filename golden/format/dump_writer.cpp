// dump_writer.cpp -- write_dump: a kernel runner's results in the golden schema (dump.hpp).
#include "golden/format/dump.hpp"

#include <algorithm>

#include "golden/io/atomic_file.hpp"
#include "golden/io/hdf5.hpp"

namespace k4::golden {

// ---- writing dumps ---------------------------------------------------------------------

namespace {

struct DumpWriter {
  h5::File file;
  DimSizes dims;
  const DumpSelection* sel = nullptr;

  bool omitted(int r, const std::string& group, const std::string& name) const {
    const std::string a = group + "/" + name, b = "rank" + std::to_string(r) + "/" + a;
    return std::find(sel->omit.begin(), sel->omit.end(), a) != sel->omit.end() ||
           std::find(sel->omit.begin(), sel->omit.end(), b) != sel->omit.end();
  }

  template <class T>
  void put(const h5::Group& g, int r, const std::string& group, const std::string& name, const std::vector<T>& v) const {
    if (omitted(r, group, name)) return;
    const TensorSpec* spec = nullptr;
    for (const TensorSpec& s : tensor_specs())
      if (group == s.group && name == s.name) spec = &s;
    if (!spec) throw std::logic_error("write_dump: no tensor " + group + "/" + name);
    const std::vector<uint64_t> shape = dims.shape(spec->dims);
    uint64_t n = 1;
    for (uint64_t x : shape) n *= x;
    if (v.size() != n)
      throw std::invalid_argument("dump " + file.path() + ": rank " + std::to_string(r) + " " + group + "/" + name + " has " +
                                  std::to_string(v.size()) + " elements, expected " + std::to_string(n));
    h5::Dataset d = g.create_dataset(name, stored_elem(spec->dtype), shape);
    d.write_raw(v.data(), stored_elem(spec->dtype));
    count_written(v.size() * sizeof(T));  // K4_FAIL_AFTER_BYTES (golden/io/atomic_file.hpp)
    d.set_attr("dtype", dtype_name(spec->dtype));
    d.set_attr("dims", dims.dims_of(spec->dims));
    d.set_attr("meaning", spec->meaning);
  }
};

void write_dump_rank(const DumpWriter& W, const h5::Group& root, const RankResult& R, int r, const DumpSelection& sel) {
  h5::Group rg = root.create_group("rank" + std::to_string(r));
  rg.set_attr("rank", int64_t(r));
  auto want = [&](const char* st) { return sel.stages.empty() || std::find(sel.stages.begin(), sel.stages.end(), st) != sel.stages.end(); };
  auto outputs = [&](const char* st) {
    h5::Group sg = rg.create_group(st);
    sg.create_group("inputs");
    return sg.create_group("outputs");
  };
  if (want("index")) {
    h5::Group o = outputs("index");
    W.put(o, r, "index/outputs", "sparse_table", R.index.sparse_table);
    W.put(o, r, "index/outputs", "blocks", R.index.blocks);
    W.put(o, r, "index/outputs", "n_ctx", R.index.n_ctx);
    W.put(o, r, "index/outputs", "long_row", R.index.long_row);
  }
  if (want("split")) {
    h5::Group o = outputs("split");
    W.put(o, r, "split/outputs", "q8", R.split.q8);
    W.put(o, r, "split/outputs", "o", R.split.o);
    W.put(o, r, "split/outputs", "m", R.split.m);
    W.put(o, r, "split/outputs", "l", R.split.l);
  }
  if (want("merge")) {
    h5::Group o = outputs("merge");
    W.put(o, r, "merge/outputs", "attn", R.merge.attn);
    W.put(o, r, "merge/outputs", "attn8", R.merge.attn8);
    W.put(o, r, "merge/outputs", "x_scale", R.merge.x_scale);
  }
  if (want("oproj")) {
    h5::Group o = outputs("oproj");
    W.put(o, r, "oproj/outputs", "partial", R.oproj.partial);
    W.put(o, r, "oproj/outputs", "a", R.a);
    W.put(o, r, "oproj/outputs", "h_mid", R.h_mid);
  }
  if (want("router")) {
    h5::Group o = outputs("router");
    W.put(o, r, "router/outputs", "xn", R.router.xn);
    W.put(o, r, "router/outputs", "xn8", R.router.xn8);
    W.put(o, r, "router/outputs", "xsc", R.router.xsc);
    W.put(o, r, "router/outputs", "rstd", R.router.rstd);
    W.put(o, r, "router/outputs", "logit", R.router.logit);
    W.put(o, r, "router/outputs", "sig", R.router.sig);
    W.put(o, r, "router/outputs", "key", R.router.key);
  }
  if (want("moe")) {
    h5::Group o = outputs("moe");
    W.put(o, r, "moe/outputs", "route_ids", R.route.ids);
    W.put(o, r, "moe/outputs", "route_weights", R.route.weights);
    W.put(o, r, "moe/outputs", "gate", R.moe.gate);
    W.put(o, r, "moe/outputs", "up", R.moe.up);
    W.put(o, r, "moe/outputs", "mid", R.moe.mid);
    W.put(o, r, "moe/outputs", "mid8", R.moe.mid8);
    W.put(o, r, "moe/outputs", "midsc", R.moe.midsc);
    W.put(o, r, "moe/outputs", "partial", R.moe.partial);
    W.put(o, r, "moe/outputs", "ar_out", R.ar_out);
  }
}

}  // namespace

void write_dump(const std::string& path, const Config& cfg, int tokens, const StepResult& res, const DumpSelection& sel,
                bool overwrite) {
  if (int(res.ranks.size()) != cfg.tp)
    throw std::invalid_argument("dump: the result holds " + std::to_string(res.ranks.size()) + " ranks, tp = " + std::to_string(cfg.tp));
  for (const std::string& st : sel.stages)
    if (std::find(stage_names().begin(), stage_names().end(), st) == stage_names().end())
      throw std::invalid_argument("dump: '" + st + "' is not a stage (index, split, merge, oproj, router, moe)");
  for (int r : sel.ranks)
    if (r < 0 || r >= cfg.tp) throw std::invalid_argument("dump: rank " + std::to_string(r) + " is outside 0.." + std::to_string(cfg.tp - 1));
  AtomicOutput out(path, overwrite);
  {
    DumpWriter W;
    W.sel = &sel;
    W.dims.cfg = cfg;
    W.dims.tokens = tokens;
    W.file = h5::File(out.temp_path(), h5::File::Mode::CreateExclusive);
    h5::Group root = W.file.root();
    root.set_attr("magic", kMagic);
    root.set_attr("schema_version", int64_t(kSchemaVersion));
    root.set_attr("kind", "dump");
    root.set_attr("tool_version", tool_version());
    root.set_attr("config", config_to_json(cfg));
    root.set_attr("variant", variant_name(cfg.variant));
    root.set_attr("tp", int64_t(cfg.tp));
    root.set_attr("tokens", int64_t(tokens));
    for (int r = 0; r < cfg.tp; ++r)
      if (sel.ranks.empty() || std::find(sel.ranks.begin(), sel.ranks.end(), r) != sel.ranks.end())
        write_dump_rank(W, root, res.ranks[r], r, sel);
    W.file.close();
  }
  out.commit();
}

}  // namespace k4::golden
