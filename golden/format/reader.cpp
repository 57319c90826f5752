// reader.cpp -- GoldenReader: validation of a golden file and the per-stage readers.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "golden/io/file_check.hpp"
#include "golden/io/hdf5.hpp"
#include "golden/format/kv_pages.hpp"
#include "golden/format/schema.hpp"
#include "golden/format/weights_file.hpp"
#include "golden/inputs/expert_cache.hpp"

namespace k4::golden {
namespace {


// HDF5 serial is not thread-safe: a reader holds the process's one HDF5 lock (hdf5.hpp, shared
// with the weights file's expert source) around its reads and its expert cache.
std::recursive_mutex& h5_mutex() { return h5::serial_mutex(); }

}  // namespace

struct GoldenReader::Impl {
  std::string path;
  h5::File file;
  h5::Group root;
  Config cfg;
  int tokens = 0, tp = 0, q_len = 1;
  DimSizes base;
  std::vector<DimSizes> rank_dims;

  [[noreturn]] void bad(const std::string& what) const { throw FormatError("golden " + path + ": " + what); }

  std::string full(int rank, const std::string& group, const std::string& name) const {
    if (!group.empty() && group[0] == '/') return group + "/" + name;
    return "/rank" + std::to_string(rank) + "/" + group + "/" + name;
  }

  int64_t int_attr(const h5::Object& o, const std::string& name) const {
    if (!o.has_attr(name) || o.attr_kind(name) != "int")
      bad(o.path() + ": integer attribute '" + name + "' is missing");
    return o.attr_int(name);
  }
  // An integer attribute that sizes something: outside [lo, hi] it is named with the range.
  int ranged_attr(const h5::Object& o, const std::string& name, int64_t lo, int64_t hi) const {
    const int64_t v = int_attr(o, name);
    if (v < lo || v > hi)
      bad(o.path() + ": attribute " + name + " = " + std::to_string(v) + " is outside " + std::to_string(lo) + ".." +
          std::to_string(hi));
    return int(v);
  }
  std::string str_attr(const h5::Object& o, const std::string& name) const {
    if (!o.has_attr(name) || o.attr_kind(name) != "string")
      bad(o.path() + ": string attribute '" + name + "' is missing");
    return o.attr_string(name);
  }

  void check_tensor(int rank, const TensorSpec& spec, const DimSizes& d) const {
    TensorSpec s = spec;
    s.dtype = d.dtype_of(spec);  // the experts' weights: E4M3 under moe.experts = mxfp8
    const std::string p = full(rank, s.group, s.name);
    const std::vector<uint64_t> want = d.shape(s.dims);
    const std::string expect = std::string("dtype ") + dtype_name(s.dtype) + ", shape " + shape_str(want) + " (" +
                               d.dims_of(s.dims) + ")";
    if (!root.exists(p)) bad("dataset " + p + " is missing (expected " + expect + ")");
    if (!root.resolves(p)) bad("dataset " + p + " is a soft link to " + root.soft_target(p) + ", which does not exist");
    if (!root.is_dataset(p)) bad(p + " is not a dataset (expected " + expect + ")");
    h5::Dataset ds = root.open_dataset(p);
    if (!ds.has_attr("dtype")) bad("dataset " + p + " has no dtype attribute (expected " + dtype_name(s.dtype) + ")");
    const std::string dt = ds.attr_string("dtype");
    if (dt != dtype_name(s.dtype)) bad("dataset " + p + " has dtype " + dt + ", expected " + dtype_name(s.dtype));
    h5::Elem e;
    try {
      e = ds.elem();
    } catch (const h5::Error& x) {
      bad(x.what());
    }
    if (e != stored_elem(s.dtype))
      bad("dataset " + p + " is stored as " + h5::elem_name(e) + ", expected " + h5::elem_name(stored_elem(s.dtype)) +
          " (raw bits of " + dtype_name(s.dtype) + ")");
    const std::vector<uint64_t> got = ds.shape();
    if (got != want) bad("dataset " + p + " has shape " + shape_str(got) + ", expected " + expect);
  }

  void open() {
    try {
      require_input_file(path, "golden");
    } catch (const std::invalid_argument& e) {
      throw FormatError(e.what());
    }
    try {
      file = h5::File(path, h5::File::Mode::ReadOnly);
    } catch (const h5::Error& e) {
      throw FormatError("golden " + path + " cannot be opened as HDF5 (" + e.what() + ")");
    }
    root = file.root();
    if (!root.has_attr("magic")) bad("not a K4 golden (no magic attribute at /)");
    const std::string magic = root.attr_kind("magic") == "string" ? root.attr_string("magic") : "?";
    if (magic == kInputsMagic) bad("is an inputs file (magic " + magic + "), not a golden");
    if (magic != kMagic) bad("not a K4 golden (magic '" + magic + "', expected '" + kMagic + "')");
    const int64_t version = int_attr(root, "schema_version");
    if (version < kOldestSchemaVersion || version > kSchemaVersion)
      throw FormatError("golden " + path + " was written by schema version " + std::to_string(version) +
                        "; this tool reads versions " + std::to_string(kOldestSchemaVersion) + ".." +
                        std::to_string(kSchemaVersion) + "; regenerate with `k4 golden ...`");
    cfg = config_from_json(str_attr(root, "config"), "golden " + path);
    const int64_t tp_attr = int_attr(root, "tp");
    if (tp_attr != cfg.tp) bad("attribute tp = " + std::to_string(tp_attr) + " but config.tp = " + std::to_string(cfg.tp));
    tp = cfg.tp;
    tokens = ranged_attr(root, "tokens", 1, cfg.max_tokens);
    if (!root.is_group("inputs")) bad("group /inputs is missing");
    h5::Group ig = root.open_group("inputs");
    q_len = ranged_attr(ig, "q_len", 1, tokens);
    if (tokens % q_len != 0) bad("/inputs: attribute q_len = " + std::to_string(q_len) + " does not divide tokens = " + std::to_string(tokens));
    base.cfg = cfg;
    base.tokens = tokens;
    base.bt_width = ranged_attr(ig, "bt_width", 1, cfg.max_blocks());
    base.score_width = ranged_attr(ig, "score_width", 1, cfg.max_blocks());
    for (const TensorSpec& s : tensor_specs())
      if (s.group[0] == '/') check_tensor(0, s, base);
    for (int r = 0; r < tp; ++r) {
      const std::string rg = "/rank" + std::to_string(r);
      if (!root.is_group(rg)) bad("group " + rg + " is missing (tp = " + std::to_string(tp) + ")");
      for (const std::string& st : stage_names())
        for (const char* io : {"inputs", "outputs"})
          if (!root.is_group(rg + "/" + st + "/" + io)) bad("group " + rg + "/" + st + "/" + io + " is missing");
      DimSizes d = base;
      h5::Group sp = root.open_group(rg + "/split/inputs");
      const std::string form = str_attr(sp, "kv_form");
      if (form != "whole" && form != "selected") bad(rg + "/split/inputs: kv_form '" + form + "' is none of whole, selected");
      const int n_pages = ranged_attr(sp, "n_pages", 1, kMaxPages);
      d.pages = ranged_attr(sp, "n_stored_pages", 0, n_pages);
      if (form == "whole" && n_pages != d.pages) bad(rg + "/split/inputs: whole form but n_stored_pages != n_pages");
      d.used_experts = ranged_attr(root.open_group(rg + "/moe/inputs"), "n_experts", 1, cfg.n_experts());
      for (const TensorSpec& s : tensor_specs()) {
        if (s.group[0] == '/') continue;
        if (std::string(s.name) == "page_ids" && form == "whole") continue;
        if (!spec_present(s, cfg)) continue;
        check_tensor(r, s, d);
      }
      rank_dims.push_back(d);
    }
    check_weights_refs(path, root);  // a golden of `k4 golden --weights-file`: its weights file
  }


  template <class T>
  std::vector<T> get(int rank, const std::string& group, const std::string& name) const {
    std::lock_guard<std::recursive_mutex> lock(h5_mutex());
    const TensorSpec& s = find_spec(group, name);
    static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4, "raw bits");
    if (sizeof(T) != dtype_bytes(s.dtype)) throw std::logic_error("reader: element size of " + group + "/" + name);
    h5::Dataset ds = root.open_dataset(full(rank, group, name));
    std::vector<T> v(ds.size());
    ds.read_raw(v.data(), stored_elem(s.dtype));
    return v;
  }

  void check_rank(int r) const {
    if (r < 0 || r >= tp)
      throw std::invalid_argument("golden " + path + ": rank " + std::to_string(r) + " is outside 0.." +
                                  std::to_string(tp - 1));
  }

  StepShared shared() const {
    StepShared s;
    s.tokens = tokens;
    s.q_len = q_len;
    s.bt_width = base.bt_width;
    s.score_width = base.score_width;
    s.seq_lens = get<int32_t>(0, "/inputs", "seq_lens");
    s.block_table = get<int32_t>(0, "/inputs", "block_table");
    s.h_in = get<uint16_t>(0, "/inputs", "h_in");
    return s;
  }

  // The result fields a group holds (its outputs, or the inputs that link to another stage's
  // outputs), each read from the group: the rest of the RankResult stays empty.
  RankResult read_fields(int r, const std::string& group) const {
    RankResult R;
    for (const TensorSpec* s : specs_of(group))
      if (const TensorSpec* t = result_spec(*s))
        with_field(*t, R, [&](auto& v) { v = get<typename std::decay_t<decltype(v)>::value_type>(r, group, s->name); });
    return R;
  }
  // Every stage's outputs.
  RankResult outputs(int r) const {
    RankResult R;
    for (const TensorSpec& s : tensor_specs())
      if (s.field)
        with_field(s, R, [&](auto& v) { v = get<typename std::decay_t<decltype(v)>::value_type>(r, s.group, s.name); });
    return R;
  }

  StepRank rank_inputs(int r) const {
    StepRank R;
    R.q = get<uint16_t>(r, "split/inputs", "q");
    R.index_scores = get<float>(r, "index/inputs", "index_scores");
    std::string form;
    int64_t n_pages;
    {
      std::lock_guard<std::recursive_mutex> lock(h5_mutex());
      h5::Group sp = root.open_group("/rank" + std::to_string(r) + "/split/inputs");
      form = sp.attr_string("kv_form");
      n_pages = sp.attr_int("n_pages");
    }
    R.n_pages = int(n_pages);
    std::vector<uint8_t> k = get<uint8_t>(r, "split/inputs", "k_cache");
    std::vector<uint8_t> v = get<uint8_t>(r, "split/inputs", "v_cache");
    std::vector<float> ks = get<float>(r, "split/inputs", "k_scale");
    std::vector<float> vs = get<float>(r, "split/inputs", "v_scale");
    if (form == "whole") {
      R.k_cache = std::move(k);
      R.v_cache = std::move(v);
      R.k_scale = std::move(ks);
      R.v_scale = std::move(vs);
      return R;
    }
    // Selected form: rebuild the caches at full size, zero where nothing was stored.
    const std::vector<int32_t> ids = get<int32_t>(r, "split/inputs", "page_ids");
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= n_pages)
        bad("/rank" + std::to_string(r) + "/split/inputs/page_ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
            " is outside the cache of " + std::to_string(n_pages) + " pages");
    expand_selected_kv(R, int(n_pages), ids, k, v, ks, vs, cfg);
    return R;
  }

  RankWeights rank_weights(int r) const {
    RankWeights w;
    w.w_o = get<uint8_t>(r, "oproj/inputs", "w_o");
    w.s_o = get<float>(r, "oproj/inputs", "s_o");
    w.g_post = get<uint16_t>(r, "router/inputs", "g_post");
    w.w_gate = get<uint16_t>(r, "router/inputs", "w_gate");
    if (cfg.variant.router_gate == RouterGate::f32) w.w_gate_f32 = get<float>(r, "router/inputs", "w_gate_f32");
    w.bias = get<float>(r, "router/inputs", "bias");
    return w;
  }
};

namespace {

// The experts a golden stores, read on demand (one hyperslab a tensor), cached.
class StoredExpertSource : public ExpertSource {
 public:
  explicit StoredExpertSource(std::shared_ptr<const GoldenReader::Impl> p) : p_(std::move(p)) {
    for (int r = 0; r < p_->tp; ++r) ids_.push_back(p_->get<int32_t>(r, "moe/inputs", "expert_ids"));
  }
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    p_->check_rank(rank);
    const std::vector<int32_t>& ids = ids_[size_t(rank)];
    // moe.shared_fp8: the MXFP8 shared expert is sh_w13 .. sh_s2, the stacked tables the routed
    const bool sh8 = p_->cfg.variant.shared_fp8 && e == p_->cfg.shared_expert();
    auto it = std::lower_bound(ids.begin(), ids.end(), e);
    if (!sh8 && (it == ids.end() || *it != e))
      throw std::invalid_argument("golden " + p_->path + ": expert " + std::to_string(e) + " of rank " +
                                  std::to_string(rank) + " is not stored (a golden holds only the experts routed to)");
    const size_t i = sh8 ? 0 : size_t(it - ids.begin());
    const std::string pre = sh8 ? "sh_" : "";
    return cache_.get(rank, e, [&] {
      std::lock_guard<std::recursive_mutex> lock(h5_mutex());
      auto ew = std::make_shared<ExpertWeights>();
      const std::string g = "/rank" + std::to_string(rank) + "/moe/inputs/";
      auto read = [&](const char* name, std::vector<uint8_t>& v) {
        h5::Dataset d = p_->root.open_dataset(g + name);
        const std::vector<uint64_t> sh = d.shape();
        v.resize(sh[1] * sh[2]);
        d.read_rows(i, 1, v.data(), h5::Elem::U8);
      };
      read((pre + "w13").c_str(), ew->w13);
      read((pre + "s13").c_str(), ew->s13);
      read((pre + "w2").c_str(), ew->w2);
      read((pre + "s2").c_str(), ew->s2);
      return ew;
    });
  }

 private:
  std::shared_ptr<const GoldenReader::Impl> p_;
  std::vector<std::vector<int32_t>> ids_;
  ExpertCache cache_{32};
};

}  // namespace

GoldenReader::GoldenReader(const std::string& path) : p_(std::make_shared<Impl>()) {
  p_->path = path;
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());  // open: validation and check_weights_refs
  try {
    p_->open();
  } catch (const h5::Error& e) {
    throw FormatError(std::string("golden ") + path + ": " + e.what());
  }
}
GoldenReader::~GoldenReader() = default;
GoldenReader::GoldenReader(GoldenReader&&) noexcept = default;

const std::string& GoldenReader::path() const { return p_->path; }
const Config& GoldenReader::config() const { return p_->cfg; }
int GoldenReader::tp() const { return p_->tp; }
int GoldenReader::tokens() const { return p_->tokens; }
std::string GoldenReader::root_attr(const std::string& name) const {
  std::lock_guard<std::recursive_mutex> lock(h5_mutex());
  return p_->str_attr(p_->root, name);
}

IndexStage GoldenReader::index(int r) const {
  p_->check_rank(r);
  return IndexStage{p_->shared(), p_->get<float>(r, "index/inputs", "index_scores"), p_->read_fields(r, "index/outputs").index};
}

SplitStage GoldenReader::split(int r) const {
  p_->check_rank(r);
  SplitStage s;
  s.shared = p_->shared();
  s.rank = p_->rank_inputs(r);
  s.index = p_->read_fields(r, "index/outputs").index;
  s.out = p_->read_fields(r, "split/outputs").split;
  return s;
}

MergeStage GoldenReader::merge(int r) const {
  p_->check_rank(r);
  MergeStage s;
  s.tokens = p_->tokens;
  s.in = p_->read_fields(r, "merge/inputs").split;
  s.out = p_->read_fields(r, "merge/outputs").merge;
  return s;
}

OprojStage GoldenReader::oproj(int r) const {
  p_->check_rank(r);
  OprojStage s;
  s.tokens = p_->tokens;
  s.in = p_->read_fields(r, "oproj/inputs").merge;
  s.w.w_o = p_->get<uint8_t>(r, "oproj/inputs", "w_o");
  s.w.s_o = p_->get<float>(r, "oproj/inputs", "s_o");
  s.h_in = p_->get<uint16_t>(r, "oproj/inputs", "h_in");
  RankResult o = p_->read_fields(r, "oproj/outputs");
  s.out = std::move(o.oproj);
  for (int j = 0; j < p_->tp; ++j) s.rank_partials.push_back(p_->get<uint16_t>(j, "oproj/outputs", "partial"));
  s.a = std::move(o.a);
  s.h_mid = std::move(o.h_mid);
  return s;
}

RouterStage GoldenReader::router(int r) const {
  p_->check_rank(r);
  RouterStage s;
  s.tokens = p_->tokens;
  s.a = p_->read_fields(r, "router/inputs").a;
  s.h_in = p_->get<uint16_t>(r, "router/inputs", "h_in");
  s.w.g_post = p_->get<uint16_t>(r, "router/inputs", "g_post");
  s.w.w_gate = p_->get<uint16_t>(r, "router/inputs", "w_gate");
  if (p_->cfg.variant.router_gate == RouterGate::f32) s.w.w_gate_f32 = p_->get<float>(r, "router/inputs", "w_gate_f32");
  s.w.bias = p_->get<float>(r, "router/inputs", "bias");
  s.out = p_->read_fields(r, "router/outputs").router;
  return s;
}

MoeStage GoldenReader::moe(int r) const {
  p_->check_rank(r);
  MoeStage s;
  s.tokens = p_->tokens;
  s.in = p_->read_fields(r, "moe/inputs").router;
  s.expert_ids = p_->get<int32_t>(r, "moe/inputs", "expert_ids");
  s.experts = std::make_shared<StoredExpertSource>(p_);
  RankResult o = p_->read_fields(r, "moe/outputs");
  s.route = std::move(o.route);
  s.route.live = moe_live();  // V2: the rows that join the wide experts
  s.out = std::move(o.moe);
  for (int j = 0; j < p_->tp; ++j) s.rank_partials.push_back(p_->get<uint16_t>(j, "moe/outputs", "partial"));
  s.ar_out = std::move(o.ar_out);
  return s;
}

std::vector<uint8_t> GoldenReader::moe_live() const {
  return live_rows(p_->cfg, p_->get<int32_t>(0, "/inputs", "seq_lens"));
}

StepInputs GoldenReader::inputs() const {
  StepInputs in;
  in.shared = p_->shared();
  for (int r = 0; r < p_->tp; ++r) in.ranks.push_back(p_->rank_inputs(r));
  return in;
}

RankResult GoldenReader::rank_result(int r) const {
  p_->check_rank(r);
  RankResult R = p_->outputs(r);
  R.route.live = moe_live();
  return R;
}

StepResult GoldenReader::result() const {
  StepResult res;
  for (int r = 0; r < p_->tp; ++r) res.ranks.push_back(rank_result(r));
  return res;
}

LayerWeights GoldenReader::weights() const {
  LayerWeights w;
  w.cfg = p_->cfg;
  for (int r = 0; r < p_->tp; ++r) w.ranks.push_back(p_->rank_weights(r));
  w.experts = std::make_shared<StoredExpertSource>(p_);
  return w;
}

}  // namespace k4::golden
