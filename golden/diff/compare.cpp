// compare.cpp -- element values and distances, the tensor diff, DumpReader and diff_files
// (compare.hpp). Replay: replay.cpp; text and JSON: report.cpp; write_dump: golden/format/dump_writer.cpp.
#include "golden/diff/compare.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "golden/format/weights_file.hpp"
#include "golden/io/atomic_file.hpp"
#include "golden/io/file_check.hpp"
#include "golden/io/hdf5.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/e8m0.hpp"

namespace k4::golden {

// ---- values ----------------------------------------------------------------------------

bool is_float(DType d) { return d != DType::I32 && d != DType::U8; }

bool is_nan_bits(DType d, uint32_t b) {
  switch (d) {
    case DType::BF16: return (b & 0x7FFFu) > 0x7F80u;
    case DType::F32: return (b & 0x7FFFFFFFu) > 0x7F800000u;
    case DType::E4M3: return e4m3_is_nan(uint8_t(b));
    case DType::E8M0: return e8m0_is_nan(uint8_t(b));
    default: return false;  // E2M1 has no NaN; integers none
  }
}

namespace {

// Sign-magnitude bits of `width` bits -> signed order.
int64_t sign_magnitude(uint32_t b, int width) {
  const uint32_t sign = 1u << (width - 1);
  const int64_t mag = int64_t(b & (sign - 1));
  return (b & sign) ? -mag : mag;
}

}  // namespace

int64_t ordered_bits(DType d, uint32_t b) {
  switch (d) {
    case DType::BF16: return sign_magnitude(b & 0xFFFFu, 16);
    case DType::F32: return sign_magnitude(b, 32);
    case DType::E4M3: return sign_magnitude(b & 0xFFu, 8);
    case DType::E8M0: return int64_t(b & 0xFFu);
    case DType::E2M1X2: return sign_magnitude(b & 0xFu, 4);  // the low nibble
    case DType::I32: return int64_t(int32_t(b));
    case DType::U8: return int64_t(b & 0xFFu);
  }
  return 0;
}

Distance distance(DType d, uint32_t a, uint32_t b) {
  Distance r;
  if (!is_float(d)) {
    r.kind = Distance::Kind::Int;
    r.n = std::llabs(ordered_bits(d, a) - ordered_bits(d, b));
    return r;
  }
  const bool na = is_nan_bits(d, a), nb = is_nan_bits(d, b);
  if (na || nb) {
    r.kind = (na && nb) ? Distance::Kind::NanVsNan : Distance::Kind::NanVsNumber;
    return r;
  }
  if (d == DType::E2M1X2) {  // two elements a byte: the larger of the two distances
    const int64_t lo = std::llabs(sign_magnitude(a & 0xFu, 4) - sign_magnitude(b & 0xFu, 4));
    const int64_t hi = std::llabs(sign_magnitude((a >> 4) & 0xFu, 4) - sign_magnitude((b >> 4) & 0xFu, 4));
    r.n = std::max(lo, hi);
    return r;
  }
  r.n = std::llabs(ordered_bits(d, a) - ordered_bits(d, b));
  return r;
}

std::string Distance::str() const {
  switch (kind) {
    case Kind::Ulp: return n == 0 ? "0 ulp (-0 vs +0)" : std::to_string(n) + " ulp";
    case Kind::Int: return "delta " + std::to_string(n);
    case Kind::NanVsNumber: return "NaN vs number";
    case Kind::NanVsNan: return "NaN bits differ";
  }
  return "?";
}

std::string bits_hex(DType d, uint32_t b) {
  char buf[16];
  switch (dtype_bytes(d)) {
    case 2: std::snprintf(buf, sizeof buf, "0x%04x", b & 0xFFFFu); break;
    case 4: std::snprintf(buf, sizeof buf, "0x%08x", b); break;
    default: std::snprintf(buf, sizeof buf, "0x%02x", b & 0xFFu); break;
  }
  return buf;
}

double value_of(DType d, uint32_t b) {
  switch (d) {
    case DType::BF16: return bf16_to_f32(uint16_t(b));
    case DType::F32: return f32_from_bits(b);
    case DType::I32: return double(int32_t(b));
    case DType::U8: return double(b & 0xFFu);
    case DType::E4M3: return e4m3_to_f32(uint8_t(b));
    case DType::E8M0: return e8m0_to_f32(uint8_t(b));
    case DType::E2M1X2: return e2m1_to_f32(fp4_lo(uint8_t(b)));
  }
  return 0;
}

namespace {

std::string float_text(double v, int digits) {
  if (std::isnan(v)) return std::signbit(v) ? "-nan" : "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  if (v == 0) return std::signbit(v) ? "-0" : "0";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

}  // namespace

std::string value_text(DType d, uint32_t b) {
  switch (d) {
    case DType::I32: return std::to_string(int32_t(b));
    case DType::U8: return std::to_string(b & 0xFFu);
    case DType::F32: return float_text(f32_from_bits(b), 9);
    case DType::E2M1X2:
      return "(" + float_text(e2m1_to_f32(fp4_lo(uint8_t(b))), 3) + ", " + float_text(e2m1_to_f32(fp4_hi(uint8_t(b))), 3) + ")";
    default: return float_text(value_of(d, b), 6);
  }
}

// ---- tensors ---------------------------------------------------------------------------

std::vector<std::string> split_dims(const std::string& dims) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= dims.size()) {
    size_t j = dims.find(',', i);
    if (j == std::string::npos) j = dims.size();
    if (j > i) out.push_back(dims.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

std::vector<uint64_t> unflatten(uint64_t flat, const std::vector<uint64_t>& shape) {
  std::vector<uint64_t> idx(shape.size(), 0);
  for (size_t k = shape.size(); k-- > 0;) {
    const uint64_t n = std::max<uint64_t>(shape[k], 1);
    idx[k] = flat % n;
    flat /= n;
  }
  return idx;
}

std::string index_text(const std::vector<uint64_t>& index, const std::vector<std::string>& dims) {
  std::string s = "[";
  for (size_t k = 0; k < index.size(); ++k) {
    if (k) s += ", ";
    if (k < dims.size()) s += dims[k] + " ";
    s += std::to_string(index[k]);
  }
  return s + "]";
}

template <class T>
RawTensor raw_tensor(DType d, const std::vector<std::string>& dims, const std::vector<uint64_t>& shape,
                     const std::vector<T>& v) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4, "raw bits");
  RawTensor t;
  t.dtype = d;
  t.dims = dims;
  t.shape = shape;
  t.bits.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (sizeof(T) == 4) {
      uint32_t u;
      std::memcpy(&u, &v[i], 4);
      t.bits[i] = u;
    } else {
      t.bits[i] = uint32_t(v[i]);
    }
  }
  return t;
}

template <class T>
std::vector<T> typed(const RawTensor& t) {
  std::vector<T> v(t.bits.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (sizeof(T) == 4) {
      std::memcpy(&v[i], &t.bits[i], 4);
    } else {
      v[i] = T(t.bits[i]);
    }
  }
  return v;
}

template RawTensor raw_tensor(DType, const std::vector<std::string>&, const std::vector<uint64_t>&, const std::vector<uint8_t>&);
template RawTensor raw_tensor(DType, const std::vector<std::string>&, const std::vector<uint64_t>&, const std::vector<uint16_t>&);
template RawTensor raw_tensor(DType, const std::vector<std::string>&, const std::vector<uint64_t>&, const std::vector<int32_t>&);
template RawTensor raw_tensor(DType, const std::vector<std::string>&, const std::vector<uint64_t>&, const std::vector<float>&);
template std::vector<uint8_t> typed(const RawTensor&);
template std::vector<uint16_t> typed(const RawTensor&);
template std::vector<int32_t> typed(const RawTensor&);
template std::vector<float> typed(const RawTensor&);

std::string hist_label(int k) {
  if (k == 0) return "0";
  if (k == 1) return "1";
  const uint64_t lo = uint64_t(1) << (k - 1), hi = (uint64_t(1) << k) - 1;
  if (k <= 8) return std::to_string(lo) + "-" + std::to_string(hi);
  return "2^" + std::to_string(k - 1) + (k >= kHistBuckets - 1 ? "+" : "");  // [2^(k-1), 2^k)
}

const char* status_name(TensorDiff::Status s) {
  switch (s) {
    case TensorDiff::Status::Match: return "match";
    case TensorDiff::Status::Mismatch: return "mismatch";
    case TensorDiff::Status::Missing: return "missing";
    case TensorDiff::Status::ShapeDiffers: return "shape differs";
    case TensorDiff::Status::DtypeDiffers: return "dtype differs";
  }
  return "?";
}

namespace {

int hist_bucket(int64_t n) {
  if (n <= 0) return 0;
  int k = 1;
  while (k < kHistBuckets - 1 && (n >> k) != 0) ++k;
  return k;
}

}  // namespace

void diff_tensor(TensorDiff& out, const RawTensor& ref, const RawTensor& got, size_t max_list) {
  if (ref.bits.size() != got.bits.size() || ref.dtype != got.dtype)
    throw std::logic_error("diff_tensor: " + out.path + ": the two sides differ in dtype or size");
  out.dtype = ref.dtype;
  out.dims = ref.dims;
  out.shape = ref.shape;
  out.elements = ref.bits.size();
  out.mismatches = 0;
  out.first.clear();
  out.where.clear();
  out.where_capped = false;
  out.hist.assign(kHistBuckets, 0);
  out.nan_vs_number = out.nan_vs_nan = 0;
  const uint32_t mask = dtype_bytes(ref.dtype) == 4 ? 0xFFFFFFFFu : dtype_bytes(ref.dtype) == 2 ? 0xFFFFu : 0xFFu;
  for (uint64_t i = 0; i < out.elements; ++i) {
    const uint32_t a = ref.bits[i] & mask, b = got.bits[i] & mask;
    if (a == b) continue;
    ++out.mismatches;
    const Distance d = distance(ref.dtype, a, b);
    if (d.kind == Distance::Kind::NanVsNumber) ++out.nan_vs_number;
    else if (d.kind == Distance::Kind::NanVsNan) ++out.nan_vs_nan;
    else ++out.hist[hist_bucket(d.n)];
    if (out.where.size() < kWhereCap) out.where.push_back(i);
    else out.where_capped = true;
    if (out.first.size() < max_list) out.first.push_back(Mismatch{i, unflatten(i, ref.shape), a, b, d});
  }
  out.status = out.mismatches ? TensorDiff::Status::Mismatch : TensorDiff::Status::Match;
}

// ---- DumpReader ------------------------------------------------------------------------

namespace {


}  // namespace

struct DumpReader::Impl {
  std::string path, what;
  h5::File file;
  h5::Group root;
};

DumpReader::DumpReader(const std::string& path, const std::string& what) : p_(std::make_unique<Impl>()) {
  p_->path = path;
  p_->what = what;
  auto bad = [&](const std::string& m) { throw FormatError(what + " " + path + ": " + m); };
  try {
    require_input_file(path, what);
  } catch (const std::invalid_argument& e) {
    throw FormatError(e.what());
  }
  try {
    p_->file = h5::File(path, h5::File::Mode::ReadOnly);
  } catch (const h5::Error& e) {
    bad(std::string("cannot be opened as HDF5 (") + e.what() + ")");
  }
  p_->root = p_->file.root();
  const h5::Group& r = p_->root;
  if (!r.has_attr("magic") || r.attr_kind("magic") != "string") bad("not a K4 golden or dump (no magic attribute at /)");
  const std::string magic = r.attr_string("magic");
  if (magic == kInputsMagic) bad("is an inputs file (magic " + magic + "), not a golden or dump");
  if (magic != kMagic) bad("not a K4 golden or dump (magic '" + magic + "', expected '" + kMagic + "')");
  if (!r.has_attr("schema_version") || r.attr_kind("schema_version") != "int") bad("integer attribute schema_version is missing at /");
  const int64_t v = r.attr_int("schema_version");
  if (v < kOldestSchemaVersion || v > kSchemaVersion)
    bad("was written in schema version " + std::to_string(v) + "; this tool reads versions " +
        std::to_string(kOldestSchemaVersion) + ".." + std::to_string(kSchemaVersion) +
        " (regenerate it with this tool's `k4 golden`, or rebuild the kernel runner)");
  try {
    check_weights_refs(path, r);  // `k4 golden --weights-file`: the weights file there and unchanged
  } catch (const h5::Error& e) {
    bad(e.what());
  }
}
DumpReader::~DumpReader() = default;
DumpReader::DumpReader(DumpReader&&) noexcept = default;

const std::string& DumpReader::path() const { return p_->path; }
bool DumpReader::has_group(const std::string& path) const { return p_->root.exists(path) && p_->root.resolves(path) && p_->root.is_group(path); }
bool DumpReader::has_root_attr(const std::string& name) const { return p_->root.has_attr(name); }
std::string DumpReader::root_attr_string(const std::string& name) const {
  if (!p_->root.has_attr(name) || p_->root.attr_kind(name) != "string")
    throw FormatError(p_->what + " " + p_->path + ": string attribute '" + name + "' is missing at /");
  return p_->root.attr_string(name);
}
int64_t DumpReader::root_attr_int(const std::string& name) const {
  if (!p_->root.has_attr(name) || p_->root.attr_kind(name) != "int")
    throw FormatError(p_->what + " " + p_->path + ": integer attribute '" + name + "' is missing at /");
  return p_->root.attr_int(name);
}
bool DumpReader::has_dataset(const std::string& path) const {
  return p_->root.exists(path) && p_->root.resolves(path) && p_->root.is_dataset(path);
}
bool DumpReader::stores(const std::string& path) const { return has_dataset(path) && p_->root.soft_target(path).empty(); }

TensorDiff::Status DumpReader::read(const std::string& path, DType want, const std::vector<uint64_t>& shape,
                                    RawTensor& out, std::string& why) const {
  const h5::Group& r = p_->root;
  if (!r.exists(path)) {
    why = "not in the " + p_->what;
    return TensorDiff::Status::Missing;
  }
  if (!r.resolves(path)) {
    why = "a soft link to " + r.soft_target(path) + ", which is not in the " + p_->what;
    return TensorDiff::Status::Missing;
  }
  if (!r.is_dataset(path)) {
    why = "not a dataset in the " + p_->what;
    return TensorDiff::Status::Missing;
  }
  h5::Dataset ds = r.open_dataset(path);
  const std::string dt = ds.has_attr("dtype") && ds.attr_kind("dtype") == "string" ? ds.attr_string("dtype") : "";
  if (dt != dtype_name(want)) {
    why = "the " + p_->what + "'s dtype is " + (dt.empty() ? std::string("not given") : dt) + ", expected " + dtype_name(want);
    return TensorDiff::Status::DtypeDiffers;
  }
  h5::Elem e;
  try {
    e = ds.elem();
  } catch (const h5::Error&) {
    why = "the " + p_->what + " stores it in a type that is not a raw-bit integer";
    return TensorDiff::Status::DtypeDiffers;
  }
  if (e != stored_elem(want)) {
    why = std::string("the ") + p_->what + " stores it as " + h5::elem_name(e) + ", expected " + h5::elem_name(stored_elem(want));
    return TensorDiff::Status::DtypeDiffers;
  }
  const std::vector<uint64_t> got = ds.shape();
  if (!shape.empty() && got != shape) {
    why = "the " + p_->what + "'s shape is " + shape_str(got) + ", expected " + shape_str(shape);
    return TensorDiff::Status::ShapeDiffers;
  }
  out.dtype = want;
  out.shape = got;
  out.dims = ds.has_attr("dims") && ds.attr_kind("dims") == "string" ? split_dims(ds.attr_string("dims")) : std::vector<std::string>{};
  const size_t n = size_t(ds.size());
  out.bits.assign(n, 0);
  switch (dtype_bytes(want)) {
    case 4: ds.read_raw(out.bits.data(), stored_elem(want)); break;
    case 2: {
      std::vector<uint16_t> v(n);
      ds.read_raw(v.data(), h5::Elem::U16);
      for (size_t i = 0; i < n; ++i) out.bits[i] = v[i];
      break;
    }
    default: {
      std::vector<uint8_t> v(n);
      ds.read_raw(v.data(), h5::Elem::U8);
      for (size_t i = 0; i < n; ++i) out.bits[i] = v[i];
      break;
    }
  }
  return TensorDiff::Status::Match;
}

// ---- the file diff ---------------------------------------------------------------------

const char* stage_status_name(StageDiff::Status s) {
  switch (s) {
    case StageDiff::Status::Match: return "match";
    case StageDiff::Status::Mismatch: return "mismatch";
    case StageDiff::Status::Incomplete: return "incomplete";
    case StageDiff::Status::Missing: return "missing";
  }
  return "?";
}

const char* verdict_text(Verdict v) {
  switch (v) {
    case Verdict::None: return "-";
    case Verdict::Match: return "match";
    case Verdict::Inherited: return "inherited a bad input";
    case Verdict::Own: return "this stage is wrong";
    case Verdict::NotReplayed: return "not replayed";
  }
  return "?";
}

uint64_t StageDiff::mismatches() const {
  uint64_t n = 0;
  for (const TensorDiff& t : tensors) n += t.mismatches;
  return n;
}

bool DiffReport::any_mismatch() const {
  auto bad = [](const TensorDiff& t) {
    return t.status == TensorDiff::Status::Mismatch || t.status == TensorDiff::Status::ShapeDiffers ||
           t.status == TensorDiff::Status::DtypeDiffers;
  };
  for (const TensorDiff& t : shared)
    if (bad(t)) return true;
  for (const StageDiff& s : stages)
    for (const TensorDiff& t : s.tensors)
      if (bad(t)) return true;
  return false;
}

int DiffReport::exit_code(bool require_all) const {
  if (any_mismatch()) return 1;
  if (require_all && !not_compared.empty()) return 1;
  return 0;
}

namespace {

std::string rank_path(int r) { return "/rank" + std::to_string(r); }

// The golden side of one tensor (the golden was validated: it is there).
RawTensor golden_tensor(const DumpReader& g, const std::string& path, DType d) {
  RawTensor t;
  std::string why;
  if (g.read(path, d, {}, t, why) != TensorDiff::Status::Match)
    throw FormatError("golden " + g.path() + ": " + path + ": " + why);
  return t;
}

// Compares one dataset; returns false when the dump does not hold it.
TensorDiff compare_one(const DumpReader& g, const DumpReader& d, const std::string& path, const std::string& group,
                       const TensorSpec& s, size_t max_list) {
  TensorDiff td;
  td.name = s.name;
  td.group = group;
  td.path = path;
  DType dt = s.dtype;  // the experts' weights are E4M3 under moe.experts = mxfp8
  if (std::string(s.dims).rfind("expert_", 0) == 0)
    dt = spec_dtype(s, config_from_json(g.root_attr_string("config"), "golden " + g.path()));
  const RawTensor ref = golden_tensor(g, path, dt);
  td.dtype = ref.dtype;
  td.dims = ref.dims;
  td.shape = ref.shape;
  td.elements = ref.elements();
  RawTensor got;
  td.status = d.read(path, dt, ref.shape, got, td.why);
  if (td.status != TensorDiff::Status::Match) return td;
  got.dims = ref.dims;
  diff_tensor(td, ref, got, max_list);
  return td;
}

void check_dump_matches_golden(const DumpReader& d, const GoldenReader& gr) {
  auto bad = [&](const std::string& m) { throw FormatError("dump " + d.path() + ": " + m + " (golden " + gr.path() + ")"); };
  // write_dump always writes config, tp and tokens: without them a dump cannot be checked
  // to belong to this golden (root_attr_* name the attribute that is missing).
  const Config dc = config_from_json(d.root_attr_string("config"), "dump " + d.path());
  // a build's bits are compared with a golden of the same build only (reference/variant.hpp)
  if (dc.variant != gr.config().variant)
    bad("it is of variant " + variant_name(dc.variant) + ", the golden of variant " + variant_name(gr.config().variant) +
        ": a kernel's dump is compared with a golden of its own variant (k4 golden --variant " + variant_name(dc.variant) + ")");
  if (config_to_json(dc) != config_to_json(gr.config()))
    bad("its config differs from the golden's: " + config_to_json(dc) + " vs " + config_to_json(gr.config()));
  if (d.root_attr_int("tp") != gr.tp())
    bad("tp = " + std::to_string(d.root_attr_int("tp")) + ", the golden's is " + std::to_string(gr.tp()));
  if (d.root_attr_int("tokens") != gr.tokens())
    bad("tokens = " + std::to_string(d.root_attr_int("tokens")) + ", the golden's is " + std::to_string(gr.tokens()));
}

void note_first(Divergence& f, int rank, const std::string& stage, const TensorDiff& t) {
  if (f.found || t.status != TensorDiff::Status::Mismatch || t.first.empty()) return;
  f.found = true;
  f.rank = rank;
  f.stage = stage;
  f.tensor = t.name;
  f.index = t.first.front().index;
  f.dims = t.dims;
  f.flat = t.first.front().flat;
}

void stage_diff(StageDiff& sd, DiffReport& rep, const DumpReader& g, const DumpReader& d, size_t max_list) {
  const std::string rp = rank_path(sd.rank);
  if (!d.has_group(rp)) {
    sd.status = StageDiff::Status::Missing;
    sd.why = "rank " + std::to_string(sd.rank) + " is not in the dump";
    rep.not_compared.push_back({sd.rank, sd.stage, "", sd.why});
    return;
  }
  if (!d.has_group(rp + "/" + sd.stage)) {
    sd.status = StageDiff::Status::Missing;
    sd.why = "stage " + sd.stage + " of rank " + std::to_string(sd.rank) + " is not in the dump";
    rep.not_compared.push_back({sd.rank, sd.stage, "", sd.why});
    return;
  }
  bool incomplete = false;
  for (const char* io : {"inputs", "outputs"}) {
    const std::string group = sd.stage + "/" + io;
    for (const TensorSpec& s : tensor_specs()) {
      if (group != s.group) continue;
      const std::string path = rp + "/" + group + "/" + s.name;
      if (!g.has_dataset(path)) continue;  // page_ids of the whole form
      // Inputs: only the copies the dump stores (a soft link is compared at its target).
      if (std::string(io) == "inputs" && !d.stores(path)) continue;
      TensorDiff td = compare_one(g, d, path, group, s, max_list);
      if (!td.compared()) {
        incomplete = true;
        rep.not_compared.push_back({sd.rank, sd.stage, group + "/" + s.name, td.why});
      } else {
        ++rep.tensors_compared;
      }
      sd.tensors.push_back(std::move(td));
    }
  }
  sd.status = sd.mismatches() || std::any_of(sd.tensors.begin(), sd.tensors.end(), [](const TensorDiff& t) {
                return t.status == TensorDiff::Status::ShapeDiffers || t.status == TensorDiff::Status::DtypeDiffers;
              })
                  ? StageDiff::Status::Mismatch
              : incomplete ? StageDiff::Status::Incomplete
                           : StageDiff::Status::Match;
}

}  // namespace

namespace {

DiffReport diff_files_unchecked(const std::string& golden_path, const std::string& dump_path, const DiffOptions& opt) {
  DumpReader g(golden_path, "golden");
  const GoldenReader gr(golden_path);  // validates the golden completely
  DumpReader d(dump_path, "dump");
  check_dump_matches_golden(d, gr);
  DiffReport rep;
  rep.golden = golden_path;
  rep.dump = dump_path;
  rep.config_name = gr.config().name;
  rep.tp = gr.tp();
  rep.tokens = gr.tokens();
  rep.max_list = opt.max_list;
  for (const TensorSpec& s : tensor_specs()) {
    if (s.group[0] != '/') continue;
    const std::string path = std::string(s.group) + "/" + s.name;
    if (!d.stores(path)) continue;
    TensorDiff td = compare_one(g, d, path, s.group, s, opt.max_list);
    if (td.compared()) ++rep.tensors_compared;
    else rep.not_compared.push_back({-1, "inputs", path, td.why});
    note_first(rep.first, -1, "inputs", td);
    rep.shared.push_back(std::move(td));
  }
  for (const std::string& st : stage_names())
    for (int r = 0; r < rep.tp; ++r) {
      StageDiff sd;
      sd.stage = st;
      sd.rank = r;
      stage_diff(sd, rep, g, d, opt.max_list);
      for (const TensorDiff& t : sd.tensors) note_first(rep.first, r, st, t);
      rep.stages.push_back(std::move(sd));
    }
  if (rep.tensors_compared == 0 && !rep.any_mismatch())
    throw FormatError("dump " + dump_path + " holds no tensor of the golden schema that could be compared (" +
                      std::to_string(rep.not_compared.size()) + " not compared; is it a dump of this golden?)");
  if (opt.replay) replay_stages(rep, golden_path, g, d);
  return rep;
}

}  // namespace

DiffReport diff_files(const std::string& golden_path, const std::string& dump_path, const DiffOptions& opt) {
  try {
    return diff_files_unchecked(golden_path, dump_path, opt);
  } catch (const h5::Error& e) {  // a file HDF5 cannot read as the schema says: unusable input
    throw FormatError(std::string("diff of ") + dump_path + " against " + golden_path + ": " + e.what());
  }
}

}  // namespace k4::golden
