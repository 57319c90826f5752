// ceilings.cu -- the H200's ceilings for K4's step, measured in one run (k4_ceilings).
//
// What a fused, bit-exact K4 step can reach is bounded by a handful of machine rates; this
// program measures each with the access pattern or instruction the kernel uses, so that every
// kernel figure can be read as a ratio to a ceiling measured on the same card in the same run
// (docs/performance.md, "Ceilings"):
//   stream      read-only streaming bandwidth: 16-byte ld.global.cs (evict-first) loads,
//               U independent loads a thread in flight, grid = k CTAs a SM; best and each
//   tma         cp.async.bulk (1D bulk copy engine) into a 4-stage shared-memory ring a CTA,
//               mbarrier completion (the pipeline of PERF.md §4)
//   copy        cudaMemcpy device to device (read + write bytes), the classic figure
//   mma         mma.sync.m16n8k32 s8 x s8 -> s32: MMAs a clock a SM and TOPS (8 independent
//               accumulators a warp)
//   ops         the block epilogue's conversions a clock a SM: cvt.rn.f32.s32, cvt.rn.f32.s64,
//               the magic-bias integer -> float (IADD + FADD), the PRMT pair decode of 8 E2M1
//               codes to s8 (2 PRMT + SHF + LOP3)
//   flag        release/acquire flag round trip between two CTAs on different SMs
//   launch      back-to-back kernel launches on a stream (gap a launch), launch + sync
//               latency, a graph of empty kernels (gap a node), cooperative launches, a grid
//               barrier (cooperative groups grid.sync)
//   floor       the weights-only step: one launch streaming exactly the bytes a K4 step must
//               read (w_o, w_gate, the step's experts, the KV it selects), L2 flushed before
//               every repeat; 4 ranks on this GPU and one rank, S = 1, 4, 16
// Every figure is a median over repeats (CUDA events). Nothing asserts a time: it is a program.
//
//   k4_ceilings [--quick] [--md FILE]
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cg = cooperative_groups;

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "k4_ceilings: %s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_),    \
                   __FILE__, __LINE__);                                                           \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

namespace {

int g_sms = 132;
double g_clk_hz = 1.98e9;  // measured in main (clock64 against globaltimer)
std::string g_md;

void md(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void md(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fputs(buf, stdout);
  g_md += buf;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  ~Timer() { cudaEventDestroy(a), cudaEventDestroy(b); }
  void start(cudaStream_t s = 0) { CK(cudaEventRecord(a, s)); }
  double stop_us(cudaStream_t s = 0) {
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return double(ms) * 1e3;
  }
};

// ------------------------------------------------------------------------- L2 flush
// Writing a buffer twice the L2's size evicts every line a step could have left.
struct Flusher {
  void* p = nullptr;
  size_t n = 0;
  Flusher() {
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    n = size_t(std::max(l2, 1 << 20)) * 2;
    CK(cudaMalloc(&p, n));
  }
  ~Flusher() { cudaFree(p); }
  void flush(cudaStream_t s = 0) { CK(cudaMemsetAsync(p, int(n & 0xff), n, s)); }
};

// ------------------------------------------------------------------------- clock
__global__ void clock_probe(unsigned long long* out, long long spin_ns) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while (t1 - t0 < (unsigned long long)spin_ns);
  const long long c1 = clock64();
  out[0] = t1 - t0, out[1] = (unsigned long long)(c1 - c0);
}

double measure_clock() {
  unsigned long long* d;
  CK(cudaMalloc(&d, 16));
  clock_probe<<<1, 1>>>(d, 1000000);  // warm-up
  clock_probe<<<1, 1>>>(d, 20000000);
  CK(cudaGetLastError());
  unsigned long long h[2];
  CK(cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  return double(h[1]) / (double(h[0]) * 1e-9);
}

// ------------------------------------------------------------------------- streaming read
__device__ __forceinline__ int4 ld_cs(const int4* p) {
  int4 v;
  asm volatile("ld.global.cs.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Each thread keeps U 16-byte loads in flight; the grid strides over n16 vectors. The xor of
// everything is stored only if it hits a value no input makes, so no load is dead code.
template <int U>
__global__ void __launch_bounds__(512) stream_read(const int4* __restrict__ p, size_t n16, int* sink) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int acc = 0;
  for (; i + (U - 1) * stride < n16; i += U * stride) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld_cs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const int4 v = ld_cs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7eadbeef) sink[0] = acc;
}

using ReadKernel = void (*)(const int4*, size_t, int*);

double time_read(ReadKernel k, int blocks, const void* buf, size_t bytes, int reps, Flusher* fl, int* sink) {
  Timer t;
  std::vector<double> us;
  k<<<blocks, 512>>>(static_cast<const int4*>(buf), bytes / 16, sink);
  CK(cudaGetLastError());
  for (int r = 0; r < reps; ++r) {
    if (fl) fl->flush();
    t.start();
    k<<<blocks, 512>>>(static_cast<const int4*>(buf), bytes / 16, sink);
    us.push_back(t.stop_us());
  }
  CK(cudaGetLastError());
  return median(us);
}

// ------------------------------------------------------------------------- TMA ring
constexpr int kTmaStages = 4, kTmaChunk = 32 * 1024;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// One thread issues 1D bulk copies of kTmaChunk bytes into a 4-stage ring; every thread waits
// on the stage's mbarrier, reads one word a thread (the consumer's touch), and the stage is
// refilled after a CTA barrier. Chunks are strided over the grid. A spin bound turns a
// protocol error into a flag instead of a hang.
__global__ void __launch_bounds__(256) tma_ring(const uint8_t* __restrict__ src, size_t chunks, int* sink, int* err) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t bar[kTmaStages];
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kTmaStages; ++s)
      asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(smem_addr(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  auto issue = [&](size_t c, int s) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(smem_addr(&bar[s])), "r"(kTmaChunk));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(ring + size_t(s) * kTmaChunk)),
        "l"(src + c * kTmaChunk), "r"(kTmaChunk), "r"(smem_addr(&bar[s]))
        : "memory");
  };
  size_t c = blockIdx.x;
  if (tid == 0)
    for (int s = 0; s < kTmaStages; ++s)
      if (c + size_t(s) * gridDim.x < chunks) issue(c + size_t(s) * gridDim.x, s);
  int acc = 0;
  uint32_t phase = 0;
  for (int s = 0; c < chunks; c += gridDim.x) {
    uint32_t done = 0;
    for (long spin = 0; !done; ++spin) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(smem_addr(&bar[s])), "r"(phase));
      if (spin > (1L << 26)) {
        atomicExch(err, 1);
        return;
      }
    }
    acc ^= reinterpret_cast<const int*>(ring + size_t(s) * kTmaChunk)[tid * 8];
    __syncthreads();
    const size_t next = c + size_t(kTmaStages) * gridDim.x;
    if (tid == 0 && next < chunks) issue(next, s);
    if (++s == kTmaStages) s = 0, phase ^= 1;
  }
  if (acc == 0x7eadbeef) sink[0] = acc;
}

// ------------------------------------------------------------------------- mma.sync s8
template <int CHAINS>
__global__ void __launch_bounds__(256) mma_s8(int iters, int seed, int* out) {
  uint32_t a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = 0x01020304u * (threadIdx.x + seed + i);
  for (int i = 0; i < 2; ++i) b[i] = 0x05060708u ^ (threadIdx.x * 77 + i);
  int c[CHAINS][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < CHAINS; ++k)
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};"
          : "+r"(c[k][0]), "+r"(c[k][1]), "+r"(c[k][2]), "+r"(c[k][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  int s = 0;
  for (int k = 0; k < CHAINS; ++k) s += c[k][0] + c[k][1] + c[k][2] + c[k][3];
  if (s == 0x7eadbeef) out[0] = s;
}

// ------------------------------------------------------------------------- conversions
// Each kernel does `iters` rounds of 8 independent operations a thread; the result feeds the
// next round so nothing folds away. Rates are operations (or decoded weights) a clock a SM.
__global__ void __launch_bounds__(256) op_i2f(int iters, int* out) {
  int v[8];
  float f = 0;
  for (int k = 0; k < 8; ++k) v[k] = threadIdx.x * 131 + k;
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float x;
      asm volatile("cvt.rn.f32.s32 %0, %1;" : "=f"(x) : "r"(v[k]));
      v[k] ^= __float_as_int(x);
    }
  for (int k = 0; k < 8; ++k) f += float(v[k]);
  if (f == 1.2345f) out[0] = 1;
}

__global__ void __launch_bounds__(256) op_i64f(int iters, int* out) {
  long long v[8];
  for (int k = 0; k < 8; ++k) v[k] = threadIdx.x * 131 + k;
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float x;
      asm volatile("cvt.rn.f32.s64 %0, %1;" : "=f"(x) : "l"(v[k]));
      v[k] ^= __float_as_int(x);
    }
  long long s = 0;
  for (int k = 0; k < 8; ++k) s += v[k];
  if (s == 0x7eadbeef) out[0] = 1;
}

// The exact integer -> float of PERF.md §3.4: an accumulator started at the bits of 1.5 * 2^23
// holds those bits plus t; subtracting 1.5 * 2^23 as a float gives t exactly (|t| < 2^22).
__global__ void __launch_bounds__(256) op_magic(int iters, int* out) {
  int v[8];
  for (int k = 0; k < 8; ++k) v[k] = threadIdx.x + k;
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float x = __int_as_float(v[k] + 0x4B400000) - 12582912.0f;
      v[k] ^= __float_as_int(x);
    }
  int s = 0;
  for (int k = 0; k < 8; ++k) s += v[k];
  if (s == 0x7eadbeef) out[0] = 1;
}

// 8 E2M1 codes (one 32-bit word) -> two words of P and Q bytes each (P + Q = 2 * E2M1):
// 2 PRMT for the low 4 codes, SHF + 2 PRMT for the high 4, one LOP3 for the sign flip.
__global__ void __launch_bounds__(256) op_prmt(int iters, int* out) {
  uint32_t w[4];
  for (int k = 0; k < 4; ++k) w[k] = 0x9abcdef1u * (threadIdx.x + k);
  const uint32_t tp_lo = 0x04030200u, tp_hi = 0x0d090705u;  // TP = {0,2,3,4,5,7,9,13} packed
  const uint32_t tq_lo = 0xfdfeff00u, tq_hi = 0xf4f8fafcu;
  uint32_t acc = 0;
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint32_t p0, p1, q0, q1;
      const uint32_t x = w[k] ^ 0x88888888u, hi = w[k] >> 16, xhi = x >> 16;
      asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(p0) : "r"(tp_lo), "r"(tp_hi), "r"(w[k]));
      asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(q0) : "r"(tq_lo), "r"(tq_hi), "r"(x));
      asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(p1) : "r"(tp_lo), "r"(tp_hi), "r"(hi));
      asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(q1) : "r"(tq_lo), "r"(tq_hi), "r"(xhi));
      acc += p0 ^ q0 ^ p1 ^ q1;
      w[k] += acc;
    }
  if (acc == 0x7eadbeef) out[0] = 1;
}

// ------------------------------------------------------------------------- flag round trip
__global__ void flag_pingpong(volatile int* flags, int rounds, int* err) {
  // CTA 0 writes ping = i (release), CTA 1 waits for it (acquire) and writes pong = i
  if (threadIdx.x != 0) return;
  int* ping = const_cast<int*>(flags);
  int* pong = const_cast<int*>(flags + 32);
  for (int i = 1; i <= rounds; ++i) {
    int* mine = blockIdx.x == 0 ? ping : pong;
    int* theirs = blockIdx.x == 0 ? pong : ping;
    if (blockIdx.x == 0) asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(mine), "r"(i) : "memory");
    int v = 0;
    for (long spin = 0;; ++spin) {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(theirs) : "memory");
      if (v >= i) break;
      if (spin > (1L << 28)) {
        atomicExch(err, 2);
        return;
      }
    }
    if (blockIdx.x == 1) asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(mine), "r"(i) : "memory");
  }
}

// ------------------------------------------------------------------------- launches
__global__ void empty_kernel() {}

__global__ void grid_barrier(int rounds) {
  cg::grid_group g = cg::this_grid();
  for (int i = 0; i < rounds; ++i) g.sync();
}

// ========================================================================= the sections
void section_stream(bool quick, double* best_gbs) {
  const size_t bytes = size_t(quick ? 1 : 4) << 30;
  void* buf;
  int* sink;
  CK(cudaMalloc(&buf, bytes));
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(buf, 0x5a, bytes));
  md("\n### Streaming read (16-byte ld.global.cs, %.1f GiB, median of 20)\n\n", double(bytes) / (1 << 30));
  md("| loads in flight a thread | CTAs of 512 a SM | GB/s |\n|---|---|---|\n");
  struct K {
    int u;
    ReadKernel k;
  } ks[] = {{1, stream_read<1>}, {2, stream_read<2>}, {4, stream_read<4>}, {8, stream_read<8>}};
  double best = 0;
  for (const K& k : ks)
    for (int per_sm : {1, 2, 4}) {
      const double us = time_read(k.k, g_sms * per_sm, buf, bytes, 20, nullptr, sink);
      const double gbs = double(bytes) / us * 1e-3;
      best = std::max(best, gbs);
      md("| %d | %d | %.0f |\n", k.u, per_sm, gbs);
    }
  *best_gbs = best;
  // device copy, the classic figure (read + write)
  void* dst;
  CK(cudaMalloc(&dst, bytes / 2));
  Timer t;
  std::vector<double> us;
  CK(cudaMemcpy(dst, buf, bytes / 2, cudaMemcpyDeviceToDevice));
  for (int r = 0; r < 10; ++r) {
    t.start();
    CK(cudaMemcpyAsync(dst, buf, bytes / 2, cudaMemcpyDeviceToDevice));
    us.push_back(t.stop_us());
  }
  md("\nbest streaming read: **%.0f GB/s**; device-to-device copy (read + write): %.0f GB/s\n", best,
     double(bytes) / median(us) * 1e-3);
  CK(cudaFree(dst));
  // TMA ring
  int* err;
  CK(cudaMalloc(&err, 4));
  CK(cudaMemset(err, 0, 4));
  const size_t smem = size_t(kTmaStages) * kTmaChunk;
  CK(cudaFuncSetAttribute(tma_ring, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const size_t chunks = bytes / kTmaChunk;
  std::vector<double> tu;
  tma_ring<<<g_sms, 256, smem>>>(static_cast<const uint8_t*>(buf), chunks, sink, err);
  CK(cudaGetLastError());
  for (int r = 0; r < 10; ++r) {
    t.start();
    tma_ring<<<g_sms, 256, smem>>>(static_cast<const uint8_t*>(buf), chunks, sink, err);
    tu.push_back(t.stop_us());
  }
  int herr = 0;
  CK(cudaMemcpy(&herr, err, 4, cudaMemcpyDeviceToHost));
  md("TMA ring (cp.async.bulk 1D, %d stages x %d KB, one CTA a SM): %s%.0f GB/s\n", kTmaStages, kTmaChunk / 1024,
     herr ? "(SPIN BOUND HIT: figure invalid) " : "", double(bytes) / median(tu) * 1e-3);
  CK(cudaFree(err));
  CK(cudaFree(buf));
  CK(cudaFree(sink));
}

template <class F>
double time_kernel_us(F launch, int reps) {
  Timer t;
  std::vector<double> us;
  launch();
  CK(cudaGetLastError());
  for (int r = 0; r < reps; ++r) {
    t.start();
    launch();
    us.push_back(t.stop_us());
  }
  CK(cudaGetLastError());
  return median(us);
}

void section_compute() {
  int* out;
  CK(cudaMalloc(&out, 64));
  md("\n### Instruction rates (median of 10; clock %.0f MHz measured)\n\n", g_clk_hz / 1e6);
  md("| what | per clock a SM | total |\n|---|---|---|\n");
  const int blocks = g_sms * 4, threads = 256, iters = 4096;
  const double warps = double(blocks) * threads / 32;
  {
    const double us = time_kernel_us([&] { mma_s8<8><<<blocks, threads>>>(iters, 1, out); }, 10);
    const double mmas = warps * iters * 8;
    md("| mma.sync m16n8k32 s8 (8 chains a warp) | %.3f MMA | %.0f TOPS |\n", mmas / (us * 1e-6) / g_clk_hz / g_sms,
       mmas * 4096 * 2 / (us * 1e-6) / 1e12);
  }
  {
    const double us = time_kernel_us([&] { mma_s8<2><<<blocks, threads>>>(iters, 1, out); }, 10);
    const double mmas = warps * iters * 2;
    md("| mma.sync m16n8k32 s8 (2 chains a warp) | %.3f MMA | %.0f TOPS |\n", mmas / (us * 1e-6) / g_clk_hz / g_sms,
       mmas * 4096 * 2 / (us * 1e-6) / 1e12);
  }
  const double thr_ops = double(blocks) * threads * iters * 8;
  struct Op {
    const char* name;
    void (*k)(int, int*);
    double per;  // results an op-iteration
  } ops[] = {{"cvt.rn.f32.s32", op_i2f, 1},
             {"cvt.rn.f32.s64", op_i64f, 1},
             {"magic-bias int -> float (IADD + FADD)", op_magic, 1},
             {"E2M1 -> s8 pair decode (4 PRMT + SHF + LOP3 per 8 codes), codes", op_prmt, 1}};
  for (const Op& o : ops) {
    const double us = time_kernel_us([&] { o.k<<<blocks, threads>>>(iters, out); }, 10);
    const double n = o.k == op_prmt ? double(blocks) * threads * iters * 4 * 8 : thr_ops;
    md("| %s | %.1f | %.0f G/s |\n", o.name, n / (us * 1e-6) / g_clk_hz / g_sms, n / (us * 1e-6) / 1e9);
  }
  CK(cudaFree(out));
}

void section_latency() {
  md("\n### Latencies (median)\n\n| what | us |\n|---|---|\n");
  int *flags, *err;
  CK(cudaMalloc(&flags, 256));
  CK(cudaMalloc(&err, 4));
  CK(cudaMemset(err, 0, 4));
  const int rounds = 20000;
  std::vector<double> rt;
  for (int r = 0; r < 5; ++r) {
    CK(cudaMemset(flags, 0, 256));
    Timer t;
    t.start();
    flag_pingpong<<<2, 32>>>(flags, rounds, err);
    rt.push_back(t.stop_us() / rounds);
  }
  CK(cudaGetLastError());
  int herr = 0;
  CK(cudaMemcpy(&herr, err, 4, cudaMemcpyDeviceToHost));
  md("| flag round trip (st.release.gpu / ld.acquire.gpu, 2 CTAs)%s | %.2f |\n", herr ? " SPIN BOUND HIT" : "",
     median(rt));
  // launches
  const int n = 1000;
  Timer t;
  empty_kernel<<<1, 32>>>();
  CK(cudaDeviceSynchronize());
  std::vector<double> gap, lat, ggap, coop, gb;
  for (int r = 0; r < 5; ++r) {
    t.start();
    for (int i = 0; i < n; ++i) empty_kernel<<<g_sms, 128>>>();
    gap.push_back(t.stop_us() / n);
  }
  for (int r = 0; r < 50; ++r) {
    t.start();
    empty_kernel<<<g_sms, 128>>>();
    lat.push_back(t.stop_us());
  }
  md("| stream launch gap (empty kernels back to back, %d CTAs) | %.2f |\n", g_sms, median(gap));
  md("| one launch, event to event | %.2f |\n", median(lat));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  const int nodes = 100;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < nodes; ++i) empty_kernel<<<g_sms, 128, 0, s>>>();
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  for (int r = 0; r < 20; ++r) {
    t.start(s);
    CK(cudaGraphLaunch(ge, s));
    ggap.push_back(t.stop_us(s) / nodes);
  }
  md("| graph gap a node (%d empty kernels, replay) | %.2f |\n", nodes, median(ggap));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  // cooperative
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_barrier, 128, 0));
  int zero = 0, many = 1000;
  void* argz[] = {&zero};
  void* argm[] = {&many};
  CK(cudaLaunchCooperativeKernel((void*)grid_barrier, g_sms, 128, argz, 0, s));
  CK(cudaStreamSynchronize(s));
  for (int r = 0; r < 5; ++r) {
    t.start(s);
    for (int i = 0; i < 100; ++i) CK(cudaLaunchCooperativeKernel((void*)grid_barrier, g_sms, 128, argz, 0, s));
    coop.push_back(t.stop_us(s) / 100);
  }
  for (int r = 0; r < 5; ++r) {
    t.start(s);
    CK(cudaLaunchCooperativeKernel((void*)grid_barrier, g_sms, 128, argm, 0, s));
    gb.push_back(t.stop_us(s) / many);
  }
  md("| cooperative launch gap (%d CTAs, back to back) | %.2f |\n", g_sms, median(coop));
  md("| grid barrier (cooperative groups grid.sync, %d CTAs of 128) | %.2f |\n", g_sms, median(gb));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(flags));
  CK(cudaFree(err));
}

// The bytes one rank's step must read (the full preset, minimax-m3-tp4), PERF.md §8: w_o with
// its row scales, the router gate and bias, each distinct expert's w13 + s13 + w2 + s2, and
// the KV a token selects (2048 keys x (128 K + 128 V + 8 scale bytes)). Distinct experts: the
// shared one plus the expected distinct routed experts of S tokens picking 4 of 128 each.
double step_bytes_one_rank(int S, double* experts_out) {
  const double H = 6144, OK = 2048, E = 128, I = 768;
  const double routed = E * (1 - std::pow(1 - 4.0 / E, S));
  const double experts = routed + 1;
  const double expert_bytes = 2 * I * H / 2 + 2 * I * H / 32 + H * I / 2 + H * I / 32;
  if (experts_out) *experts_out = experts;
  return H * OK + H * 4 + E * H * 2 + E * 4 + H * 2 + experts * expert_bytes + S * 2048.0 * 264;
}

void section_floor(double best_gbs) {
  md("\n### Weights-only step: one launch reading a step's bytes, L2 flushed before each (median of 50)\n\n");
  md("| ranks | S | experts a rank | bytes | us | GB/s | at the best streaming rate us |\n|---|---|---|---|---|---|---|\n");
  const double max_bytes = 4 * step_bytes_one_rank(16, nullptr);
  void* buf;
  int* sink;
  CK(cudaMalloc(&buf, size_t(max_bytes) + (1 << 20)));
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(buf, 0x3c, size_t(max_bytes)));
  Flusher fl;
  for (int ranks : {4, 1})
    for (int S : {1, 4, 16}) {
      double experts = 0;
      const double bytes = ranks * step_bytes_one_rank(S, &experts);
      const size_t nb = size_t(bytes) & ~size_t(15);
      double best = 1e30;
      for (int per_sm : {2, 4}) best = std::min(best, time_read(stream_read<4>, g_sms * per_sm, buf, nb, 50, &fl, sink));
      md("| %d | %d | %.1f | %.1f MB | %.1f | %.0f | %.1f |\n", ranks, S, experts, bytes / 1e6, best,
         bytes / best * 1e-3, bytes / best_gbs * 1e-3);
    }
  CK(cudaFree(buf));
  CK(cudaFree(sink));
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string md_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--md") && i + 1 < argc) md_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: k4_ceilings [--quick] [--md FILE]\n");
      return 2;
    }
  }
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  g_sms = p.multiProcessorCount;
  g_clk_hz = measure_clock();
  md("## k4_ceilings: %s, %d SMs, L2 %d MB, clock %.0f MHz (measured)\n", p.name, g_sms, p.l2CacheSize >> 20,
     g_clk_hz / 1e6);
  double best = 0;
  section_stream(quick, &best);
  section_compute();
  section_latency();
  section_floor(best);
  if (!md_path.empty()) {
    FILE* f = std::fopen(md_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "k4_ceilings: cannot write %s\n", md_path.c_str());
      return 2;
    }
    std::fputs(g_md.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
