// schema.hpp -- the golden file: every stage's inputs and outputs of every TP rank, as raw
// bits in HDF5 (docs/golden-format.md is the reference; the table in schema.cpp is the one
// source of truth both directions use).
//
//   /                      attributes magic "K4GOLDEN", schema_version 2, contract_version,
//                          tool_version, config (JSON), scenario (JSON), seeds (JSON), tp,
//                          tokens, weights (and weights_file: golden/format/weights_file.hpp)
//   /inputs/               the shared step inputs (seq_lens, block_table, h_in)
//   /rank<r>/<stage>/inputs/   stage in index, split, merge, oproj, router, moe
//   /rank<r>/<stage>/outputs/
// A stage input that is another stage's output (or a shared input) is a soft link to it.
// /rank<r>/index/inputs/index_scores is stored per rank (each rank's own index head); a rank
// whose scores equal rank 0's links to rank 0's.
// Every dataset is an integer dataset of raw bits with attributes dtype, dims and meaning.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "golden/format/tensors.hpp"
#include "golden/io/hdf5.hpp"
#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/model.hpp"
#include "reference/weights.hpp"

namespace k4::golden {

constexpr const char* kMagic = "K4GOLDEN";
// Version 2: index scores per rank (/rank<r>/index/inputs/index_scores). Version 1 files
// (one /inputs/index_scores, every rank's index/inputs/index_scores a link to it) are still
// read: every rank gets those scores, which is what a version 1 golden was made from.
constexpr int kSchemaVersion = 2;
constexpr int kOldestSchemaVersion = 1;
constexpr const char* kContractVersion = "1";
constexpr const char* kInputsMagic = "K4INPUTS";
// The most KV pages a rank's cache may have in a golden or inputs file (a bound for the readers
// that size buffers from attributes; 2^26 pages = 128 GiB of K a rank).
constexpr int kMaxPages = 1 << 26;

// The generator's revision: K4_TOOL_VERSION if the build defines it (git describe), else
// the compiled-in version string.
std::string tool_version();

// A file that does not hold what the schema says (bad input: exit code 2).
class FormatError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The stored form of a dtype (the table and the dtypes: tensors.hpp).
h5::Elem stored_elem(DType d);  // the integer type a dtype's bits are stored as
std::string shape_str(const std::vector<uint64_t>& s);  // "(4,2048)"
// A tensor's dtype in a file of config c: the table's, except the experts' w13 / w2, which are
// E4M3 under moe.experts = mxfp8 (V7).
DType spec_dtype(const TensorSpec& s, const Config& c);
// Whether a file of config c holds tensor s: the MXFP8 shared expert's sh_* only under
// moe.shared_fp8 (V6.1), where the stacked w13 .. s2 hold the routed experts only;
// router/inputs/w_gate_f32 only under router.gate = f32 (V1a). (page_ids depends on the KV
// form, not on the config.)
bool spec_present(const TensorSpec& s, const Config& c);

// Config <-> JSON (every field; reading requires every field and no others).
std::string config_to_json(const Config& c);
Config config_from_json(const std::string& json, const std::string& where);

// ---- writing ---------------------------------------------------------------------------

struct GoldenMeta {
  std::string scenario_json = "{}";  // the scenario as JSON
  uint64_t weight_seed = 0, input_seed = 0;
  std::string weights = "synthetic";  // "synthetic" or the checkpoint path
  // A checkpoint's: the preparation rules applied (JSON; golden/inputs/weight_prep.hpp) and the
  // layer. Written as attributes weight_prep and weight_layer when weight_prep is not empty.
  std::string weight_prep;
  int weight_layer = -1;
  // KV pages: "whole" (the caches as they are), "selected" (only the pages the sparse table
  // names, plus page_ids), or "auto": whole when K + V of a rank fit whole_kv_limit bytes.
  std::string kv_form = "auto";
  uint64_t whole_kv_limit = 8u << 20;
  // `--weights-file`: the golden's w_o and expert tables are virtual datasets over this
  // weights file (golden/format/weights_file.hpp), whose content hash is weights_file_hash;
  // the weights passed to write_golden must be the file's (no injections). Empty: stored here.
  std::string weights_file, weights_file_hash;
};

struct WriteOptions {
  bool overwrite = false;
  std::function<void(uint64_t done, uint64_t total)> progress;  // bytes of tensor data
};

// Writes FILE atomically (temporary + rename). The experts stored for rank r are the
// distinct ids of its route (every token's 5 slots, the shared expert included), ascending.
void write_golden(const std::string& path, const LayerWeights& w, const StepInputs& in, const StepResult& res,
                  const GoldenMeta& meta, const WriteOptions& opt);

// ---- reading ---------------------------------------------------------------------------

struct IndexStage {
  StepShared in;                    // tokens, q_len, seq_lens, block_table (h_in too)
  std::vector<float> index_scores;  // this rank's (S, score_width)
  IndexOut out;
};
struct SplitStage {
  StepShared shared;
  StepRank rank;    // caches rebuilt at full size; pages not stored read as zero bytes / scales
  IndexOut index;
  SplitOut out;
};
struct MergeStage {
  int tokens = 0;
  SplitOut in;
  MergeOut out;
};
struct OprojStage {
  int tokens = 0;
  MergeOut in;
  RankWeights w;                                   // w_o, s_o
  std::vector<uint16_t> h_in;
  OprojOut out;
  std::vector<std::vector<uint16_t>> rank_partials;  // every rank's partial (the all-reduce's inputs)
  std::vector<uint16_t> a, h_mid;
};
struct RouterStage {
  int tokens = 0;
  std::vector<uint16_t> a, h_in;
  RankWeights w;  // g_post, w_gate, bias
  RouterOut out;
};
struct MoeStage {
  int tokens = 0;
  RouterOut in;
  std::vector<int32_t> expert_ids;                 // the experts stored (ascending)
  std::shared_ptr<const ExpertSource> experts;     // serves exactly those (other ids throw)
  RouteOut route;
  MoeOut out;
  std::vector<std::vector<uint16_t>> rank_partials;
  std::vector<uint16_t> ar_out;
};

// Not thread-safe (HDF5 is built serial), except the ExpertSource it hands out.
class GoldenReader {
 public:
  // Opens and validates: magic, schema_version, and every dataset's presence, dtype and
  // shape. Throws FormatError naming the file, the dataset and what was expected.
  explicit GoldenReader(const std::string& path);
  ~GoldenReader();
  GoldenReader(GoldenReader&&) noexcept;

  const std::string& path() const;
  const Config& config() const;
  int tp() const;
  int tokens() const;
  std::string root_attr(const std::string& name) const;  // string attributes of /

  IndexStage index(int rank) const;
  SplitStage split(int rank) const;
  MergeStage merge(int rank) const;
  OprojStage oproj(int rank) const;
  RouterStage router(int rank) const;
  MoeStage moe(int rank) const;

  StepInputs inputs() const;
  // The rows whose routed picks join the wide MoE (live_rows of the config and /inputs/seq_lens).
  std::vector<uint8_t> moe_live() const;
  RankResult rank_result(int rank) const;
  StepResult result() const;
  // The stored weights: every rank's RankWeights and an ExpertSource of the stored experts.
  LayerWeights weights() const;

  struct Impl;  // implementation detail (reader.cpp)

 private:
  std::shared_ptr<Impl> p_;
};

// ---- an inputs file (what a user captured) ---------------------------------------------
// Root attributes magic "K4INPUTS", schema_version 2, config (JSON), tokens, q_len, tp;
// /inputs/{seq_lens, block_table, h_in} as in a golden;
// /rank<r>/inputs/{q, index_scores, k_cache, v_cache, k_scale, v_scale} whole caches.
// A version 1 file's one /inputs/index_scores is read as every rank's.
void write_inputs_file(const std::string& path, const Config& cfg, const StepInputs& in, bool overwrite);
// Reads an inputs file or the inputs of a golden. cfg_out receives the file's config.
StepInputs read_inputs_file(const std::string& path, Config* cfg_out = nullptr);

}  // namespace k4::golden
