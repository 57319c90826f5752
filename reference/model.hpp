// model.hpp -- K4's whole decode step, every stage of every rank, in the seed's order.
//
// run_step is what the goldens are made of: stage 0..5 per rank (OpenMP over ranks, tokens
// and rows; the same bits for any thread count), the all-reduces between them.
#pragma once
#include <cstdint>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/stages/index.hpp"
#include "reference/stages/merge.hpp"
#include "reference/stages/moe.hpp"
#include "reference/stages/oproj.hpp"
#include "reference/stages/router.hpp"
#include "reference/stages/split.hpp"
#include "reference/weights.hpp"

namespace k4 {

struct RankResult {
  IndexOut index;     // stage 0
  SplitOut split;     // stage 1
  MergeOut merge;     // stage 2
  OprojOut oproj;     // stage 3: this rank's partial rows
  std::vector<uint16_t> a;      // (S, hidden) bf16 all-reduced o_proj rows
  std::vector<uint16_t> h_mid;  // (S, hidden) bf16 residual + a
  RouterOut router;   // stage 4
  RouteOut route;     // stage 5: routing
  MoeOut moe;         // stage 5: experts, this rank's partial rows
  std::vector<uint16_t> ar_out; // (S, hidden) bf16 all-reduced FFN rows
};

struct StepResult {
  std::vector<RankResult> ranks;  // tp entries
};

// Checks the inputs against the config (shapes, page ids, seq_lens); throws
// std::invalid_argument naming the tensor, index and what was expected.
void validate_inputs(const StepInputs& in, const Config& cfg);

StepResult run_step(const LayerWeights& w, const StepInputs& in);

}  // namespace k4
