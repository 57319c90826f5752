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
  void put(const h5::Group& g, int r, const TensorSpec& spec, const std::vector<T>& v) const {
    const std::string group = spec.group, name = spec.name;
    if (omitted(r, group, name)) return;
    const std::vector<uint64_t> shape = dims.shape(spec.dims);
    const uint64_t n = dims.count(spec.dims);
    if (v.size() != n)
      throw std::invalid_argument("dump " + file.path() + ": rank " + std::to_string(r) + " " + group + "/" + name + " has " +
                                  std::to_string(v.size()) + " elements, expected " + std::to_string(n));
    h5::Dataset d = g.create_dataset(name, stored_elem(spec.dtype), shape);
    d.write_raw(v.data(), stored_elem(spec.dtype));
    count_written(v.size() * sizeof(T));  // K4_FAIL_AFTER_BYTES (golden/io/atomic_file.hpp)
    d.set_attr("dtype", dtype_name(spec.dtype));
    d.set_attr("dims", dims.dims_of(spec.dims));
    d.set_attr("meaning", spec.meaning);
  }
};

void write_dump_rank(const DumpWriter& W, const h5::Group& root, const RankResult& R, int r, const DumpSelection& sel) {
  h5::Group rg = root.create_group("rank" + std::to_string(r));
  rg.set_attr("rank", int64_t(r));
  for (const std::string& st : stage_names()) {
    if (!sel.stages.empty() && std::find(sel.stages.begin(), sel.stages.end(), st) == sel.stages.end()) continue;
    h5::Group sg = rg.create_group(st);
    sg.create_group("inputs");
    const h5::Group o = sg.create_group("outputs");
    for (const TensorSpec* s : specs_of(st + "/outputs"))
      with_field(*s, R, [&](const auto& v) { W.put(o, r, *s, v); });
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
