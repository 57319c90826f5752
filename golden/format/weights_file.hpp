// weights_file.hpp -- a layer's weights stored once (`k4 golden --weights-file FILE`), and the
// goldens that refer to it instead of holding the weights (docs/golden-format.md, "Weights
// file").
//
// The weights file (HDF5, written atomically once, then only read):
//   /  attributes magic "K4WEIGHTS", weights_version 1, config (JSON of the writer's config),
//      shape (the fields the weights' shapes depend on), weights (source: "synthetic" or
//      "checkpoint DIR"), weight_seed, weight_prep, weight_layer, hash (content hash, below)
//   /rank<r>/w_o (hidden, o_k) e4m3, s_o (hidden) f32, g_post (hidden) bf16,
//            w_gate (expert, hidden) bf16, bias (expert) f32,
//            w13 / s13 / w2 / s2 (n_experts = n_routed + 1, ...) every expert, the shared last,
//            in the golden's forms (E2M1 pairs, or E4M3 under moe.experts = mxfp8);
//            under moe.shared_fp8 the n_routed routed experts only, and the MXFP8 shared
//            expert as sh_w13 / sh_s13 / sh_w2 / sh_s2 (1, ...) after s2
//   Content hash: FNV-1a 64 over every dataset's bytes in the order above (rank 0 first),
//   written as 16 lower-case hex digits.
// A golden that refers to it: root attribute weights_file = JSON {"path": the file's name
// relative to the golden's directory (or absolute), "hash": its content hash}; its
// /rank<r>/oproj/inputs/w_o and /rank<r>/moe/inputs/{w13,s13,w2,s2} are HDF5 virtual
// datasets over the weights file's rows (the used experts' rows for w13 .. s2), each with
// attribute source_hash = FNV-1a 64 of the bytes it holds. GoldenReader checks on open that
// the file is there, is a weights file, has the recorded hash, and that every virtual
// dataset's bytes hash to its source_hash: a moved golden, a missing, replaced or changed
// weights file is a FormatError naming both files (HDF5 itself would read zeros).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "golden/io/hdf5.hpp"
#include "reference/config.hpp"
#include "reference/weights.hpp"

namespace k4::golden {

constexpr const char* kWeightsMagic = "K4WEIGHTS";
constexpr int kWeightsVersion = 1;

// FNV-1a 64, streamed.
struct Fnv64 {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(const void* p, size_t n);
  std::string hex() const;  // 16 lower-case hex digits
};

// Where the weights came from: a weights file is reused only for the same source.
struct WeightsSource {
  std::string weights = "synthetic";  // GoldenMeta::weights
  uint64_t weight_seed = 0;
  std::string weight_prep;
  int weight_layer = -1;
};

// What a weights file cannot serve, refused naming `option` (k4 golden's --weights-file, the
// Python Step.save's weights_file): weights with a scenario's injections (special_weights,
// nan_weight: not the file's), router.gate = f32 (the file holds the bf16 gate).
void refuse_weights_file(const Config& c, bool weight_injections, const std::string& option);

// The config fields the weights' bytes and shapes depend on, as one line.
std::string weights_shape(const Config& c);

// Writes FILE (temporary + rename; an existing FILE is refused): every rank's dense weights
// and all n_routed + 1 experts. Returns the content hash. progress(done, total) in bytes.
std::string write_weights_file(const std::string& path, const LayerWeights& lw, const WeightsSource& src,
                               const std::function<void(uint64_t, uint64_t)>& progress = {});

// An open weights file (validated: magic, version, every dataset's shape for its config).
class WeightsFile {
 public:
  explicit WeightsFile(const std::string& path);  // FormatError naming the file and what is wrong
  const std::string& path() const;
  const std::string& hash() const;
  const Config& config() const;
  WeightsSource source() const;
  // Throws std::invalid_argument naming each difference when this file does not hold the
  // weights a golden of config c from source s would use.
  void require_matches(const Config& c, const WeightsSource& s) const;
  // Reads every dataset and checks the content hash (FormatError: the file changed).
  void verify() const;
  // The weights for config c (require_matches first): the dense ones read, experts on demand.
  LayerWeights weights(const Config& c) const;

  struct Impl;

 private:
  std::shared_ptr<Impl> p_;
};

// The checks of a golden that refers to a weights file (root attribute weights_file; nothing
// when it has none), every reader's on open: GoldenReader, DumpReader (k4 diff / replay /
// the Python k4.open). FormatError "golden PATH: ..." naming what is missing or changed.
void check_weights_refs(const std::string& golden_path, const h5::Group& root);

}  // namespace k4::golden
