// exact_mma.hpp -- exact block dots on integer tensor cores: mma.sync s8 x s8 -> s32.
//
// The contract (reference/numerics/mma.hpp, docs/numerics.md "Matrix-unit dots"): a 32-element
// block's sum of products is exact, rounded once to f32, then scaled by 2^(sa + sb - 254) with
// one more rounding. Both formats are integers after a fixed shift (E2M1 x 2 is an s8 in
// [-12, 12]; E4M3 x 2^9 an 18-bit integer), so the exact sum is an integer a tensor core can
// compute exactly: mma.sync.m16n8k32 s8 x s8 -> s32 has K = 32 = one block.
//
//   E4M3 x 2^9 = d0 + 128 d1 + 16384 d2, balanced digits d0, d1 in [-64, 63], d2 in [-14, 14]
//   E2M1 x E4M3 (up/gate, down): A = E2M1 x 2 as s8, B = the 3 limbs: 3 MMAs, the block sum
//       S = D0 + 128 D1 + 16384 D2 (|S| < 2^27, int32), frac 10
//   E4M3 x E4M3 (o_proj, attention, the MXFP8 shared variant): 3 x 3 limbs, 9 MMAs,
//       S = sum 128^(i+j) Dij (|S| < 2^41, int64), frac 18
// then finish_block(S, frac, sa, sb): RNE(S) as an integer-valued f32 (cvt.rn), times two
// exact powers of two of which only the second rounds (exact_scale below): the model's bits.
//
// Three backends of the one tile operation mma_s8 (D += A B, 16 x 8 x 32):
//   NVIDIA (nvcc):  the mma.sync instruction;
//   AMD (hipcc):    mma_s8_gather, a warp-cooperative fallback that gathers the operands with
//                   shuffles and sums 4-byte dot products (the integer MFMA backend is a
//                   later step);
//   host:           mma_s8_warp over the 32 lanes' fragments, the same index maps, so the CPU
//                   suite checks the fragment arithmetic against the model (test_exact_mma.cpp);
//                   in the host emulation (K4_HOST_EMULATION) mma_s8 is a warp collective of
//                   device/simt.hpp that completes by mma_s8_warp, so the fast kernels run on
//                   the CPU.
// The fragment maps are PTX's for m16n8k32 .s8 (lane = 4 g + t, g = lane / 4, t = lane % 4):
//   A (row-major 16 x 32): reg i, byte j: row g + 8 (i % 2), k = 4 t + j + 16 (i / 2)
//   B (col-major 32 x 8):  reg i, byte j: k = 4 t + j + 16 i, column g
//   C/D (16 x 8 s32):      reg i: row g + 8 (i / 2), column 2 t + i % 2
#pragma once

#include <cstdint>

#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/e8m0.hpp"
#include "reference/numerics/hd.hpp"

#if defined(__HIPCC__) || defined(__HIP__)
#include <hip/hip_runtime.h>
#elif defined(K4_HOST_EMULATION)
#include "device/simt.hpp"
#endif

// Unrolled on NVIDIA (the register arrays of the fragments stay registers); hipcc for gfx90a
// cannot unroll every such loop and -Werror turns its warning into an error, so it leaves them.
#if defined(__CUDA_ARCH__)
#define K4_FAST_UNROLL _Pragma("unroll")
#else
#define K4_FAST_UNROLL
#endif

namespace k4::xmma {

constexpr int kLanes = 32;  // the tile is a 32-lane operation on every backend

struct FragA {
  uint32_t r[4];
};
struct FragB {
  uint32_t r[2];
};
struct FragC {
  int32_t r[4];
};

// ---- the fragment index maps (one definition for every backend and the tests)
K4_HD int a_row(int lane, int reg) { return lane / 4 + 8 * (reg % 2); }
K4_HD int a_k(int lane, int reg, int byte) { return 4 * (lane % 4) + byte + 16 * (reg / 2); }
K4_HD int b_k(int lane, int reg, int byte) { return 4 * (lane % 4) + byte + 16 * reg; }
K4_HD int b_col(int lane) { return lane / 4; }
K4_HD int c_row(int lane, int reg) { return lane / 4 + 8 * (reg / 2); }
K4_HD int c_col(int lane, int reg) { return 2 * (lane % 4) + reg % 2; }

K4_HD uint32_t pack4(int8_t a, int8_t b, int8_t c, int8_t d) {
  return uint32_t(uint8_t(a)) | uint32_t(uint8_t(b)) << 8 | uint32_t(uint8_t(c)) << 16 | uint32_t(uint8_t(d)) << 24;
}
K4_HD int8_t byte_of(uint32_t w, int j) { return int8_t(uint8_t(w >> (8 * j))); }
// Sum of 4 signed byte products (exact in int32).
K4_HD int32_t dot4(uint32_t a, uint32_t b) {
  int32_t s = 0;
  for (int j = 0; j < 4; ++j) s += int32_t(byte_of(a, j)) * int32_t(byte_of(b, j));
  return s;
}

// ---- decodes to s8 operands
// E2M1 code (4 bits) -> 2 x value, an s8 in [-12, 12]; -0 -> 0.
K4_HD int8_t e2m1_s8(uint8_t nib) { return int8_t(e2m1_to_int_x2(nib & 0xFu)); }

struct Limbs {
  int8_t d[3];
};
// E4M3 code -> the balanced radix-128 digits of code x 2^9 (NaN codes -> 0: their NaN travels
// as a flag, as in the model's block_dot_ints).
K4_HD Limbs e4m3_limbs(uint8_t code) {
  int32_t x = e4m3_is_nan(code) ? 0 : e4m3_to_int_x512(code);
  Limbs l;
  for (int i = 0; i < 2; ++i) {
    const int32_t d = ((x + 64) & 127) - 64;  // x mod 128 in [-64, 63]
    l.d[i] = int8_t(d);
    x = (x - d) / 128;  // exact
  }
  l.d[2] = int8_t(x);
  return l;
}

// PRMT (byte permute) as the hardware does it, for the P/Q pair decode of E2M1 below: output
// byte i takes byte (sel_i & 7) of {b:a}; with sel_i & 8 it replicates that byte's sign bit.
K4_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t ab = uint64_t(b) << 32 | a;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 0xFu;
    uint32_t byte = uint32_t(ab >> (8 * (s & 7))) & 0xFFu;
    if (s & 8) byte = (byte & 0x80u) ? 0xFFu : 0x00u;
    out |= byte << (8 * i);
  }
  return out;
}
// P and Q tables (PERF.md §3.3): for every 4-bit code c, P(c) + Q(c) = 2 x E2M1(c), where
// P = prmt(TP, codes) and Q = prmt(TQ, codes ^ 0x8888): the code's sign bit is PRMT's
// sign-replicate bit, 0 in every TP byte and 1 in TQ's bytes 1..7.
constexpr uint32_t kTpLo = 0x04030200u, kTpHi = 0x0d090705u;  // {0, 2, 3, 4, 5, 7, 9, 13}
constexpr uint32_t kTqLo = 0xfdfeff00u, kTqHi = 0xf4f8fafcu;  // {0, -1, -2, -3, -4, -6, -8, -12}
// 4 codes (the low 4 nibbles of `codes`) -> P and Q words, byte i from nibble i. The upper 16
// bits are ignored (PRMT reads a selector's low 16 bits), so a caller passes a word of 8 codes
// whole for its low 4 and shifts it for its high 4 (moe_fast.cu's a_pq).
K4_HD void e2m1_pq4(uint32_t codes, uint32_t& p, uint32_t& q) {
#if defined(__CUDA_ARCH__)
  // prmt.b32 in its default mode: a selector nibble's bit 3 replicates the sign (PTX ISA)
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(p) : "r"(kTpLo), "r"(kTpHi), "r"(codes));
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(q) : "r"(kTqLo), "r"(kTqHi), "r"(codes ^ 0x8888u));
#else
  p = prmt(kTpLo, kTpHi, codes & 0xFFFFu);
  q = prmt(kTqLo, kTqHi, (codes ^ 0x8888u) & 0xFFFFu);
#endif
}

// ---- the tile MMA, D += A B
inline void mma_s8_warp(FragC d[kLanes], const FragA a[kLanes], const FragB b[kLanes]);
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__) || defined(K4_HOST_EMULATION)
__device__ inline uint32_t lane_shfl(uint32_t v, int src) {
#if defined(__HIPCC__) || defined(__HIP__)
  return uint32_t(__shfl(int(v), src, kLanes));
#elif defined(K4_HOST_EMULATION)
  return k4_shfl(v, src, kLanes);
#else
  return __shfl_sync(0xFFFFFFFFu, v, src, kLanes);
#endif
}
// The gather form: every lane fetches the A words of its two rows and the B words of its two
// columns for each group of 4 k by shuffles (width 32: on wave64 the two halves are two
// tiles) and sums 4-byte dot products. AMD's path until the integer MFMA backend; the GPU
// suite runs it on NVIDIA too.
#if !defined(K4_HOST_EMULATION)
__device__ inline void mma_s8_gather(FragC& d, const FragA& a, const FragB& b) {
  const int lane = int(threadIdx.x) % kLanes;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int q = 0; q < 8; ++q) {  // k = 4 (q % 4) + 16 (q / 4) + 0..3
    const int kt = q % 4, half = q / 4;
    uint32_t va[2], vb[2];
    for (int ra = 0; ra < 2; ++ra) va[ra] = lane_shfl(a.r[ra + 2 * half], g * 4 + kt);
    for (int cb = 0; cb < 2; ++cb) vb[cb] = lane_shfl(b.r[half], (2 * t + cb) * 4 + kt);
    for (int i = 0; i < 4; ++i) d.r[i] += dot4(va[i / 2], vb[i % 2]);
  }
}
#endif
__device__ inline void mma_s8(FragC& d, const FragA& a, const FragB& b) {
#if defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d.r[0]), "+r"(d.r[1]), "+r"(d.r[2]), "+r"(d.r[3])
      : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
#elif defined(K4_HOST_EMULATION)
  uint32_t in[10];
  std::memcpy(in, a.r, 16), std::memcpy(in + 4, b.r, 8), std::memcpy(in + 6, d.r, 16);
  simt::block().collective("mma_s8", in, 10, reinterpret_cast<uint32_t*>(d.r), 4,
                           [](const uint32_t (*I)[simt::kInWords], uint32_t (*O)[simt::kOutWords], int lanes) {
                             FragA A[kLanes];
                             FragB B[kLanes];
                             FragC D[kLanes];
                             for (int l = 0; l < kLanes; ++l) {  // a partial warp's missing lanes: zeros
                               const uint32_t* w = I[l];
                               const bool on = l < lanes;
                               for (int i = 0; i < 4; ++i) A[l].r[i] = on ? w[i] : 0u, D[l].r[i] = on ? int32_t(w[6 + i]) : 0;
                               for (int i = 0; i < 2; ++i) B[l].r[i] = on ? w[4 + i] : 0u;
                             }
                             mma_s8_warp(D, A, B);
                             for (int l = 0; l < lanes; ++l) std::memcpy(O[l], D[l].r, 16);
                           });
#else
  mma_s8_gather(d, a, b);
#endif
}
#endif

// Host: the 32 lanes' fragments at once, by the index maps (what the hardware computes).
inline void mma_s8_warp(FragC d[kLanes], const FragA a[kLanes], const FragB b[kLanes]) {
  int8_t A[16][32], Bt[8][32];  // B by column: each product a dot of two contiguous rows
  for (int l = 0; l < kLanes; ++l)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) A[a_row(l, i)][a_k(l, i, j)] = byte_of(a[l].r[i], j);
  for (int l = 0; l < kLanes; ++l)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j) Bt[b_col(l)][b_k(l, i, j)] = byte_of(b[l].r[i], j);
  for (int l = 0; l < kLanes; ++l)
    for (int i = 0; i < 4; ++i) {
      const int8_t *ra = A[c_row(l, i)], *cb = Bt[c_col(l, i)];
      int32_t s = 0;
      for (int k = 0; k < 32; ++k) s += int32_t(ra[k]) * int32_t(cb[k]);
      d[l].r[i] += s;
    }
}

// ---- the block epilogue: one rounding to f32, the exact scaling
// 2^n as an f32, exact for -149 <= n <= 127 (subnormal below -126).
K4_HD float pow2_f32(int n) {
  return n >= -126 ? f32_from_bits(uint32_t(n + 127) << 23) : f32_from_bits(1u << (n + 149));
}
// s (an integer-valued f32: RNE of the exact block sum) times 2^t with one rounding, t =
// sa + sb - 254 - frac. Split 2^t = 2^(t - b) 2^b with b = clamp(t, -149, 127): both factors
// are exact f32 powers of two, s 2^(t - b) is exact (or overflows exactly when s 2^t does:
// t - b > 0 only when t > 127, and |s| < 2^42), and only the second product rounds (IEEE,
// gradual underflow: the build is -ftz=false). Equal to the model's
// float(double(s 2^-frac) 2^(sa + sb - 254)), whose double product is exact.
K4_HD float exact_scale(float s, int t) {
  const int b = t < -149 ? -149 : (t > 127 ? 127 : t);
  return (s * pow2_f32(t - b)) * pow2_f32(b);
}

// The block value of the model from the exact sum S (x 2^-frac) and the block's scales:
// scale_block(round_block_sum(S, frac), sa, sb); NaN (the model's canonical NaN) when an
// element was NaN or a scale is 0xFF. Unscaled blocks pass sa = sb = 127.
K4_HD float finish_block32(int32_t S, int frac, uint8_t sa, uint8_t sb, bool nan) {
  if (nan || e8m0_is_nan(sa) || e8m0_is_nan(sb)) return f32_from_bits(kCanonicalNan);
#if defined(__CUDA_ARCH__)
  float s;
  asm("cvt.rn.f32.s32 %0, %1;" : "=f"(s) : "r"(S));
#else
  const float s = float(S);  // RNE (the host's and HIP's rounding mode)
#endif
  return exact_scale(s, int(sa) + int(sb) - 254 - frac);
}
K4_HD float finish_block64(int64_t S, int frac, uint8_t sa, uint8_t sb, bool nan) {
  if (nan || e8m0_is_nan(sa) || e8m0_is_nan(sb)) return f32_from_bits(kCanonicalNan);
#if defined(__CUDA_ARCH__)
  float s;
  asm("cvt.rn.f32.s64 %0, %1;" : "=f"(s) : "l"(S));
#else
  const float s = float(S);
#endif
  return exact_scale(s, int(sa) + int(sb) - 254 - frac);
}

// The E2M1 x E4M3 block value of the fast stage-5 kernels (device/moe_fast.cu) from s =
// RNE(S), the exact sum S (x 2^-10) rounded once: the model's scale_block(round_block_sum(S,
// 10), sa, sb), in parts that let a tile form every value the same way --
//   fb = b_factor(sb, nan): 2^(sb - 137) (the 2^-10 folded in), NaN for a NaN block or scale,
//        once a column and block;
//   sa <= 227: block_fast(s, sa_factor(sa), fb) = (s 2^(sa - 127)) fb. The first product is
//        exact (|s| <= 2^27, so no overflow; s an integer, so s 2^-127 is a multiple of 2^-149),
//        the second is the one rounding of s 2^(sa + sb - 264); sa_factor is pow2_f32(sa - 127)
//        from the scale's bits (sa = 0: the subnormal 2^-127);
//   sa > 227 (the top of the range, a NaN scale): block_edge, the split scaling of exact_scale.
// Equal to finish_block32(S, 10, sa, sb, nan) for every S, sa and sb (tests/cpu/test_exact_mma.cpp).
K4_HD float b_factor(uint8_t sb, bool nan) {
  return nan || e8m0_is_nan(sb) ? f32_from_bits(kCanonicalNan) : pow2_f32(int(sb) - 137);
}
K4_HD float sa_factor(uint8_t sa) { return f32_from_bits(sa == 0 ? 0x00400000u : uint32_t(sa) << 23); }
K4_HD float block_fast(float s, float pa, float fb) { return (s * pa) * fb; }
K4_HD float block_edge(float s, uint8_t sa, float fb, uint8_t sb) {
  if (e8m0_is_nan(sa) || is_nan(fb)) return f32_from_bits(kCanonicalNan);
  return exact_scale(s, int(sa) + int(sb) - 264);
}
constexpr uint8_t kBlockFastMaxSa = 227;  // block_fast's range of sa

// Limb products -> the exact block sums.
K4_HD int32_t combine_f4f8(const int32_t D[3]) { return D[0] + 128 * D[1] + 16384 * D[2]; }
// D[i][j]: A limb i times B limb j.
K4_HD int64_t combine_f8f8(const int32_t D[3][3]) {
  int64_t s = 0;
  for (int i = 2; i >= 0; --i)
    for (int j = 2; j >= 0; --j) s += int64_t(D[i][j]) * (int64_t(1) << (7 * (i + j)));
  return s;
}

// ---- E4M3 x E4M3 tiles from codes decoded to limbs as they load (oproj_fast.cu, split.cu's
// tensor-core body). k order inside a block: lane t holds codes 8t .. 8t + 7 of its A rows and
// of its B column (e4m3_limbs' B fragments use the same): A reg 0 / 2 and B reg 0 / 1 pair
// codes 8t .. 8t + 3 and 8t + 4 .. 8t + 7, so every code meets its partner; the hardware's k
// order inside a block does not change an exact integer sum.
// Host and device (the CPU suite checks these index maps, test_exact_mma.cpp); only the MMAs
// are device code.
// Any of 4 E4M3 codes a NaN (0x7F / 0xFF): the low 7 bits + 1 reach bit 7 only from 0x7F.
K4_HD bool any_nan4(uint32_t w) { return (((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) != 0; }
// Byte i of the result is byte (sel >> 4i) & 7 of {y:x} (selectors below 8: no sign replicate).
K4_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t sel) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __byte_perm(x, y, sel);
#else
  return prmt(x, y, sel);
#endif
}
// The shared table's entry of a code: its 3 limbs in bytes 0, 1, 2.
K4_HD uint32_t limbs_entry(uint8_t code) {
  const Limbs l = e4m3_limbs(code);
  return pack4(l.d[0], l.d[1], l.d[2], 0);
}
// 4 codes -> their 3 limb words (limb m of code j in byte j of word m), from dec (limbs_entry
// of every code).
K4_HD void limbs4(uint32_t (&L)[3], uint32_t w, const uint32_t* dec) {
  const uint32_t l0 = dec[w & 0xFF], l1 = dec[(w >> 8) & 0xFF], l2 = dec[(w >> 16) & 0xFF], l3 = dec[w >> 24];
  const uint32_t a01 = byte_perm(l0, l1, 0x5140), a23 = byte_perm(l2, l3, 0x5140);  // d0, d0, d1, d1
  const uint32_t b01 = byte_perm(l0, l1, 0x0062), b23 = byte_perm(l2, l3, 0x0062);  // d2, d2
  L[0] = byte_perm(a01, a23, 0x5410), L[1] = byte_perm(a01, a23, 0x7632), L[2] = byte_perm(b01, b23, 0x5410);
}
// A fragments of the 3 limbs: reg 0 / 1 = rows g / g + 8, codes 8t .. 8t + 3; reg 2 / 3 the next 4.
template <class Words2>  // uint2 on the device: .x codes 8t .. 8t + 3, .y the next 4
K4_HD void a_limbs(FragA (&A)[3], const Words2& lo, const Words2& hi, const uint32_t* dec) {
  uint32_t L[4][3];
  limbs4(L[0], lo.x, dec), limbs4(L[1], hi.x, dec), limbs4(L[2], lo.y, dec), limbs4(L[3], hi.y, dec);
  for (int m = 0; m < 3; ++m)
    for (int i = 0; i < 4; ++i) A[m].r[i] = L[i][m];
}
// B fragments of the 3 limbs: the lane's column, codes 8t .. 8t + 7.
template <class Words2>
K4_HD void b_limbs(FragB (&B)[3], const Words2& v, const uint32_t* dec) {
  uint32_t L[2][3];
  limbs4(L[0], v.x, dec), limbs4(L[1], v.y, dec);
  for (int m = 0; m < 3; ++m) B[m].r[0] = L[0][m], B[m].r[1] = L[1][m];
}
// Output reg r's exact block sum S = sum 2^(7n) E_n (|S| < 2^41; each E_n and the two int32
// partial sums below stay far inside int32).
K4_HD int64_t sum_f8f8(const FragC (&E)[5], int r) {
  const int64_t lo = int64_t(E[0].r[r] + 128 * E[1].r[r]);  // products, not shifts: the sums are signed
  return lo + int64_t(E[2].r[r]) * 16384 + int64_t(E[3].r[r] + 128 * E[4].r[r]) * 2097152;
}
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__) || defined(K4_HOST_EMULATION)
// The 9 limb products into 5 accumulators by weight: E_n += sum over i + j = n of A_i B_j.
__device__ inline void mma_f8f8(FragC (&E)[5], const FragA (&A)[3], const FragB (&B)[3]) {
K4_FAST_UNROLL
  for (int i = 0; i < 3; ++i)
K4_FAST_UNROLL
    for (int j = 0; j < 3; ++j) mma_s8(E[i + j], A[i], B[j]);
}
#endif

}  // namespace k4::xmma
