// ours.cpp -- the project's own kernels as a kernel-under-test library (libk4_kut_ours.so):
// every stage through the device kernels' stage twins (device/runner.hpp), which take host
// tensors and run the stage's kernel on the GPU (or in the host emulation of the CPU build).
#include <cstring>

#include "device/kut/adapter.hpp"
#include "device/runner.hpp"

namespace {

k4::kut::StageFns fns() {
  k4::kut::StageFns f;
  f.select_blocks = &k4::gpu::select_blocks;
  f.split_attention = &k4::gpu::split_attention;
  f.merge_partitions = &k4::gpu::merge_partitions;
  f.o_proj_partials = &k4::gpu::o_proj_partials;
  f.route_scores = &k4::gpu::route_scores;
  f.route_top4 = &k4::gpu::route_top4;
  f.experts_up_gate = &k4::gpu::experts_up_gate;
  f.experts_down = &k4::gpu::experts_down;
  return f;
}

int supports(const char*) { return 1; }
int run(k4_kut_stage_call* call, char* error, size_t n) { return k4::kut::run_stage_with(fns(), call, error, n); }

const k4_kut_impl kImpl = {K4_KUT_ABI_VERSION, "k4 device kernels (stage twins)", K4_KUT_HOST, &supports, &run, nullptr, nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) const k4_kut_impl* k4_kut_get(void) { return &kImpl; }
