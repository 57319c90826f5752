// diff.cpp -- k4.diff / k4.replay (golden/diff's DiffReport as objects: str() is k4 diff's
// text, to_json its --json, to_html its --html), the comparison of two arrays behind
// k4.assert_bitexact, and k4.DumpWriter (a kernel's tensors into a dump in the golden
// schema, each checked against the schema's dtype and shape as it is added).
#include <algorithm>
#include <cstring>
#include <map>

#include "golden/io/atomic_file.hpp"
#include "golden/io/crash_guard.hpp"
#include "golden/io/hdf5.hpp"
#include "python/src/bind.hpp"
#include "tools/report_html.hpp"

namespace k4::py {
namespace {

using golden::DiffReport;
using golden::TensorDiff;

DiffReport diff(const std::string& golden_path, const std::string& dump_path, size_t max, bool replay) {
  golden::DiffOptions o;
  o.max_list = max;
  o.replay = replay;
  pyb::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(hdf5_lock());
  // the comparison's reads in a forked child first (step.cpp open_file; no replay: the same
  // files read once more): a file on which libhdf5 crashes is a FormatError naming it, not
  // the end of the interpreter
  golden::DiffOptions probe = o;
  probe.replay = false;
  throw_if_crashed(guard::probe_in_child(dump_path, [&] { golden::diff_files(golden_path, dump_path, probe); }));
  return golden::diff_files(golden_path, dump_path, o);
}

golden::RawTensor raw_of(const pyb::array& a, DType d, const std::vector<std::string>& dims, const std::string& what) {
  const std::vector<uint8_t> b = bits_of(a, d, what);
  golden::RawTensor t;
  t.dtype = d;
  t.dims = dims;
  for (pyb::ssize_t i = 0; i < a.ndim(); ++i) t.shape.push_back(uint64_t(a.shape(i)));
  if (t.dims.size() != t.shape.size()) {
    t.dims.clear();
    for (size_t i = 0; i < t.shape.size(); ++i) t.dims.push_back("d" + std::to_string(i));
  }
  const size_t w = golden::dtype_bytes(d);
  t.bits.assign(b.size() / w, 0);
  for (size_t i = 0; i < t.bits.size(); ++i) std::memcpy(&t.bits[i], b.data() + i * w, w);  // little-endian
  return t;
}

// expected vs actual as a one-tensor report: a schema path names its rank, stage and group.
DiffReport compare_arrays(const pyb::array& expected, const pyb::array& actual, const std::string& dtype,
                          const std::vector<std::string>& dims, const std::string& name, size_t max) {
  const DType d = dtype_named(dtype);
  const golden::RawTensor ref = raw_of(expected, d, dims, name + " (expected)");
  const golden::RawTensor got = raw_of(actual, d, dims, name + " (actual)");
  DiffReport rep;
  rep.golden = "expected";
  rep.dump = "actual";
  rep.config_name = name;
  rep.max_list = max;
  golden::StageDiff st;
  st.stage = "tensor";
  TensorDiff t;
  t.name = name;
  t.group = "";
  try {
    int rank = -1;
    std::string canon;
    const golden::TensorSpec& s = spec_of(name, rank, canon);
    t.name = s.name;
    t.group = s.group;
    st.rank = std::max(rank, 0);
    st.stage = rank < 0 ? "inputs" : std::string(s.group).substr(0, std::string(s.group).find('/'));
  } catch (const std::invalid_argument&) {
  }
  t.path = name;
  t.dtype = d;
  t.dims = ref.dims;
  t.shape = ref.shape;
  t.elements = ref.elements();
  if (ref.shape != got.shape) {
    t.status = TensorDiff::Status::ShapeDiffers;
    t.why = "expected shape " + golden::shape_str(ref.shape) + ", actual " + golden::shape_str(got.shape);
  } else {
    golden::diff_tensor(t, ref, got, max);
  }
  rep.tensors_compared = 1;
  if (t.status == TensorDiff::Status::Mismatch && !t.first.empty()) {
    rep.first.found = true;
    rep.first.rank = st.rank;
    rep.first.stage = st.stage;
    rep.first.tensor = t.name;
    rep.first.index = t.first[0].index;
    rep.first.dims = t.dims;
    rep.first.flat = t.first[0].flat;
  }
  st.status = t.status == TensorDiff::Status::Match ? golden::StageDiff::Status::Match : golden::StageDiff::Status::Mismatch;
  st.tensors.push_back(std::move(t));
  rep.stages.push_back(std::move(st));
  return rep;
}

pyb::dict named(const std::vector<uint64_t>& index, const std::vector<std::string>& dims) {
  pyb::dict d;
  for (size_t i = 0; i < index.size(); ++i) d[pyb::str(i < dims.size() ? dims[i] : "d" + std::to_string(i))] = index[i];
  return d;
}

// ---- the dump writer -----------------------------------------------------------------------

class DumpWriter {
 public:
  DumpWriter(std::string path, Config cfg, int tokens, bool overwrite)
      : path_(std::move(path)), cfg_(std::move(cfg)), tokens_(tokens), overwrite_(overwrite) {
    cfg_.validate();
    if (tokens < 1 || tokens > cfg_.max_tokens)
      throw std::invalid_argument("dump " + path_ + ": tokens " + std::to_string(tokens) + " is outside 1.." + std::to_string(cfg_.max_tokens));
    check_output(path_, overwrite_);  // refused now, not after the kernel ran
  }

  // `dtype`: the k4.Tensor's dtype when the array is one ("" for a bare array: its numpy
  // type must be the schema dtype's storage type).
  void add(const std::string& path, const pyb::array& a, const std::string& dtype) {
    if (closed_) throw std::invalid_argument("dump " + path_ + ": already written (close() was called)");
    int rank = -1;
    std::string canon;
    const golden::TensorSpec& s = spec_of(path, rank, canon);
    const std::string what = "dump " + path_ + ": " + canon;
    if (rank < 0) throw std::invalid_argument(what + ": a dump holds stage tensors of ranks (rankR/STAGE/...)");
    if (rank >= cfg_.tp) throw std::invalid_argument(what + ": rank " + std::to_string(rank) + " is outside 0.." + std::to_string(cfg_.tp - 1));
    if (s.link[0] != '\0') throw std::invalid_argument(what + ": a link to " + std::string(s.link) + " in the schema; add that tensor");
    const DType want_dt = golden::spec_dtype(s, cfg_);  // the config's (moe.experts = mxfp8: E4M3 w13 / w2)
    if (!dtype.empty() && dtype != golden::dtype_name(want_dt))
      throw std::invalid_argument(what + ": the schema's dtype is " + golden::dtype_name(want_dt) + ", got a " + dtype + " tensor");
    TensorData t;
    t.dtype = want_dt;
    t.bytes = bits_of(a, want_dt, what);
    for (pyb::ssize_t i = 0; i < a.ndim(); ++i) t.shape.push_back(uint64_t(a.shape(i)));
    golden::DimSizes d;
    d.cfg = cfg_;
    d.tokens = tokens_;
    t.dims = d.dims_of(s.dims);
    const std::vector<std::string> names = golden::split_dims(t.dims);
    bool ok = names.size() == t.shape.size();
    std::string want = "(";
    for (size_t i = 0; i < names.size(); ++i) {
      // sizes the config and token count do not fix (block-table width, pages, experts) are the array's
      const bool free = names[i] == "bt_block" || names[i] == "score_block" || names[i] == "page" || names[i] == "used_expert";
      const int64_t n = free ? -1 : d.of(names[i]);
      want += (i ? "," : "") + (free ? names[i] : std::to_string(n));
      if (ok && n >= 0 && uint64_t(n) != t.shape[i]) ok = false;
    }
    want += ")";
    if (!ok)
      throw std::invalid_argument(what + ": shape " + golden::shape_str(t.shape) + ", expected " + want + " [" + t.dims + "]");
    tensors_[canon] = std::move(t);
  }

  void close() {
    if (closed_) return;
    pyb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(hdf5_lock());
    AtomicOutput out(path_, overwrite_);
    {
      h5::File f(out.temp_path(), h5::File::Mode::CreateExclusive);
      h5::Group root = f.root();
      root.set_attr("magic", golden::kMagic);
      root.set_attr("schema_version", int64_t(golden::kSchemaVersion));
      root.set_attr("kind", "dump");
      root.set_attr("tool_version", golden::tool_version());
      root.set_attr("config", golden::config_to_json(cfg_));
      root.set_attr("variant", variant_name(cfg_.variant));
      root.set_attr("tp", int64_t(cfg_.tp));
      root.set_attr("tokens", int64_t(tokens_));
      for (int r = 0; r < cfg_.tp; ++r) write_rank(root, r);
      f.close();
    }
    out.commit();
    closed_ = true;
  }

  std::vector<std::string> paths() const {
    std::vector<std::string> v;
    for (const auto& kv : tensors_) v.push_back(kv.first);
    return v;
  }
  const std::string& path() const { return path_; }

 private:
  void write_rank(const h5::Group& root, int r) const {
    const std::string rp = "/rank" + std::to_string(r) + "/";
    bool any = false;
    for (const auto& kv : tensors_) any = any || kv.first.compare(0, rp.size(), rp) == 0;
    if (!any) return;
    h5::Group rg = root.create_group("rank" + std::to_string(r));
    rg.set_attr("rank", int64_t(r));
    for (const std::string& st : golden::stage_names()) {
      bool has = false;
      for (const auto& kv : tensors_) has = has || kv.first.compare(0, rp.size() + st.size() + 1, rp + st + "/") == 0;
      if (!has) continue;
      h5::Group sg = rg.create_group(st);
      h5::Group groups[2] = {sg.create_group("inputs"), sg.create_group("outputs")};
      for (const golden::TensorSpec& s : golden::tensor_specs()) {  // the schema's order
        const std::string g = s.group;
        if (g.compare(0, st.size() + 1, st + "/") != 0) continue;
        auto it = tensors_.find(rp + g + "/" + s.name);
        if (it == tensors_.end()) continue;
        const TensorData& t = it->second;
        const h5::Group& dst = groups[g.substr(st.size() + 1) == "inputs" ? 0 : 1];
        h5::Dataset ds = dst.create_dataset(s.name, golden::stored_elem(t.dtype), t.shape);
        ds.write_raw(t.bytes.data(), golden::stored_elem(t.dtype));
        ds.set_attr("dtype", golden::dtype_name(t.dtype));
        ds.set_attr("dims", t.dims);
        ds.set_attr("meaning", s.meaning);
      }
    }
  }

  std::string path_;
  Config cfg_;
  int tokens_;
  bool overwrite_;
  bool closed_ = false;
  std::map<std::string, TensorData> tensors_;
};

}  // namespace

void bind_diff(pyb::module_& m) {
  pyb::class_<golden::Distance>(m, "Distance")
      .def_property_readonly("kind", [](const golden::Distance& d) {
        switch (d.kind) {
          case golden::Distance::Kind::Ulp: return "ulp";
          case golden::Distance::Kind::Int: return "int";
          case golden::Distance::Kind::NanVsNumber: return "nan_vs_number";
          case golden::Distance::Kind::NanVsNan: return "nan_vs_nan";
        }
        return "?";
      })
      .def_readonly("n", &golden::Distance::n)
      .def("__str__", &golden::Distance::str);
  pyb::class_<golden::Mismatch>(m, "Mismatch")
      .def_readonly("flat", &golden::Mismatch::flat)
      .def_readonly("index", &golden::Mismatch::index)
      .def_readonly("expected_bits", &golden::Mismatch::ref)
      .def_readonly("actual_bits", &golden::Mismatch::got)
      .def_readonly("distance", &golden::Mismatch::dist);
  pyb::class_<TensorDiff>(m, "TensorDiff")
      .def_readonly("name", &TensorDiff::name)
      .def_readonly("group", &TensorDiff::group)
      .def_readonly("path", &TensorDiff::path)
      .def_property_readonly("status", [](const TensorDiff& t) { return golden::status_name(t.status); })
      .def_readonly("why", &TensorDiff::why)
      .def_property_readonly("dtype", [](const TensorDiff& t) { return golden::dtype_name(t.dtype); })
      .def_readonly("dims", &TensorDiff::dims)
      .def_readonly("shape", &TensorDiff::shape)
      .def_readonly("elements", &TensorDiff::elements)
      .def_readonly("mismatches", &TensorDiff::mismatches)
      .def_readonly("first", &TensorDiff::first)
      .def_property_readonly("ulp_histogram", [](const TensorDiff& t) {
        pyb::dict h;  // bucket label -> count, non-empty buckets only
        for (int k = 0; k < golden::kHistBuckets; ++k)
          if (t.hist[size_t(k)]) h[pyb::str(golden::hist_label(k))] = t.hist[size_t(k)];
        return h;
      })
      .def_readonly("nan_vs_number", &TensorDiff::nan_vs_number)
      .def_readonly("nan_vs_nan", &TensorDiff::nan_vs_nan);
  pyb::class_<golden::StageDiff>(m, "StageDiff")
      .def_readonly("stage", &golden::StageDiff::stage)
      .def_readonly("rank", &golden::StageDiff::rank)
      .def_property_readonly("status", [](const golden::StageDiff& s) { return golden::stage_status_name(s.status); })
      .def_readonly("why", &golden::StageDiff::why)
      .def_readonly("tensors", &golden::StageDiff::tensors)
      .def_property_readonly("verdict", [](const golden::StageDiff& s) { return golden::verdict_text(s.replay.verdict); })
      .def_property_readonly("replay_text", [](const golden::StageDiff& s) { return s.replay.text; })
      .def("mismatches", &golden::StageDiff::mismatches);
  pyb::class_<golden::Divergence>(m, "Divergence")
      .def_readonly("found", &golden::Divergence::found)
      .def_readonly("rank", &golden::Divergence::rank)
      .def_readonly("stage", &golden::Divergence::stage)
      .def_readonly("tensor", &golden::Divergence::tensor)
      .def_readonly("index", &golden::Divergence::index)
      .def_readonly("dims", &golden::Divergence::dims)
      .def_readonly("flat", &golden::Divergence::flat)
      .def_property_readonly("named_index", [](const golden::Divergence& d) { return named(d.index, d.dims); })
      .def("__bool__", [](const golden::Divergence& d) { return d.found; });
  pyb::class_<DiffReport>(m, "DiffReport")
      .def_readonly("golden", &DiffReport::golden)
      .def_readonly("dump", &DiffReport::dump)
      .def_readonly("tp", &DiffReport::tp)
      .def_readonly("tokens", &DiffReport::tokens)
      .def_readonly("replayed", &DiffReport::replayed)
      .def_readonly("shared", &DiffReport::shared)
      .def_readonly("stages", &DiffReport::stages)
      .def_readonly("first", &DiffReport::first)
      .def_readonly("tensors_compared", &DiffReport::tensors_compared)
      .def("any_mismatch", &DiffReport::any_mismatch)
      .def("exit_code", &DiffReport::exit_code, pyb::arg("require_all") = false)
      .def("text", [](const DiffReport& r, bool all) { return golden::report_text(r, all); }, pyb::arg("all") = false)
      .def("to_json", &golden::report_json)
      .def("to_html", &tools::html_report)
      .def("__str__", [](const DiffReport& r) { return golden::report_text(r, false); });
  m.def("_diff", &diff, pyb::arg("golden"), pyb::arg("dump"), pyb::arg("max") = 10, pyb::arg("replay") = false);
  m.def("_compare_arrays", &compare_arrays, pyb::arg("expected"), pyb::arg("actual"), pyb::arg("dtype"), pyb::arg("dims"),
        pyb::arg("name"), pyb::arg("max") = 10);
  pyb::class_<DumpWriter>(m, "_DumpWriter")
      .def(pyb::init<std::string, Config, int, bool>(), pyb::arg("path"), pyb::arg("config"), pyb::arg("tokens"),
           pyb::arg("overwrite") = false)
      .def("add", &DumpWriter::add, pyb::arg("path"), pyb::arg("array"), pyb::arg("dtype") = "")
      .def("close", &DumpWriter::close)
      .def("paths", &DumpWriter::paths)
      .def_property_readonly("path", &DumpWriter::path);
}

}  // namespace k4::py
