// emu.hpp -- the host emulation of the part of the HIP API device/ uses (K4_HOST_EMULATION).
//
// With -DK4_HOST_EMULATION a plain C++ compiler builds device/*.cu (as C++) into a host
// program: "device" memory is host memory, a launch runs the block bodies one item after
// another (kernel.hpp). It checks the kernels' indexing, orders and phase structure without a
// GPU; it cannot check the GPU's compiler or hardware, which is what tests/gpu on the device
// does. Memory from hipMalloc is filled with 0xA5 bytes so that a read of memory no kernel
// wrote shows up as a mismatch. The kernels written as CUDA threads (warp shuffles, MMAs) run
// on device/simt.hpp's fibers, one a thread.
#pragma once

#include "device/env.hpp"
#include "device/simt.hpp"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

using hipError_t = int;
using hipStream_t = void*;
constexpr hipError_t hipSuccess = 0;
enum hipMemcpyKind { hipMemcpyHostToDevice, hipMemcpyDeviceToHost, hipMemcpyDeviceToDevice, hipMemcpyHostToHost };

#define K4_WARP_SIZE 32
#define K4_PLATFORM_NAME "host-emulation"

inline hipError_t hipMalloc(void** p, size_t bytes) {
  *p = std::malloc(bytes);
  if (*p == nullptr) return 2;
  std::memset(*p, 0xA5, bytes);
  return hipSuccess;
}
inline hipError_t hipFree(void* p) {
  std::free(p);
  return hipSuccess;
}
inline hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, hipMemcpyKind) {
  if (bytes) std::memcpy(dst, src, bytes);
  return hipSuccess;
}
inline hipError_t hipMemcpyAsync(void* dst, const void* src, size_t bytes, hipMemcpyKind k, hipStream_t) {
  return hipMemcpy(dst, src, bytes, k);
}
inline hipError_t hipMemset(void* p, int v, size_t bytes) {
  if (bytes) std::memset(p, v, bytes);
  return hipSuccess;
}
inline hipError_t hipMemsetAsync(void* p, int v, size_t bytes, hipStream_t) { return hipMemset(p, v, bytes); }
inline hipError_t hipDeviceSynchronize() { return hipSuccess; }
inline hipError_t hipStreamSynchronize(hipStream_t) { return hipSuccess; }
inline hipError_t hipGetLastError() { return hipSuccess; }
enum hipFuncAttribute { hipFuncAttributeMaxDynamicSharedMemorySize };
inline hipError_t hipFuncSetAttribute(const void*, hipFuncAttribute, int) { return hipSuccess; }
inline const char* hipGetErrorString(hipError_t) { return "host emulation error"; }

namespace k4 {

constexpr int kWarpSize = K4_WARP_SIZE;

inline void hip_check(hipError_t err, const char* expr, const char* file, int line) {
  if (err == hipSuccess) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " +
                           hipGetErrorString(err));
}

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) { release(); p_ = o.p_; n_ = o.n_; o.p_ = nullptr; o.n_ = 0; }
    return *this;
  }
  void resize(size_t n) {
    if (n <= n_ && p_ != nullptr) return;
    release();
    void* p = nullptr;
    hip_check(hipMalloc(&p, (n > 0 ? n : 1) * sizeof(T)), "hipMalloc", __FILE__, __LINE__);
    p_ = static_cast<T*>(p);
    n_ = n;
  }
  void upload(const T* host, size_t n) { hipMemcpy(p_, host, n * sizeof(T), hipMemcpyHostToDevice); }
  void download(T* host, size_t n) const { hipMemcpy(host, p_, n * sizeof(T), hipMemcpyDeviceToHost); }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void release() {
    if (p_ != nullptr) hipFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace k4

#define K4_HIP_CHECK(expr) ::k4::hip_check((expr), #expr, __FILE__, __LINE__)
#define K4_HIP_CHECK_LAUNCH() ((void)0)
