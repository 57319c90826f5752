// inputs_file.cpp -- the inputs file a user captures (schema.hpp, "an inputs file").
//
//   /                 magic "K4INPUTS", schema_version 2, config (JSON), tp, tokens, q_len
//   /inputs/          seq_lens, block_table, h_in                     (as in a golden)
//   /rank<r>/inputs/  q, index_scores, k_cache, v_cache, k_scale, v_scale   (whole caches)
// A version 1 file has one /inputs/index_scores: every rank reads it (one index head).
// Datasets carry dtype / dims / meaning like a golden's; attribute n_pages on /rank<r>/inputs.
#include <nlohmann/json.hpp>

#include "golden/io/atomic_file.hpp"
#include "golden/io/file_check.hpp"
#include "golden/io/hdf5.hpp"
#include "golden/format/schema.hpp"
#include "reference/model.hpp"

namespace k4::golden {
namespace {

h5::Elem elem_for(DType d) {
  switch (d) {
    case DType::BF16: return h5::Elem::U16;
    case DType::F32: return h5::Elem::U32;
    case DType::I32: return h5::Elem::I32;
    default: return h5::Elem::U8;
  }
}

// A version 1 inputs file's scores, one tensor every rank read.
const TensorSpec kSharedScoresV1 = {"/inputs", "index_scores", DType::F32, "token,score_block", "",
                                    "K1's per-block index score, every rank's (schema version 1)"};

const TensorSpec& spec(const std::string& group, const std::string& name) {
  for (const TensorSpec& s : tensor_specs())
    if (group == s.group && name == s.name) return s;
  throw std::logic_error("schema: no tensor " + group + "/" + name);
}

template <class T>
void put(const h5::Group& g, const TensorSpec& s, const DimSizes& d, const std::vector<T>& v) {
  const std::vector<uint64_t> shape = d.shape(s.dims);
  uint64_t n = 1;
  for (uint64_t x : shape) n *= x;
  if (v.size() != n)
    throw std::invalid_argument("inputs file " + g.file() + ": " + g.child_path(s.name) + " has " +
                                std::to_string(v.size()) + " elements, expected " + std::to_string(n) + " (" +
                                d.dims_of(s.dims) + ")");
  h5::Dataset ds = g.create_dataset(s.name, elem_for(s.dtype), shape);
  ds.write_raw(v.data(), elem_for(s.dtype));
  count_written(v.size() * sizeof(T));  // K4_FAIL_AFTER_BYTES (golden/io/atomic_file.hpp)
  ds.set_attr("dtype", dtype_name(s.dtype));
  ds.set_attr("dims", d.dims_of(s.dims));
  ds.set_attr("meaning", s.meaning);
}

template <class T>
std::vector<T> get(const h5::Group& g, const TensorSpec& s, const DimSizes& d, const std::string& path) {
  const std::string p = g.child_path(s.name);
  const std::vector<uint64_t> want = d.shape(s.dims);
  const std::string expect = std::string("dtype ") + dtype_name(s.dtype) + ", shape " + shape_str(want) + " (" +
                             d.dims_of(s.dims) + ")";
  auto bad = [&](const std::string& m) { throw FormatError("inputs file " + path + ": dataset " + p + " " + m); };
  if (!g.is_dataset(s.name)) bad("is missing (expected " + expect + ")");
  h5::Dataset ds = g.open_dataset(s.name);
  if (!ds.has_attr("dtype") || ds.attr_kind("dtype") != "string") bad("has no dtype attribute (expected " + expect + ")");
  const std::string dt = ds.attr_string("dtype");
  if (dt != dtype_name(s.dtype)) bad("has dtype " + dt + ", expected " + dtype_name(s.dtype));
  h5::Elem e;
  try {
    e = ds.elem();
  } catch (const h5::Error& x) {
    throw FormatError("inputs file " + path + ": " + x.what());
  }
  if (e != elem_for(s.dtype))
    bad(std::string("is stored as ") + h5::elem_name(e) + ", expected " + h5::elem_name(elem_for(s.dtype)) +
        " (raw bits of " + dtype_name(s.dtype) + ")");
  const std::vector<uint64_t> got = ds.shape();
  if (got != want) bad("has shape " + shape_str(got) + ", expected " + expect);
  std::vector<T> v(ds.size());
  ds.read_raw(v.data(), elem_for(s.dtype));
  return v;
}

// Attributes of an inputs file, each named with the file when missing or out of range.
struct Attrs {
  const std::string& path;
  int64_t integer(const h5::Object& o, const std::string& name) const {
    if (!o.has_attr(name) || o.attr_kind(name) != "int")
      throw FormatError("inputs file " + path + ": " + o.path() + ": integer attribute '" + name + "' is missing");
    return o.attr_int(name);
  }
  int ranged(const h5::Object& o, const std::string& name, int64_t lo, int64_t hi) const {
    const int64_t v = integer(o, name);
    if (v < lo || v > hi)
      throw FormatError("inputs file " + path + ": " + o.path() + ": attribute " + name + " = " + std::to_string(v) +
                        " is outside " + std::to_string(lo) + ".." + std::to_string(hi));
    return int(v);
  }
  std::string string(const h5::Object& o, const std::string& name) const {
    if (!o.has_attr(name) || o.attr_kind(name) != "string")
      throw FormatError("inputs file " + path + ": " + o.path() + ": string attribute '" + name + "' is missing");
    return o.attr_string(name);
  }
};

// The model's own check of the inputs (page ids, seq_lens, ...), named with the file.
void validate_named(const StepInputs& in, const Config& cfg, const std::string& what) {
  try {
    validate_inputs(in, cfg);
  } catch (const std::invalid_argument& e) {
    throw FormatError(what + ": " + e.what());
  }
}

}  // namespace

void write_inputs_file(const std::string& path, const Config& cfg, const StepInputs& in, bool overwrite) {
  AtomicOutput out(path, overwrite);
  {
    h5::File f(out.temp_path(), h5::File::Mode::CreateExclusive);
    h5::Group root = f.root();
    root.set_attr("magic", kInputsMagic);
    root.set_attr("schema_version", int64_t(kSchemaVersion));
    root.set_attr("config", config_to_json(cfg));
    root.set_attr("tp", int64_t(cfg.tp));
    root.set_attr("tokens", int64_t(in.shared.tokens));
    root.set_attr("q_len", int64_t(in.shared.q_len));
    DimSizes d;
    d.cfg = cfg;
    d.tokens = in.shared.tokens;
    d.bt_width = in.shared.bt_width;
    d.score_width = in.shared.score_width;
    h5::Group ig = root.create_group("inputs");
    ig.set_attr("bt_width", int64_t(d.bt_width));
    ig.set_attr("score_width", int64_t(d.score_width));
    put(ig, spec("/inputs", "seq_lens"), d, in.shared.seq_lens);
    put(ig, spec("/inputs", "block_table"), d, in.shared.block_table);
    put(ig, spec("/inputs", "h_in"), d, in.shared.h_in);
    if (int(in.ranks.size()) != cfg.tp)
      throw std::invalid_argument("inputs: " + std::to_string(in.ranks.size()) + " ranks, expected tp = " + std::to_string(cfg.tp));
    for (int r = 0; r < cfg.tp; ++r) {
      const StepRank& R = in.ranks[size_t(r)];
      h5::Group g = root.create_group("rank" + std::to_string(r)).create_group("inputs");
      g.set_attr("n_pages", int64_t(R.n_pages));
      d.pages = R.n_pages;
      put(g, spec("split/inputs", "q"), d, R.q);
      put(g, spec("index/inputs", "index_scores"), d, R.index_scores);
      put(g, spec("split/inputs", "k_cache"), d, R.k_cache);
      put(g, spec("split/inputs", "v_cache"), d, R.v_cache);
      put(g, spec("split/inputs", "k_scale"), d, R.k_scale);
      put(g, spec("split/inputs", "v_scale"), d, R.v_scale);
    }
    f.close();
  }
  out.commit();
}

StepInputs read_inputs_file(const std::string& path, Config* cfg_out) {
  try {
    require_input_file(path, "inputs file");
  } catch (const std::invalid_argument& e) {
    throw FormatError(e.what());
  }
  std::string magic;
  {
    h5::File f;
    try {
      f = h5::File(path, h5::File::Mode::ReadOnly);
    } catch (const h5::Error& e) {
      throw FormatError("inputs file " + path + " cannot be opened as HDF5 (" + e.what() + ")");
    }
    h5::Group root = f.root();
    if (!root.has_attr("magic") || root.attr_kind("magic") != "string")
      throw FormatError("inputs file " + path + ": no magic attribute at / (expected " + kInputsMagic + " or " + kMagic + ")");
    magic = root.attr_string("magic");
  }
  if (magic == kMagic) {  // a golden: its inputs
    GoldenReader g(path);
    if (cfg_out) *cfg_out = g.config();
    StepInputs in = g.inputs();
    validate_named(in, g.config(), "golden " + path);
    return in;
  }
  if (magic != kInputsMagic)
    throw FormatError("inputs file " + path + ": magic '" + magic + "', expected " + kInputsMagic + " or " + kMagic);
  try {
    const Attrs A{path};
    h5::File f(path, h5::File::Mode::ReadOnly);
    h5::Group root = f.root();
    const int64_t version = A.integer(root, "schema_version");
    if (version < kOldestSchemaVersion || version > kSchemaVersion)
      throw FormatError("inputs file " + path + " was written by schema version " + std::to_string(version) +
                        "; this tool reads versions " + std::to_string(kOldestSchemaVersion) + ".." +
                        std::to_string(kSchemaVersion));
    const Config cfg = config_from_json(A.string(root, "config"), "inputs file " + path);
    const int64_t tp = A.integer(root, "tp");
    if (tp != cfg.tp)
      throw FormatError("inputs file " + path + ": attribute tp = " + std::to_string(tp) + " but config.tp = " +
                        std::to_string(cfg.tp));
    StepInputs in;
    DimSizes d;
    d.cfg = cfg;
    d.tokens = A.ranged(root, "tokens", 1, cfg.max_tokens);
    in.shared.q_len = A.ranged(root, "q_len", 1, d.tokens);
    if (!root.is_group("inputs")) throw FormatError("inputs file " + path + ": group /inputs is missing");
    h5::Group ig = root.open_group("inputs");
    d.bt_width = A.ranged(ig, "bt_width", 1, cfg.max_blocks());
    d.score_width = A.ranged(ig, "score_width", 1, cfg.max_blocks());
    in.shared.tokens = d.tokens;
    in.shared.bt_width = d.bt_width;
    in.shared.score_width = d.score_width;
    in.shared.seq_lens = get<int32_t>(ig, spec("/inputs", "seq_lens"), d, path);
    in.shared.block_table = get<int32_t>(ig, spec("/inputs", "block_table"), d, path);
    std::vector<float> shared_scores;  // version 1: every rank's
    if (version == 1) shared_scores = get<float>(ig, kSharedScoresV1, d, path);
    in.shared.h_in = get<uint16_t>(ig, spec("/inputs", "h_in"), d, path);
    for (int r = 0; r < cfg.tp; ++r) {
      const std::string rg = "/rank" + std::to_string(r) + "/inputs";
      if (!root.is_group(rg))
        throw FormatError("inputs file " + path + ": group " + rg + " is missing (tp = " + std::to_string(cfg.tp) + ")");
      h5::Group g = root.open_group(rg);
      StepRank R;
      R.n_pages = A.ranged(g, "n_pages", 1, kMaxPages);
      d.pages = R.n_pages;
      R.q = get<uint16_t>(g, spec("split/inputs", "q"), d, path);
      R.index_scores = version == 1 ? shared_scores : get<float>(g, spec("index/inputs", "index_scores"), d, path);
      R.k_cache = get<uint8_t>(g, spec("split/inputs", "k_cache"), d, path);
      R.v_cache = get<uint8_t>(g, spec("split/inputs", "v_cache"), d, path);
      R.k_scale = get<float>(g, spec("split/inputs", "k_scale"), d, path);
      R.v_scale = get<float>(g, spec("split/inputs", "v_scale"), d, path);
      in.ranks.push_back(std::move(R));
    }
    validate_named(in, cfg, "inputs file " + path);
    if (cfg_out) *cfg_out = cfg;
    return in;
  } catch (const h5::Error& e) {
    throw FormatError("inputs file " + path + ": " + e.what());
  }
}

}  // namespace k4::golden
