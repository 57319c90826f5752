// simt.hpp -- the host emulation's threads: the kernels written as CUDA threads (threadIdx,
// __syncthreads, warp shuffles, mma.sync: device/moe_fast.cu, oproj_fast.cu, split.cu's
// tensor-core body) run on the CPU, so that the CPU suite checks their index arithmetic, their
// fragment maps and their orders against the model, as it does the block bodies' (kernel.hpp).
//
// Each thread of a block is a fiber (boost.context): one OS thread runs them one at a time, and
// a thread gives way only where it waits -- at a block barrier or a warp collective. So there
// are no data races and no locks; a thread's registers are its fiber's stack; __shared__ arrays
// are static storage, a copy a host thread (the blocks of a launch run one after another;
// launches on two host threads apart), and the dynamic shared memory is a buffer filled with
// 0xA5 bytes before each block, as kernel.hpp's. A warp collective
// (a shuffle, an m16n8k32 MMA) is completed by the last of the warp's 32 lanes to reach it,
// which computes every lane's result from their deposits: the MMA by xmma's mma_s8_warp, over
// PTX's fragment maps (the GPU suite checks those maps against the hardware).
//
// Checked here, as errors naming the kernel and the block: a barrier or collective that some
// thread of the block never reaches (a hang on the GPU), the lanes of a warp at different
// collectives, a collective after a lane of the warp has exited.
// Not modelled: the GPU's memory model (a fiber sees another's writes at once), timing, the
// hardware's own arithmetic (tests/gpu on the device).
#pragma once

#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// ---- the CUDA vocabulary the warp kernels are written in (host emulation only)
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x, y, z;
};
struct alignas(8) uint2 {
  uint32_t x, y;
};
struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
inline uint2 make_uint2(uint32_t x, uint32_t y) { return uint2{x, y}; }
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return uint4{x, y, z, w}; }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local  // one copy a host thread: emulated launches may run in parallel
#define __align__(n) __attribute__((aligned(n)))
// The dynamic shared memory of the launch (the GPU's `extern __shared__` array).
#define K4_DYNAMIC_SMEM(name) unsigned char* const name = ::k4::simt::dynamic_smem()

namespace k4::simt {

// The running thread's coordinates: set by the scheduler before it resumes a thread (in k4::simt,
// so that a library of emulated kernels exports no bare `threadIdx`; the kernels' spelling below).
inline thread_local uint3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim{1, 1, 1}, gridDim{1, 1, 1};

namespace ctx = boost::context;

constexpr int kWarp = 32;
constexpr int kInWords = 10;  // the most a lane deposits: an MMA's A (4), B (2) and C (4)
constexpr int kOutWords = 4;
// A thread's stack: the deepest kernel frames are a few KB; -O0 builds take several times more.
constexpr size_t kStackBytes = 256 * 1024;

// Stacks kept for the next block of a launch (mmap and mprotect once a thread, not once a block).
class StackPool {
 public:
  ~StackPool() {
    for (ctx::stack_context& s : free_) alloc_.deallocate(s);
  }
  ctx::stack_context allocate() {
    if (free_.empty()) return alloc_.allocate();
    const ctx::stack_context s = free_.back();
    free_.pop_back();
    return s;
  }
  void deallocate(ctx::stack_context& s) noexcept { free_.push_back(s); }

 private:
  ctx::protected_fixedsize_stack alloc_{kStackBytes};  // a guard page below each stack
  std::vector<ctx::stack_context> free_;
};
struct PoolRef {  // the StackAllocator boost.context copies
  StackPool* pool;
  ctx::stack_context allocate() { return pool->allocate(); }
  void deallocate(ctx::stack_context& s) noexcept { pool->deallocate(s); }
};

struct Warp {
  int count = 0;               // lanes at the open collective
  uint64_t done = 0;           // collectives completed
  int exited = 0;              // lanes that have returned
  const char* what = nullptr;  // the open collective
  uint32_t in[kWarp][kInWords];
  uint32_t out[kWarp][kOutWords];
};

// One block's threads and their barriers.
class Block {
 public:
  Block(const char* kernel, StackPool& pool, unsigned char* dyn) : kernel_(kernel), pool_(pool), dyn_(dyn) {}

  template <class Body>
  void run(Body& body);

  unsigned char* dyn() const { return dyn_; }
  void sync_threads();
  // Lane l deposits in (nin words); the last lane to arrive calls
  // complete(in, out, lanes) once for the warp; each lane gets out[l] (nout words).
  template <class Complete>
  void collective(const char* what, const uint32_t* in, int nin, uint32_t* out, int nout, Complete&& complete);

 private:
  void yield() { sinks_[cur_] = std::move(sinks_[cur_]).resume(); }
  void finish(int i);
  [[noreturn]] void fail(const std::string& why) const;
  std::string where() const;
  void set_thread(int i);

  const char* kernel_;
  StackPool& pool_;
  unsigned char* dyn_;
  int n_ = 0, cur_ = 0, live_ = 0;
  int bar_count_ = 0;
  uint64_t bar_done_ = 0, progress_ = 0;
  std::vector<ctx::fiber> threads_, sinks_;
  std::vector<uint8_t> exited_;
  std::vector<Warp> warps_;
  std::exception_ptr error_;
};

// The block running now (null outside a warp launch); plain pointer: no thread_local destructor.
inline thread_local Block* t_block = nullptr;

inline Block& block() {
  if (t_block == nullptr) throw std::logic_error("host emulation: a barrier or warp collective outside a warp launch");
  return *t_block;
}
inline unsigned char* dynamic_smem() { return block().dyn(); }

inline std::string Block::where() const {
  return std::string("kernel ") + kernel_ + ", block (" + std::to_string(blockIdx.x) + ", " + std::to_string(blockIdx.y) +
         ", " + std::to_string(blockIdx.z) + ")";
}
inline void Block::fail(const std::string& why) const { throw std::logic_error("host emulation: " + where() + ": " + why); }

inline void Block::set_thread(int i) {
  cur_ = i;
  const unsigned bx = blockDim.x, by = blockDim.y;
  threadIdx = uint3{unsigned(i) % bx, unsigned(i) / bx % by, unsigned(i) / (bx * by)};
}

inline void Block::finish(int i) {
  exited_[size_t(i)] = 1;
  --live_;
  ++warps_[size_t(i / kWarp)].exited;
  ++progress_;
  if (bar_count_ > 0 && bar_count_ == live_) bar_count_ = 0, ++bar_done_;  // exited threads are not waited for
}

template <class Body>
void Block::run(Body& body) {
  n_ = int(blockDim.x * blockDim.y * blockDim.z);
  live_ = n_, bar_count_ = 0, bar_done_ = 0, progress_ = 0;
  exited_.assign(size_t(n_), 0);
  warps_.assign(size_t((n_ + kWarp - 1) / kWarp), Warp{});
  sinks_.clear(), sinks_.resize(size_t(n_));
  threads_.clear();
  threads_.reserve(size_t(n_));
  for (int i = 0; i < n_; ++i)
    threads_.emplace_back(std::allocator_arg, PoolRef{&pool_}, [this, &body, i](ctx::fiber&& sink) {
      sinks_[size_t(i)] = std::move(sink);
      try {
        body();
      } catch (const ctx::detail::forced_unwind&) {
        throw;  // the scheduler unwinds a thread it abandons
      } catch (...) {
        if (!error_) error_ = std::current_exception();
      }
      finish(i);
      return std::move(sinks_[size_t(i)]);
    });
  Block* const outer = t_block;
  t_block = this;
  std::string deadlock;
  while (live_ > 0 && !error_) {
    const uint64_t before = progress_;
    for (int i = 0; i < n_ && !error_; ++i) {
      if (exited_[size_t(i)] != 0) continue;
      set_thread(i);
      threads_[size_t(i)] = std::move(threads_[size_t(i)]).resume();
    }
    if (live_ > 0 && !error_ && progress_ == before) {
      deadlock = "threads wait at a barrier or warp collective that " + std::to_string(n_ - live_) +
                 " exited thread(s) or the others never reach (a hang on the GPU)";
      break;
    }
  }
  threads_.clear();  // unwinds the stacks of threads still waiting (after an error)
  sinks_.clear();
  t_block = outer;
  if (error_) std::rethrow_exception(error_);
  if (!deadlock.empty()) fail(deadlock);
}

inline void Block::sync_threads() {
  ++progress_;
  const uint64_t gen = bar_done_;
  if (++bar_count_ == live_) {
    bar_count_ = 0, ++bar_done_;
    return;
  }
  while (bar_done_ == gen) yield();
}

template <class Complete>
void Block::collective(const char* what, const uint32_t* in, int nin, uint32_t* out, int nout, Complete&& complete) {
  const int me = cur_, lane = me % kWarp;
  Warp& w = warps_[size_t(me / kWarp)];
  const int lanes = std::min(kWarp, n_ - (me / kWarp) * kWarp);
  if (w.exited > 0) fail(std::string(what) + " in warp " + std::to_string(me / kWarp) + " after a lane of it has exited");
  if (w.count == 0) {
    w.what = what;
  } else if (w.what != what && std::strcmp(w.what, what) != 0) {  // the same literal, mostly the same address
    fail("the lanes of warp " + std::to_string(me / kWarp) + " are at different collectives (" + w.what + ", " + what + ")");
  }
  std::memcpy(w.in[lane], in, size_t(nin) * 4);
  ++progress_;
  const uint64_t gen = w.done;
  if (++w.count == lanes) {
    complete(w.in, w.out, lanes);
    w.count = 0, ++w.done;
  } else {
    while (w.done == gen) yield();
  }
  std::memcpy(out, w.out[lane], size_t(nout) * 4);
}

// Runs kernel(args...) over grid x block threads: the blocks in order x, then y, then z.
template <class... P, class... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t dyn_bytes, A&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x * block.y * block.z == 0) return;
  std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);  // by value, as a launch passes them
  auto body = [&] { std::apply(kernel, params); };
  StackPool pool;
  std::vector<unsigned char> dyn(dyn_bytes + 16);
  unsigned char* const dyn16 = dyn.data() + (16 - reinterpret_cast<uintptr_t>(dyn.data()) % 16) % 16;
  const uint3 outer_grid = gridDim, outer_block = blockDim, outer_idx = blockIdx, outer_thread = threadIdx;
  gridDim = uint3{grid.x, grid.y, grid.z}, blockDim = uint3{block.x, block.y, block.z};
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::memset(dyn.data(), 0xA5, dyn.size());
        blockIdx = uint3{x, y, z};
        Block b(name, pool, dyn16);
        b.run(body);
      }
  gridDim = outer_grid, blockDim = outer_block, blockIdx = outer_idx, threadIdx = outer_thread;
}

template <class T>
uint32_t to_word(T v) {
  static_assert(sizeof(T) == 4, "the emulated shuffles move 32-bit values");
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
template <class T>
T from_word(uint32_t u) {
  T v;
  std::memcpy(&v, &u, 4);
  return v;
}

// Lane l gets lane src(l)'s value, src(l) = (l's segment of `width` lanes) + its own `lane` word.
template <class T>
T shfl_from(const char* what, T v, int lane_arg, int width, bool xor_mask) {
  const uint32_t in[3] = {to_word(v), uint32_t(lane_arg), uint32_t(width)};
  uint32_t out = 0;
  block().collective(what, in, 3, &out, 1, [xor_mask](const uint32_t (*I)[kInWords], uint32_t (*O)[kOutWords], int lanes) {
    for (int l = 0; l < lanes; ++l) {
      const int wd = int(I[l][2]), base = l - l % wd;
      const int src = xor_mask ? l ^ int(I[l][1]) : base + int(I[l][1]) % wd;
      O[l][0] = src >= base && src < base + wd && src < lanes ? I[src][0] : I[l][0];  // out of range: its own value
    }
  });
  return from_word<T>(out);
}

}  // namespace k4::simt

using k4::simt::blockDim;
using k4::simt::blockIdx;
using k4::simt::gridDim;
using k4::simt::threadIdx;

inline void __syncthreads() { ::k4::simt::block().sync_threads(); }
template <class T>
T k4_shfl_xor(T v, int lane_mask, int width = 32) {
  return ::k4::simt::shfl_from("shfl_xor", v, lane_mask, width, true);
}
template <class T>
T k4_shfl(T v, int src_lane, int width = 32) {
  return ::k4::simt::shfl_from("shfl", v, src_lane, width, false);
}
template <class T>
T __ldcs(const T* p) {
  return *p;
}
inline int atomicExch(int* p, int v) {
  const int old = *p;
  *p = v;
  return old;
}
inline void k4_grid_dep_start() {}
#define k4_launch_dependent(kernel, grid, block, shmem, stream, ...) \
  ((void)(stream), ::k4::simt::launch(#kernel, (kernel), dim3(grid), dim3(block), size_t(shmem), __VA_ARGS__))
