// runner.hpp -- the host side of the device kernels: K4's whole step and each stage on the GPU.
//
// Plain C++ (no GPU headers): the GPU suite (tests/gpu) and the tools include it.
//
//   Runner(w).run_step(in)      every rank of the TP group on this GPU, each with its own weight
//                               shard; partial rows exchanged through device buffers as the
//                               seed's peers exchange them (push_partial, allreduce.cu); returns
//                               every intermediate in reference/model.hpp's StepResult, field for
//                               field comparable with k4::run_step.
//   k4::gpu::select_blocks(...) the stage twins: the reference stage functions' names and
//   ... experts_down(...)       arguments, computed by the stage's kernel on the given inputs
//                               (one rank): for replaying a stage on another stage's outputs.
//
// Experts: a run uploads only the experts the step's routing picked (and the shared one), as
// the device computed that routing; a Runner keeps them for later steps of the same layer.
// Every error throws (std::runtime_error from the HIP runtime, std::invalid_argument from the
// reference's input validation).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/model.hpp"

namespace k4::gpu {

struct RunOptions {
  // The all-reduces' form: -1 the config's (reduce-scatter + all-gather from ag_rs_from tokens
  // on), 0 plain (every rank sums every partial), 1 reduce-scatter + all-gather. Same bits.
  int ar_form = -1;
  // The last stage to run, 0 (index) .. 5 (moe, the route included): later stages' fields of
  // the result are left empty. 4 stops after the router: no expert is needed.
  int last_stage = 5;
  // The split, o_proj and MoE kernels: 0 the reference path (split.cu's CUDA-core body,
  // oproj.cu, moe.cu), 1 the integer tensor-core path (split.cu's tensor-core body,
  // oproj_fast.cu, moe_fast.cu; same bits), -1 the environment's K4_FAST (1: the fast path).
  // Each stage's fast kernel falls back to the reference one where it does not apply (host
  // emulation; moe: other variants).
  int moe_path = -1;
};

// The step's routing (as the device computed it) picked an expert its ExpertSource cannot
// give: a golden's source serves only the experts of the golden's own routing.
class ExpertUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One stage's kernels timed over a step (CUDA/HIP events, after warm-up).
struct StageTime {
  std::string stage;      // "index", "split", ...
  double median_us = 0;   // median of the timed repeats
  double min_us = 0;
  double bytes = 0;       // the HBM bytes the stage must move at least (reads + writes)
};

// The whole step timed end to end (time_step): every stage's launches as run_step issues them,
// the routing read back included, with the L2 flushed before each repeat so that no weight is
// left hot from the step before (w_o alone is 50 MB of the 60 MB L2 at TP 4).
struct StepTime {
  double median_us = 0, min_us = 0;
  int repeats = 0;
  double bytes = 0;          // the HBM bytes the step must move at least: the stages' sum
  double floor_us = 0;       // one launch streaming `bytes` (16-byte loads), L2 flushed, median
  double read_bw = 0;        // bytes / s of that launch
  int experts = 0;           // the step's distinct experts, summed over ranks
  bool fast = false;         // stage 5 on the tensor-core path
  // the fast path only: the step as one CUDA-graph replay (no host work inside), median
  double graph_median_us = 0, graph_min_us = 0;
  int graph_nodes = 0;
};

class Runner {
 public:
  explicit Runner(const LayerWeights& w);  // uploads every rank's dense weights
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  StepResult run_step(const StepInputs& in, const RunOptions& opt = {});

  // Each stage's kernels of the step `in` (run once first, so its experts are on the device)
  // timed `repeats` times after `warmup` untimed runs.
  std::vector<StageTime> time_stages(const StepInputs& in, int warmup, int repeats, const RunOptions& opt = {});

  // The step `in` end to end (run once first, so its experts are on the device): `repeats`
  // timed runs after `warmup`, each after an L2 flush, and the weights-only floor beside it.
  StepTime time_step(const StepInputs& in, int warmup, int repeats, const RunOptions& opt = {});

  // Device-to-device copy bandwidth (bytes read + written per second) over `bytes`.
  static double copy_bandwidth(size_t bytes, int repeats);
  // One launch reading `bytes` with 16-byte streaming loads after an L2 flush: median time in
  // seconds over `repeats` (the byte floor of a step or stage that reads that much).
  static double read_floor_s(size_t bytes, int repeats);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// run_step on a fresh Runner.
StepResult run_step(const LayerWeights& w, const StepInputs& in, const RunOptions& opt = {});

// ---- the stage twins (reference/stages/*.hpp signatures), one rank each -------------------
void select_blocks(IndexOut& out, const StepShared& in, const std::vector<float>& scores, const Config& cfg);
void split_attention(SplitOut& out, const StepShared& sh, const StepRank& rank, const IndexOut& idx, const Config& cfg);
void merge_partitions(MergeOut& out, const SplitOut& sp, int tokens, const Config& cfg);
void o_proj_partials(OprojOut& out, const MergeOut& mg, const RankWeights& w, int tokens, const Config& cfg);
void all_reduce_rows(std::vector<std::vector<uint16_t>>& out, const std::vector<const std::vector<uint16_t>*>& partials,
                     int tokens, int hidden, bool zero_start, bool reduce_scatter, int rows_per_task);
void residual_add(std::vector<uint16_t>& h_mid, const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in);
void route_scores(RouterOut& out, const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in,
                  const RankWeights& w, int tokens, const Config& cfg);
void route_top4(RouteOut& out, const RouterOut& r, int tokens, const Config& cfg);
// out.mid .. out.midsc; out.partial is left as it was.
void experts_up_gate(MoeOut& out, const RouteOut& route, const RouterOut& r, const ExpertSource& src, int rank,
                     int tokens, const Config& cfg);
// out.partial from out.mid8 / out.midsc.
void experts_down(MoeOut& out, const RouteOut& route, const ExpertSource& src, int rank, int tokens,
                  const Config& cfg);

// "NVIDIA H200 (sm_90, 132 SMs)" or the like; "host emulation" in the emulation build.
std::string device_name();
// K4_PLANT_STAGE of this build (-1: none).
int planted_stage();

}  // namespace k4::gpu
