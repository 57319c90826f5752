// ours.cpp -- the project's own kernels as a kernel-under-test library (libk4_kut_ours.so):
// every stage through the device kernels' stage twins (device/runner.hpp), which take host
// tensors and run the stage's kernel on the GPU (or in the host emulation of the CPU build).
// Compiled with K4_KUT_ON_DEVICE it is libk4_kut_ours_device.so: a K4_KUT_DEVICE library (the
// harness's tensors in device memory: k4_device run --kut, and k4_kut on the emulation's
// device memory), which stages them through host memory (adapter.hpp run_stage_via_host).
#include <cstring>

#include "device/kut/adapter.hpp"
#include "device/runner.hpp"
#ifdef K4_KUT_ON_DEVICE
#include "device/kut/device_memory.hpp"
#endif

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
int run_host(k4_kut_stage_call* call, char* error, size_t n) { return k4::kut::run_stage_with(fns(), call, error, n); }

#ifdef K4_KUT_ON_DEVICE
int run(k4_kut_stage_call* c, char* error, size_t n) { return k4::kut::run_host_stage_on_device(&run_host, c, error, n); }
const k4_kut_impl kImpl = {K4_KUT_ABI_VERSION, "k4 device kernels (stage twins), device memory", K4_KUT_DEVICE, &supports, &run,
                           nullptr, nullptr};
#else
const k4_kut_impl kImpl = {K4_KUT_ABI_VERSION, "k4 device kernels (stage twins)", K4_KUT_HOST, &supports, &run_host, nullptr, nullptr};
#endif

}  // namespace

extern "C" __attribute__((visibility("default"))) const k4_kut_impl* k4_kut_get(void) { return &kImpl; }
