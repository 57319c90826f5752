// compare.hpp -- bit comparison of a kernel's dump with a golden, stage by stage, and the
// replay that tells a stage's own fault from an inherited one (k4 diff, k4 replay).
//
// A dump is a file in the golden schema (magic K4GOLDEN, schema_version 1, the same groups
// and datasets) that may hold only some ranks, stages and tensors. diff_files compares,
// for every stage in pipeline order (index, split, merge, oproj, router, moe) and every
// rank, each output the dump holds (and each stored input it holds a copy of) with the
// golden's, bit for bit: a count of mismatching elements a tensor, the first N of them with
// their index in the tensor's named dimensions, both sides' bits and decoded values and the
// distance between them (ULPs in the ordered-integer representation for float types, the
// integer difference for i32 / u8), and the first divergence (first stage by pipeline
// order, then rank, then the schema's tensor order, then the lowest element).
//
// Replay (DiffOptions::replay) runs each stage's reference function on the dump's own
// upstream tensors (the golden's weights and KV pages) and compares the result with the
// dump's outputs of that stage: the replay matches the dump but the golden does not ->
// the stage inherited a bad input; the replay does not match -> this stage is wrong.
// o_proj and the experts replay in steps (partial rows, the all-reduce, h_mid; routing,
// up/gate, down, the all-reduce), each on the dump's own inputs of that step. A step whose
// inputs are bit-identical to the golden's is not recomputed: the reference is
// deterministic, so its replay is the golden's output.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "golden/format/dump.hpp"  // write_dump, DumpSelection (the dumps compared here)
#include "golden/format/schema.hpp"

namespace k4::golden {

// ---- values ----------------------------------------------------------------------------
// Elements are held as raw bits widened to uint32 (an e2m1x2 element is the stored byte,
// two E2M1 values).

// The ordered-integer form of a float type's bits (sign-magnitude -> two's complement;
// E8M0 has no sign): neighbouring values differ by 1, -0 and +0 are both 0.
int64_t ordered_bits(DType d, uint32_t bits);
bool is_nan_bits(DType d, uint32_t bits);
bool is_float(DType d);  // bf16, f32, e4m3, e8m0, e2m1x2

// The distance between two elements whose bits differ.
struct Distance {
  enum class Kind { Ulp, Int, NanVsNumber, NanVsNan } kind = Kind::Ulp;
  int64_t n = 0;  // ULPs (e2m1x2: the larger of the two nibbles') or |integer difference|
  std::string str() const;  // "3 ulp", "0 ulp (-0 vs +0)", "delta 5", "NaN vs number", "NaN bits differ"
};
Distance distance(DType d, uint32_t a, uint32_t b);

std::string bits_hex(DType d, uint32_t bits);    // "0x3c5e"; e2m1x2 "0xb1"
std::string value_text(DType d, uint32_t bits);  // "0.0135498", "-0", "nan", "inf"; e2m1x2 "(0.5, -1.5)"
double value_of(DType d, uint32_t bits);         // e2m1x2: the low (even) element

// ---- tensors ---------------------------------------------------------------------------

struct RawTensor {
  DType dtype = DType::U8;
  std::vector<std::string> dims;  // dimension names, one a shape entry
  std::vector<uint64_t> shape;
  std::vector<uint32_t> bits;     // row-major
  uint64_t elements() const { return bits.size(); }
};

// Split "token,split,dim" into names.
std::vector<std::string> split_dims(const std::string& dims);
// Row-major multi-index of element `flat`.
std::vector<uint64_t> unflatten(uint64_t flat, const std::vector<uint64_t>& shape);
// "[token 2, split 1, dim 517]"
std::string index_text(const std::vector<uint64_t>& index, const std::vector<std::string>& dims);

template <class T>
RawTensor raw_tensor(DType d, const std::vector<std::string>& dims, const std::vector<uint64_t>& shape,
                     const std::vector<T>& v);
// The bits back as the typed vector the reference works on (uint8_t, uint16_t, int32_t, float).
template <class T>
std::vector<T> typed(const RawTensor& t);

struct Mismatch {
  uint64_t flat = 0;
  std::vector<uint64_t> index;
  uint32_t ref = 0, got = 0;  // ref: the golden's (or the replay's) bits; got: the dump's
  Distance dist;
};

// ULP histogram: bucket 0 holds distance 0 (bits differ, same value: -0 vs +0), bucket k >= 1
// distances in [2^(k-1), 2^k); NaNs apart.
constexpr int kHistBuckets = 34;
std::string hist_label(int bucket);  // "0", "1", "2-3", ..., "128-255", then "2^8" for [2^8, 2^9), ...

struct TensorDiff {
  enum class Status { Match, Mismatch, Missing, ShapeDiffers, DtypeDiffers };
  std::string name;   // "o"
  std::string group;  // "split/outputs", "split/inputs" or "/inputs"
  std::string path;   // the dataset path in the files
  Status status = Status::Match;
  std::string why;    // for Missing / ShapeDiffers / DtypeDiffers
  DType dtype = DType::U8;
  std::vector<std::string> dims;
  std::vector<uint64_t> shape;
  uint64_t elements = 0, mismatches = 0;
  std::vector<Mismatch> first;          // the first max_list mismatches, in index order
  std::vector<uint64_t> where;          // every mismatching flat index (up to kWhereCap)
  bool where_capped = false;
  std::vector<uint64_t> hist = std::vector<uint64_t>(kHistBuckets, 0);
  uint64_t nan_vs_number = 0, nan_vs_nan = 0;
  bool compared() const { return status == Status::Match || status == Status::Mismatch; }
};
constexpr uint64_t kWhereCap = uint64_t(1) << 22;
const char* status_name(TensorDiff::Status s);  // match, mismatch, missing, shape differs, dtype differs

// Element-wise bit comparison; ref and got must have the same dtype and shape.
void diff_tensor(TensorDiff& out, const RawTensor& ref, const RawTensor& got, size_t max_list);

// ---- reading dumps ---------------------------------------------------------------------

// A golden or a dump, read tensor by tensor (no completeness check: a dump may hold part of
// the schema). Opening checks the file exists, is HDF5, has magic K4GOLDEN and schema_version
// 1 (FormatError otherwise). Not thread-safe.
class DumpReader {
 public:
  explicit DumpReader(const std::string& path, const std::string& what = "dump");
  ~DumpReader();
  DumpReader(DumpReader&&) noexcept;
  const std::string& path() const;
  bool has_group(const std::string& path) const;
  bool has_root_attr(const std::string& name) const;
  std::string root_attr_string(const std::string& name) const;
  int64_t root_attr_int(const std::string& name) const;
  // The dataset at `path` resolves (through soft links).
  bool has_dataset(const std::string& path) const;
  // A hard link to a dataset (a stored copy, not a soft link).
  bool stores(const std::string& path) const;
  // Reads the dataset as dtype `want`. Returns Missing, DtypeDiffers or ShapeDiffers (why
  // says what), or Match when `out` holds it. An empty `shape` accepts any shape.
  TensorDiff::Status read(const std::string& path, DType want, const std::vector<uint64_t>& shape, RawTensor& out,
                          std::string& why) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// ---- the file diff ---------------------------------------------------------------------

enum class Verdict { None, Match, Inherited, Own, NotReplayed };
const char* verdict_text(Verdict v);  // "match", "inherited a bad input", "this stage is wrong", "not replayed"

// One replay step of a stage: its outputs recomputed from the dump's inputs, compared with
// the dump's outputs.
struct ReplayStep {
  std::string name;                    // "partial rows", "all-reduce", "routing", ...
  std::vector<std::string> inputs;     // where each input came from: "split/outputs/o (dump)"
  std::vector<std::string> differing;  // inputs whose bits differ from the golden's
  bool recomputed = false;             // false: inputs equal the golden's, replay = golden
  std::string not_replayed;            // why the step could not run (empty: it ran)
  std::vector<TensorDiff> outputs;     // replay (ref) vs dump (got), per output tensor
};

struct StageReplay {
  Verdict verdict = Verdict::None;
  std::string text;        // one line: the verdict and what it rests on
  std::vector<ReplayStep> steps;
};

struct StageDiff {
  std::string stage;  // index, split, merge, oproj, router, moe
  int rank = 0;
  enum class Status { Match, Mismatch, Incomplete, Missing } status = Status::Match;
  std::string why;    // Missing: why the stage was not compared
  std::vector<TensorDiff> tensors;  // stored inputs the dump holds, then the outputs, table order
  StageReplay replay;
  uint64_t mismatches() const;
};
const char* stage_status_name(StageDiff::Status s);

struct Divergence {
  bool found = false;
  int rank = -1;       // -1: the shared /inputs
  std::string stage;   // "inputs" for the shared inputs
  std::string tensor;
  std::vector<uint64_t> index;
  std::vector<std::string> dims;
  uint64_t flat = 0;
};

struct NotCompared {
  int rank = -1;
  std::string stage, tensor, why;
};

struct DiffReport {
  std::string golden, dump;
  std::string config_name;
  int tp = 0, tokens = 0;
  size_t max_list = 10;
  bool replayed = false;
  std::vector<TensorDiff> shared;   // the shared /inputs the dump holds
  std::vector<StageDiff> stages;    // pipeline order, then rank
  std::vector<NotCompared> not_compared;
  Divergence first;
  uint64_t tensors_compared = 0;
  bool any_mismatch() const;        // a tensor mismatches or differs in shape / dtype
  // 0: everything compared matched; 1: a mismatch (or, with require_all, something not
  // compared). Unusable inputs never get here (diff_files throws FormatError: exit 2).
  int exit_code(bool require_all = false) const;
};

struct DiffOptions {
  size_t max_list = 10;  // mismatches listed a tensor
  bool replay = false;
};

// Throws FormatError when either file is unusable (missing, not HDF5, not a golden, another
// schema version, a dump whose config / tp / tokens differ from the golden's, or a dump
// that holds no tensor of the schema).
DiffReport diff_files(const std::string& golden_path, const std::string& dump_path, const DiffOptions& opt);

// The replay of every stage the dump holds (diff_files calls it with opt.replay).
void replay_stages(DiffReport& rep, const std::string& golden_path, const DumpReader& golden, const DumpReader& dump);

// The report as text (what k4 diff prints) and as JSON (k4 diff --json): the same content,
// with first_divergence: {rank, stage, tensor, index}.
// The text lists the first mismatches of every tensor of the first diverging stage (and
// of the replay's own-fault findings); tensors downstream get one line each, unless
// all_mismatches.
std::string report_text(const DiffReport& rep, bool all_mismatches = false);
std::string report_json(const DiffReport& rep);

}  // namespace k4::golden
