// device_memory.hpp -- the kut harness's memory of kind K4_KUT_DEVICE (k4_kut.h): allocations
// on the current GPU, copied to and from with the device runtime (device_memory.cu). In the CPU
// build the same source is compiled with K4_HOST_EMULATION: the emulation's "device" memory
// (device/emu.hpp: host memory, new allocations filled with 0xA5), so that k4_kut runs a
// device-memory library through the same harness path without a GPU.
#pragma once
#include <memory>

#include "device/kut/adapter.hpp"
#include "device/kut/harness.hpp"

namespace k4::kut {

// hipMalloc / hipFree / hipMemcpy (CUDA under nvcc); to_host waits for the device first, so a
// library that ran on call->stream (the default stream: NULL) has finished.
std::unique_ptr<Memory> device_memory();

// A K4_KUT_DEVICE library's run_stage made of a host one: run_stage_via_host (adapter.hpp)
// through one device_memory() of the library's own.
int run_host_stage_on_device(RunStageFn host_run, k4_kut_stage_call* call, char* error, size_t error_size);

}  // namespace k4::kut
