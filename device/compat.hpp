// compat.hpp -- the one portability header of the device code.
//
// Device sources are written against the HIP runtime API. Under hipcc this header includes
// <hip/hip_runtime.h> and nothing else changes. Under nvcc it maps the part of the HIP API the
// kernels use onto CUDA, without HIP's own NVIDIA headers (Debian's HIP 5.2 nvidia_detail
// headers do not build against CUDA 13).
//
// Also here, for both:
//   K4_WARP_SIZE     32 on NVIDIA, 64 on AMD (a compile-time constant; also k4::kWarpSize)
//   K4_HIP_CHECK(e)  throws std::runtime_error("file:line: e: <error string>") unless e is
//                    hipSuccess; K4_HIP_CHECK_LAUNCH() checks the last kernel launch
//   k4_shfl_xor / k4_shfl: the HIP shuffles the kernels use (all lanes of the warp must take
//                    part on NVIDIA: they map to the *_sync forms with a full mask); under nvcc
//                    the HIP names __shfl_xor and __shfl are macros for these. Add another
//                    shuffle here when a kernel first needs it.
//   K4_DYNAMIC_SMEM(name): the launch's dynamic shared memory as `unsigned char name[]`,
//                    16-byte aligned (device/simt.hpp gives the host emulation's).
//   k4::DeviceBuffer<T>: an owning device allocation (hipMalloc / hipFree).
//   k4_launch_dependent(kernel, grid, block, shared_bytes, stream, args...): hipLaunchKernelGGL,
//                    on NVIDIA (sm_90) as a programmatic dependent launch: the GPU launches the
//                    kernel as the stream's previous kernel completes, without the gap of a
//                    plain launch (K4_PDL=0: plain launches, for timing). Such a kernel must call
//                    k4_grid_dep_start() before its first global memory access: it returns once
//                    the previous kernel has completed and its writes are visible (and so every
//                    kernel's before it), so a kernel sees exactly what a plain launch would
//                    (tests/cpu/test_device_launches.cpp checks every kernel of device/ does).
//
// Add a mapping here when a kernel needs one more HIP call: never include CUDA headers or
// call cuda* directly from device/ sources.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "device/env.hpp"

#if defined(__HIPCC__) || defined(__HIP__)
// ---------------------------------------------------------------------------------- AMD (HIP)
#include <hip/hip_runtime.h>

#define K4_WARP_SIZE 64
#define K4_PLATFORM_NAME "hip"

inline hipError_t k4_graph_instantiate(hipGraphExec_t* e, hipGraph_t g) { return hipGraphInstantiate(e, g, nullptr, nullptr, 0); }

template <class T>
__device__ inline T k4_shfl_xor(T v, int lane_mask, int width = K4_WARP_SIZE) { return __shfl_xor(v, lane_mask, width); }
template <class T>
__device__ inline T k4_shfl(T v, int src_lane, int width = K4_WARP_SIZE) { return __shfl(v, src_lane, width); }

#define k4_launch_dependent(...) hipLaunchKernelGGL(__VA_ARGS__)
__device__ inline void k4_grid_dep_start() {}

#elif defined(__CUDACC__)
// ------------------------------------------------------------------------------ NVIDIA (CUDA)
#include <cuda_runtime.h>
// Included before the shuffle macros below so that their declarations are never rewritten.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define K4_WARP_SIZE 32
#define K4_PLATFORM_NAME "cuda"

// Types.
using hipError_t = cudaError_t;
using hipStream_t = cudaStream_t;
using hipEvent_t = cudaEvent_t;
using hipDeviceProp_t = cudaDeviceProp;
using hipMemcpyKind = cudaMemcpyKind;

// Error codes and enums.
#define hipSuccess cudaSuccess
#define hipErrorNotReady cudaErrorNotReady
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipMemcpyHostToHost cudaMemcpyHostToHost
#define hipMemcpyDefault cudaMemcpyDefault
#define hipHostMallocDefault cudaHostAllocDefault
#define hipHostMallocPortable cudaHostAllocPortable
#define hipStreamDefault cudaStreamDefault
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipEventDefault cudaEventDefault
#define hipEventDisableTiming cudaEventDisableTiming
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize

// Errors.
#define hipGetLastError cudaGetLastError
#define hipPeekAtLastError cudaPeekAtLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetErrorName cudaGetErrorName

// Devices.
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDevice cudaGetDevice
#define hipSetDevice cudaSetDevice
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipFuncSetAttribute(f, attr, value) cudaFuncSetAttribute((f), (attr), (value))

// Memory. (hipHostMalloc(ptr, bytes, flags) is cudaHostAlloc; no managed memory on purpose.)
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipHostMalloc cudaHostAlloc
#define hipHostFree cudaFreeHost
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemset cudaMemset
#define hipMemsetAsync cudaMemsetAsync
#define hipMemGetInfo cudaMemGetInfo

// Streams and events.
#define hipStreamCreate cudaStreamCreate
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipEventCreate cudaEventCreate
#define hipEventCreateWithFlags cudaEventCreateWithFlags
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipEventQuery cudaEventQuery

// Launch. hipLaunchKernelGGL(kernel, grid, block, shared_bytes, stream, args...).
using hipGraph_t = cudaGraph_t;
using hipGraphExec_t = cudaGraphExec_t;
#define hipStreamCaptureModeGlobal cudaStreamCaptureModeGlobal
#define hipStreamBeginCapture cudaStreamBeginCapture
#define hipStreamEndCapture cudaStreamEndCapture
#define hipGraphLaunch cudaGraphLaunch
#define hipGraphExecDestroy cudaGraphExecDestroy
#define hipGraphDestroy cudaGraphDestroy
#define hipGraphGetNodes cudaGraphGetNodes
inline cudaError_t k4_graph_instantiate(cudaGraphExec_t* e, cudaGraph_t g) { return cudaGraphInstantiate(e, g, 0); }

#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...) \
  (kernel)<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)

inline bool k4_pdl_on() {
  static const bool on = k4_env_on("K4_PDL");
  return on;
}
// The launch's error is left for K4_HIP_CHECK_LAUNCH (cudaGetLastError), as a <<<>>> launch's.
template <class... P, class... A>
inline void k4_launch_dependent_ex(void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, A&&... args) {
  cudaLaunchAttribute at{};
  at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t c{};
  c.gridDim = grid, c.blockDim = block, c.dynamicSmemBytes = shmem, c.stream = stream;
  c.attrs = &at, c.numAttrs = k4_pdl_on() ? 1 : 0;
  (void)cudaLaunchKernelEx(&c, kernel, static_cast<A&&>(args)...);
}
#define k4_launch_dependent(kernel, grid, block, shmem, stream, ...) \
  k4_launch_dependent_ex((kernel), dim3(grid), dim3(block), size_t(shmem), (stream), __VA_ARGS__)
// First in a kernel launched by k4_launch_dependent: wait for the previous kernel. No kernel
// triggers its dependents early (griddepcontrol.launch_dependents at a kernel's start measured
// slower: docs/performance.md).
__device__ inline void k4_grid_dep_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// HIP's thread-index spellings.
#define hipThreadIdx_x threadIdx.x
#define hipThreadIdx_y threadIdx.y
#define hipThreadIdx_z threadIdx.z
#define hipBlockIdx_x blockIdx.x
#define hipBlockIdx_y blockIdx.y
#define hipBlockIdx_z blockIdx.z
#define hipBlockDim_x blockDim.x
#define hipBlockDim_y blockDim.y
#define hipBlockDim_z blockDim.z
#define hipGridDim_x gridDim.x
#define hipGridDim_y gridDim.y
#define hipGridDim_z gridDim.z

// Shuffles: HIP's (non-sync) forms over the full warp.
template <class T>
__device__ inline T k4_shfl_xor(T v, int lane_mask, int width = K4_WARP_SIZE) {
  return __shfl_xor_sync(0xFFFFFFFFu, v, lane_mask, width);
}
template <class T>
__device__ inline T k4_shfl(T v, int src_lane, int width = K4_WARP_SIZE) {
  return __shfl_sync(0xFFFFFFFFu, v, src_lane, width);
}
#define __shfl_xor k4_shfl_xor
#define __shfl k4_shfl

#else
#error "device/compat.hpp is for device sources: compile them with nvcc or hipcc"
#endif

#define K4_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]

namespace k4 {

constexpr int kWarpSize = K4_WARP_SIZE;

// The message K4_HIP_CHECK throws: "file:line: expr: error string (code n)".
inline void hip_check(hipError_t err, const char* expr, const char* file, int line) {
  if (err == hipSuccess) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " +
                           hipGetErrorString(err) + " (code " + std::to_string(int(err)) + ")");
}

// An owning device array of n elements of T (no construction: raw device memory).
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
  // Reallocates only to grow; the contents are not kept.
  void resize(size_t n) {
    if (n <= n_ && p_ != nullptr) return;
    release();
    void* p = nullptr;
    hip_check(hipMalloc(&p, (n > 0 ? n : 1) * sizeof(T)), "hipMalloc", __FILE__, __LINE__);
    p_ = static_cast<T*>(p);
    n_ = n;
  }
  void upload(const T* host, size_t n) {
    hip_check(hipMemcpy(p_, host, n * sizeof(T), hipMemcpyHostToDevice), "hipMemcpy H2D", __FILE__, __LINE__);
  }
  void download(T* host, size_t n) const {
    hip_check(hipMemcpy(host, p_, n * sizeof(T), hipMemcpyDeviceToHost), "hipMemcpy D2H", __FILE__, __LINE__);
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void release() {
    if (p_ != nullptr) (void)hipFree(p_);  // no throw from a destructor
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace k4

#define K4_HIP_CHECK(expr) ::k4::hip_check((expr), #expr, __FILE__, __LINE__)
#define K4_HIP_CHECK_LAUNCH() ::k4::hip_check(hipGetLastError(), "kernel launch", __FILE__, __LINE__)
