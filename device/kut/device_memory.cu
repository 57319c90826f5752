// device_memory.cu -- device_memory() (device_memory.hpp): the kut harness's K4_KUT_DEVICE
// memory through the HIP API of device/compat.hpp (CUDA under nvcc), or the host emulation's
// (device/emu.hpp) when compiled as C++ with K4_HOST_EMULATION (the CPU build).
#include "device/kut/device_memory.hpp"

#ifdef K4_HOST_EMULATION
#include "device/emu.hpp"
#else
#include "device/compat.hpp"
#endif

namespace k4::kut {
namespace {

class DeviceMemory : public Memory {
 public:
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    K4_HIP_CHECK(hipMalloc(&p, bytes > 0 ? bytes : 1));
    return p;
  }
  void release(void* p) override { (void)hipFree(p); }  // no throw: called from destructors
  void to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes) K4_HIP_CHECK(hipMemcpy(dst, src, bytes, hipMemcpyHostToDevice));
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    K4_HIP_CHECK(hipDeviceSynchronize());  // the library's work on its stream is done
    if (bytes) K4_HIP_CHECK(hipMemcpy(dst, src, bytes, hipMemcpyDeviceToHost));
  }
};

}  // namespace

std::unique_ptr<Memory> device_memory() { return std::make_unique<DeviceMemory>(); }

int run_host_stage_on_device(RunStageFn host_run, k4_kut_stage_call* call, char* error, size_t error_size) {
  static const std::unique_ptr<Memory> mem = device_memory();
  return run_stage_via_host(host_run, *mem, call, error, error_size);
}

}  // namespace k4::kut
