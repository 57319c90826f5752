// oproj_fast.cu -- stage 3, o_proj, on integer tensor cores (device/exact_mma.hpp): bit for bit
// oproj.cu's partial rows, and so reference/stages/oproj.cpp's (stage_o (seed:L968-L1162)).
//
// CTA = (32-row task, rank), 8 warps; warp w: the 16 rows 16 (w / 4) .. of the task in quarter
// w % 4 (the seed's wave w % 4). Lane (g, t) owns the chains of rows g, g + 8 of the tile times
// tokens 2t, 2t + 1 of each n8 column group (NT = 1 for S <= 8, 2 for S <= 16). A block b of
// the quarter, in k order:
//   A: the 16 rows' 32 codes as the 3 balanced limbs of code x 2^9 (a shared table a code),
//      lane t holding bytes 8t .. 8t + 7 of its two rows: the k order of launch_e4m3_limbs' B
//      fragments of attn8, so A and B pair element for element (the hardware's k order inside
//      a block does not change an exact integer sum);
//   9 MMAs into 5 accumulators by limb weight: E_n = sum over i + j = n of A_i B_j, the exact
//      block sum S = sum 2^(7n) E_n (|S| < 2^41);
//   the block value finish_block64(S, 18, unit scales, nan): NaN when the row's or the token's
//      block holds a NaN code, else RNE(S) 2^-18 -- the model's block_dot_ints(.., 18);
//   the chain c = c + value.
// Then tot = 0 + c_0 + c_1 + c_2 + c_3 (shared memory, quarter order), bf16((tot xs) so) and the
// push to the peers, as oproj.cu. The host emulation runs it on device/simt.hpp's threads.
#include <stdexcept>

#include "device/exact_mma.hpp"
#include "device/mutants.hpp"
#include "device/stages.hpp"
#include "reference/numerics/bf16.hpp"

namespace k4::gpu {

bool fast_oproj_supported(const DevCfg& cfg, int tokens) {
  return cfg.o_rows == 32 && cfg.hidden % 32 == 0 && cfg.o_k % (4 * 32) == 0 && tokens >= 1 && tokens <= 16;
}

namespace {

using namespace k4::xmma;

constexpr int kRows = 32, kQuarters = 4, kWarps = 8, kMaxTokens = 16, kAhead = 4;

__device__ inline uint2 load_w(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldcs(reinterpret_cast<const uint2*>(p));  // streamed once: keep it out of L1
#else
  return *reinterpret_cast<const uint2*>(p);
#endif
}
template <int NT>
struct Lane {
  int g, t;
  const uint32_t* xl[NT];  // the lane's B words of token 8 n + g (nullptr past S)
  float c[NT][4];          // reg i: row g + 8 (i / 2), token 8 n + 2t + i % 2
};

// Block b: the exact sums of the tile against every column group, the block values, the chains.
template <int NT>
__device__ inline void block_step(Lane<NT>& L, const uint2& lo, const uint2& hi, int b, const uint32_t* dec,
                                  const uint16_t* xmask) {
  FragA A[3];
  a_limbs(A, lo, hi, dec);
  int rn = (any_nan4(lo.x) || any_nan4(lo.y) ? 1 : 0) | (any_nan4(hi.x) || any_nan4(hi.y) ? 2 : 0);
  const int q1 = k4_shfl_xor(rn, 1, 32);  // the quad holds the row's 32 codes
  rn |= K4_MUTANT_ON(88) ? 0 : q1;
  const int q2 = k4_shfl_xor(rn, 2, 32);
  rn |= K4_MUTANT_ON(88) ? 0 : q2;
  const uint32_t xm = xmask[b];
K4_FAST_UNROLL
  for (int n = 0; n < NT; ++n) {
    FragB B[3];
    for (int m = 0; m < 3; ++m) {
      if (L.xl[n] != nullptr) {
        const uint2 v = *reinterpret_cast<const uint2*>(L.xl[n] + size_t(b) * 24 + m * 8);
        B[m].r[0] = v.x, B[m].r[1] = v.y;
      } else {
        B[m].r[0] = 0, B[m].r[1] = 0;
      }
    }
    FragC E[5] = {};
    mma_f8f8(E, A, B);
K4_FAST_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int k = 8 * n + 2 * L.t + i % 2;
      const int64_t S = sum_f8f8(E, i);
      const bool nan = ((rn >> (i / 2)) & 1) != 0 || ((xm >> k) & 1u) != 0;
      L.c[n][i] = L.c[n][i] + finish_block64(S, 18, 127, 127, nan);
    }
  }
}

template <int NT>
__global__ void __launch_bounds__(kWarps * 32) fast_o_proj_kernel(FastOprojArgs fa) {
  k4_grid_dep_start();
  K4_DYNAMIC_SMEM(smem);
  const OprojArgs& a = fa.o;
  const DevCfg& cfg = a.cfg;
  const int task = int(blockIdx.x), r = int(blockIdx.y), S = a.tokens, OK = cfg.o_k, HID = cfg.hidden;
  const int NB = OK / 32, QB = NB / kQuarters;
  uint32_t* dec = reinterpret_cast<uint32_t*>(smem);                   // 256: code -> limbs
  float* part = reinterpret_cast<float*>(dec + 256);                    // (4 quarters, 32 rows, 16 tokens)
  uint16_t* xmask = reinterpret_cast<uint16_t*>(part + kQuarters * kRows * kMaxTokens);  // NB: NaN tokens
  for (int i = int(threadIdx.x); i < 256; i += int(blockDim.x)) {
    dec[i] = limbs_entry(uint8_t(i));
  }
  for (int b = int(threadIdx.x); b < NB; b += int(blockDim.x)) {
    uint32_t m = 0;
    for (int k = 0; k < S; ++k) m |= uint32_t(fa.xnan[(size_t(r) * S + k) * NB + b] != 0) << k;
    xmask[b] = uint16_t(m);
  }
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, tile = warp / kQuarters, q = warp % kQuarters;
  Lane<NT> L;
  L.g = lane / 4, L.t = lane % 4;
  for (int n = 0; n < NT; ++n) {
    const int k = 8 * n + L.g;
    L.xl[n] = k < S ? fa.xlimbs + (size_t(r) * S + k) * NB * 24 + 2 * L.t : nullptr;
    for (int i = 0; i < 4; ++i) L.c[n][i] = 0.0f;
  }
  const int row0 = task * kRows + tile * 16;
  const uint8_t* w_lo = a.w_o + (size_t(r) * HID + row0 + L.g) * OK + size_t(q) * QB * 32 + 8 * L.t;  // row g
  const uint8_t* w_hi = w_lo + size_t(8) * OK;                                                     // row g + 8
  // blocks kAhead ahead in flight: ring slot j holds block b0 + j of the current group
  uint2 ring[kAhead][2];
K4_FAST_UNROLL
  for (int j = 0; j < kAhead; ++j)
    if (j < QB) ring[j][0] = load_w(w_lo + 32 * j), ring[j][1] = load_w(w_hi + 32 * j);
  for (int b0 = 0; b0 < QB; b0 += kAhead) {
K4_FAST_UNROLL
    for (int j = 0; j < kAhead; ++j) {
      const int b = b0 + j;
      if (b < QB) {
        const uint2 lo = ring[j][0], hi = ring[j][1];
        if (b + kAhead < QB) ring[j][0] = load_w(w_lo + 32 * (b + kAhead)), ring[j][1] = load_w(w_hi + 32 * (b + kAhead));
        block_step<NT>(L, lo, hi, q * QB + b, dec, xmask);
      }
    }
  }
  for (int n = 0; n < NT; ++n)
    for (int i = 0; i < 4; ++i) {
      const int k = 8 * n + 2 * L.t + i % 2, rr = tile * 16 + L.g + 8 * (i / 2);
      if (k < S) part[(q * kRows + rr) * kMaxTokens + k] = L.c[n][i];
    }
  __syncthreads();
  for (int i = int(threadIdx.x); i < S * kRows; i += int(blockDim.x)) {
    const int rr = i % kRows, k = i / kRows, row = task * kRows + rr;
    float tot = 0.0f;  // grp (seed:L1073-L1080): the 4 waves of the row group, from 0
    for (int qq = 0; qq < kQuarters; ++qq) tot = tot + part[(qq * kRows + rr) * kMaxTokens + k];
    const float xs = a.x_scale[size_t(r) * S + k], so = a.s_o[size_t(r) * HID + row];
    uint16_t p = bf16_bits_rne((tot * xs) * so);
    store_partial(a, p, r, k, row, S, HID, kRows);
  }
}

}  // namespace

void launch_fast_o_proj(const FastOprojArgs& fa, hipStream_t s) {
  const OprojArgs& a = fa.o;
  if (!fast_oproj_supported(a.cfg, a.tokens))
    throw std::invalid_argument("fast o_proj kernel: needs 32-row tasks, O_K in whole 32-blocks a quarter, 1 <= S <= 16");
  const size_t smem = 256 * sizeof(uint32_t) + size_t(kQuarters) * kRows * kMaxTokens * sizeof(float) +
                      size_t(a.cfg.o_k / 32) * sizeof(uint16_t);
  const dim3 grid(unsigned(a.cfg.hidden / kRows), unsigned(a.ranks)), block(kWarps * 32);
  if (a.tokens <= 8)
    k4_launch_dependent(fast_o_proj_kernel<1>, grid, block, smem, s, fa);
  else
    k4_launch_dependent(fast_o_proj_kernel<2>, grid, block, smem, s, fa);
  K4_HIP_CHECK_LAUNCH();
}

}  // namespace k4::gpu
