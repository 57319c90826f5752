// adapter.hpp -- a k4_kut.h library made of functions with the reference stages' signatures:
// the host-memory call's named tensors to and from run_named_stage (named_stage.hpp); and a
// host-memory run_stage served to a device-memory (K4_KUT_DEVICE) harness.
#pragma once
#include <cstddef>

#include "device/kut/harness.hpp"
#include "device/kut/k4_kut.h"
#include "device/kut/named_stage.hpp"

namespace k4::kut {

// run_stage of a K4_KUT_HOST library over `fns`: 0 ok; else the message in `error`.
int run_stage_with(const StageFns& fns, k4_kut_stage_call* call, char* error, size_t error_size);

// run_stage of a K4_KUT_DEVICE library made of a host one: the call's device inputs and its
// (0xA5-filled) output buffers copied to host memory through `mem`, `host_run` on those, its
// outputs copied back. Our kernels' stage twins take host tensors (device/runner.hpp), so this
// is how libk4_kut_ours_device.so takes the harness's device pointers.
using RunStageFn = int (*)(k4_kut_stage_call*, char*, size_t);
int run_stage_via_host(RunStageFn host_run, Memory& mem, k4_kut_stage_call* call, char* error, size_t error_size);

}  // namespace k4::kut
