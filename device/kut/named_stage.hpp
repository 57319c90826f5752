// named_stage.hpp -- one stage of one rank on tensors named as in the golden schema: the
// adapter between the kernel-under-test interface (k4_kut.h: named tensors of raw bits) and
// functions with the reference stages' signatures (reference/stages/*.hpp), which are also
// the signatures of the device kernels' stage twins (device/runner.hpp).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "golden/format/schema.hpp"
#include "reference/model.hpp"

namespace k4::kut {

struct NamedTensor {
  golden::DType dtype = golden::DType::U8;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;  // row-major, storage bytes
};
using NamedTensors = std::map<std::string, NamedTensor>;

// The stage functions (the reference's, or the device twins').
struct StageFns {
  void (*select_blocks)(IndexOut&, const StepShared&, const std::vector<float>&, const Config&);
  void (*split_attention)(SplitOut&, const StepShared&, const StepRank&, const IndexOut&, const Config&);
  void (*merge_partitions)(MergeOut&, const SplitOut&, int, const Config&);
  void (*o_proj_partials)(OprojOut&, const MergeOut&, const RankWeights&, int, const Config&);
  void (*route_scores)(RouterOut&, const std::vector<uint16_t>&, const std::vector<uint16_t>&, const RankWeights&, int,
                       const Config&);
  void (*route_top4)(RouteOut&, const RouterOut&, int, const Config&);
  void (*experts_up_gate)(MoeOut&, const RouteOut&, const RouterOut&, const ExpertSource&, int, int, const Config&);
  void (*experts_down)(MoeOut&, const RouteOut&, const ExpertSource&, int, int, const Config&);
};
StageFns reference_fns();

// Runs `stage` of `rank` on the schema-named inputs; fills `out` with the stage's outputs of
// one rank (oproj: partial; moe: route_ids .. partial). Throws std::invalid_argument naming a
// missing or mis-sized input.
void run_named_stage(const StageFns& fns, const std::string& stage, const Config& cfg, int rank, int tokens, int q_len,
                     const NamedTensors& in, NamedTensors& out);

// The outputs run_named_stage gives (the schema's, less the all-reduced rows).
bool rank_output(const std::string& stage, const std::string& name);

}  // namespace k4::kut
