// kernel.hpp -- the execution model every stage kernel of device/ is written in.
//
// A stage kernel is a *block body*: a functor `Body` whose
//   template <class Ctx> K4_BODY void operator()(Ctx& c, unsigned char* smem) const
// runs one thread block. The body is a sequence of *phases*: c.each(n, f) runs f(i) for every
// item i in [0, n), the items spread over the block's threads, then a block barrier. Items of
// one phase are independent (no item reads what another item of the same phase writes), so a
// phase means the same whatever the thread count and whatever the order the items run in.
// State that crosses a barrier lives in shared memory (smem), never in a thread's registers.
//
// Consequences, all deliberate:
//  - Nothing numeric depends on the warp size (32 on NVIDIA, 64 on AMD): there are no
//    shuffles; every 64-lane butterfly of the seed is computed by the K4_HD tree functions of
//    reference/numerics/butterfly.hpp over values gathered in shared memory.
//  - The same body runs on the host (K4_HOST_EMULATION: device/emu.hpp), one item after
//    another, with shared memory filled with 0xA5 garbage first. The emulation is how the
//    kernels' indexing and orders are checked where no GPU is (it proves nothing about the
//    GPU's arithmetic: tests/gpu does that on the device).
//  - The one exception: a body whose items are warps doing MMAs (split.cu's tensor-core body,
//    body_has_warps) shuffles; the emulation runs it on threads (device/simt.hpp), as the GPU does.
//
// launch(body, grid, threads, smem_bytes, stream) runs body over a 3-D grid (bx, by, bz) of
// blocks: by is the TP rank wherever a stage runs all ranks in one launch.
#pragma once

#if defined(K4_HOST_EMULATION)
#include "device/emu.hpp"
#else
#include "device/compat.hpp"
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "reference/config.hpp"
#include "reference/numerics/hd.hpp"

// K4_BODY: a block body or a helper only block bodies call (device code on the GPU build).
#if defined(K4_HOST_EMULATION)
#define K4_BODY inline
#else
#define K4_BODY __device__ inline
#endif

// K4_PLANT_STAGE=N (0..5): the kernel of stage N flips bit 0 of one element of its output
// (rank 0, token 0, element 0) -- the suite must then fail naming stage N (scripts/gpu-suite.sh).
#ifndef K4_PLANT_STAGE
#define K4_PLANT_STAGE -1
#endif

// K4_UNROLL before a loop of constant trip count: unrolled on NVIDIA, so that the loads it
// issues are all in flight before the first is used; left to the compiler elsewhere (the host
// emulation; hipcc, which -Werror would stop on a loop it cannot unroll).
#if defined(__CUDA_ARCH__)
#define K4_UNROLL _Pragma("unroll")
#else
#define K4_UNROLL
#endif

// K4_PLANT_FAST=1: the fast up/gate kernel (moe_fast.cu, the K4_FAST=1 path) flips bit 0 of one
// mid element -- the emulation's probe that the suite checks the fast kernels' own outputs.
#ifndef K4_PLANT_FAST
#define K4_PLANT_FAST 0
#endif

namespace k4::gpu {

constexpr int kPlantStage = K4_PLANT_STAGE;
constexpr bool kPlantFast = K4_PLANT_FAST != 0;

// ------------------------------------------------------------------------------ contexts
// The GPU's: the items of a phase spread over the block's threads, a barrier after each phase.
struct BlockCtx {
  int bx, by, bz;
  int threads;
  template <class F>
  __device__ void each(int n, F&& f) {
    for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) f(i);
    __syncthreads();
  }
  template <class F>
  __device__ void one(F&& f) {
    if (threadIdx.x == 0) f();
    __syncthreads();
  }
};

template <class Body>
__global__ void __launch_bounds__(512) block_kernel(Body body) {
  K4_DYNAMIC_SMEM(k4_smem);
  k4_grid_dep_start();
  BlockCtx c{int(blockIdx.x), int(blockIdx.y), int(blockIdx.z), int(blockDim.x)};
  body(c, k4_smem);
}

#if defined(K4_HOST_EMULATION)
// The emulation's: one item after another, in one thread.
struct ItemCtx {
  int bx, by, bz;
  int threads;
  template <class F>
  void each(int n, F&& f) {
    for (int i = 0; i < n; ++i) f(i);
  }
  template <class F>
  void one(F&& f) {
    f();
  }
};
// A body whose items use warp collectives (split.cu's tensor-core body specializes this to
// true) needs the GPU's threads: the emulation runs it as block_kernel on device/simt.hpp's
// fibers, every other body item by item.
template <class Body>
struct body_has_warps : std::false_type {};
#endif

struct Grid {
  int x = 1, y = 1, z = 1;
};

// Runs body over grid with `threads` threads a block and smem_bytes of shared memory.
template <class Body>
void launch(const Body& body, Grid grid, int threads, size_t smem_bytes, hipStream_t stream) {
  if (grid.x <= 0 || grid.y <= 0 || grid.z <= 0) return;
#if defined(K4_HOST_EMULATION)
  if constexpr (body_has_warps<Body>::value) {
    k4_launch_dependent(block_kernel<Body>, dim3(unsigned(grid.x), unsigned(grid.y), unsigned(grid.z)),
                        dim3(unsigned(threads)), smem_bytes, stream, body);
    return;
  }
  (void)stream;
  std::vector<unsigned char> smem(smem_bytes + 16);
  for (int bz = 0; bz < grid.z; ++bz)
    for (int by = 0; by < grid.y; ++by)
      for (int bx = 0; bx < grid.x; ++bx) {
        std::memset(smem.data(), 0xA5, smem.size());  // garbage, as the GPU's is
        ItemCtx c{bx, by, bz, threads};
        body(c, smem.data());
      }
#else
  static size_t allowed = 48 * 1024;  // the dynamic shared memory limit raised so far (one thread launches)
  if (smem_bytes > allowed) {
    K4_HIP_CHECK(hipFuncSetAttribute(reinterpret_cast<const void*>(&block_kernel<Body>),
                                     hipFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
    allowed = smem_bytes;
  }
  k4_launch_dependent(block_kernel<Body>, dim3(unsigned(grid.x), unsigned(grid.y), unsigned(grid.z)),
                     dim3(unsigned(threads)), smem_bytes, stream, body);
  K4_HIP_CHECK_LAUNCH();
#endif
}

// Shared memory carved in order: take<T>(n) returns the next n T's, 16-byte aligned.
struct SmemCarver {
  unsigned char* base;
  size_t used = 0;
  template <class T>
  K4_HD T* take(size_t n) {
    used = (used + 15) & ~size_t(15);
    T* p = reinterpret_cast<T*>(base + used);
    used += n * sizeof(T);
    return p;
  }
};
// The bytes a carver would use for the same sequence of takes (host side).
struct SmemSize {
  size_t used = 0;
  template <class T>
  SmemSize& add(size_t n) {
    used = ((used + 15) & ~size_t(15)) + n * sizeof(T);
    return *this;
  }
};

// --------------------------------------------------------------------------- device config
// The Config as plain data a kernel can take by value (Config holds a std::string).
struct DevCfg {
  int heads, head_dim, hidden, n_routed, top_k, inter;
  int sparse_block, topk_blocks, page, n_split, kv_page_stride, one_kv_scale;
  int waves, lanes, o_rows, dn_rows, ug_rows, tp, init_blocks, local_blocks;
  int wide_from, ag_rs_from;
  float sm_scale, eps, route_scale, shared_weight, swiglu_limit;
  // the variant (reference/variant.hpp), each switch as the index of its value (0: the seed's)
  int router_gate, round_logit, wide_live_rows, wide_down_order, kv_scale, narrow_final, shared_fp8, index_cp, experts;
  // derived
  int o_k, threads, ppb, split_keys, moe_slots, n_experts, table_words, long_from_blocks;
};

inline DevCfg dev_cfg(const Config& c) {
  DevCfg d{};
  d.heads = c.heads, d.head_dim = c.head_dim, d.hidden = c.hidden, d.n_routed = c.n_routed;
  d.top_k = c.top_k, d.inter = c.inter, d.sparse_block = c.sparse_block, d.topk_blocks = c.topk_blocks;
  d.page = c.page, d.n_split = c.n_split, d.kv_page_stride = c.kv_page_stride;
  d.one_kv_scale = c.one_kv_scale() ? 1 : 0;
  d.waves = c.waves, d.lanes = c.lanes, d.o_rows = c.o_rows, d.dn_rows = c.dn_rows, d.ug_rows = c.ug_rows;
  d.tp = c.tp, d.init_blocks = c.init_blocks, d.local_blocks = c.local_blocks;
  d.wide_from = c.wide_from, d.ag_rs_from = c.ag_rs_from;
  d.sm_scale = c.sm_scale, d.eps = c.eps, d.route_scale = c.route_scale, d.shared_weight = c.shared_weight;
  d.swiglu_limit = c.swiglu_limit;
  const Variant& v = c.variant;
  d.router_gate = int(v.router_gate), d.round_logit = v.round_logit ? 1 : 0, d.wide_live_rows = int(v.wide_live_rows);
  d.wide_down_order = int(v.wide_down_order), d.kv_scale = int(v.kv_scale), d.narrow_final = int(v.narrow_final);
  d.shared_fp8 = v.shared_fp8 ? 1 : 0, d.index_cp = v.index_cp ? 1 : 0, d.experts = int(v.experts);
  d.o_k = c.o_k(), d.threads = c.threads(), d.ppb = c.pages_per_block(), d.split_keys = c.split_keys();
  d.moe_slots = c.moe_slots(), d.n_experts = c.n_experts(), d.table_words = c.sparse_table_words();
  d.long_from_blocks = c.long_from_blocks();
  return d;
}

// ------------------------------------------------------------------------------ loads
// 16 bytes from a 16-byte aligned address (one vector load on the GPU).
struct Bytes16 {
  uint8_t b[16];
};
K4_BODY Bytes16 load16(const uint8_t* p) {
  Bytes16 r;
#if defined(K4_HOST_EMULATION)
  std::memcpy(r.b, p, 16);
#else
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  __builtin_memcpy(r.b, &v, 16);
#endif
  return r;
}
K4_BODY void store16(uint8_t* p, const Bytes16& v) {
#if defined(K4_HOST_EMULATION)
  std::memcpy(p, v.b, 16);
#else
  uint4 w;
  __builtin_memcpy(&w, v.b, 16);
  *reinterpret_cast<uint4*>(p) = w;
#endif
}

}  // namespace k4::gpu
