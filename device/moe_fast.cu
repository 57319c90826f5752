// moe_fast.cu -- stage 5's up/gate and down on integer tensor cores (device/exact_mma.hpp),
// bit for bit the outputs of moe.cu (and so of reference/stages/moe.cpp): the same block values
// (exact sums from mma.sync s8 x s8 -> s32, one rounding, the exact scaling), added in the
// model's orders.
//
//   e4m3_limbs      E4M3 rows (xn8, mid8) -> each lane's B fragment of every block, 3 limbs,
//                   and a NaN flag a block (computed once a step, read by every expert)
//   fast_up_gate    CTA = (expert, 32 mid rows, rank), warp w = the model's wave w: its 24
//                   blocks of the 32 gate and 32 up rows (4 m16 tiles) for up to 16 of the
//                   expert's (token, slot) uses (2 n8 column groups); each lane's chains run
//                   over the blocks in order (c = c + block), then g = 0 + c_0 + .. + c_7 in
//                   shared memory, swiglu, bf16, the MXFP8 block of the 32 rows; a pass of one
//                   or two uses runs the rotated tiles (tile_rot: 4 blocks' limb sums in one
//                   n8 tile)
//   fast_down_units CTA = (expert, 128 rows, rank), warp = 32 rows: every 128-k unit
//                   (c = 0; c = c + block, 4 blocks) of the expert's uses into DownArgs::units;
//                   moe.cu's down kernel then assembles them in the narrow or wide order.
// Weights: w13 / w2 in fragment order (weight_layout.hpp): lane t of a quad loads word t of 4
// blocks, one 16-byte load a row; the E2M1 codes become s8 by the PRMT pair P + Q (two MMAs
// into one accumulator). Block value, sa <= 227: (RNE(S) 2^(sa-127)) 2^(sb-137) (exact, then
// one rounding); otherwise exact_scale. NaN: a NaN x / mid block or scale makes the factor NaN.
// The host emulation runs these kernels on device/simt.hpp's threads.
#include <algorithm>
#include <stdexcept>

#include "device/exact_mma.hpp"
#include "device/mutants.hpp"
#include "device/stages.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/keys.hpp"
#include "reference/numerics/mma.hpp"
#include "reference/numerics/mx.hpp"
#include "reference/numerics/policy.hpp"

namespace k4::gpu {

bool fast_moe_supported(const DevCfg& cfg, int tokens) {
  const int KB = cfg.hidden / 32;
  return cfg.waves == 8 && KB % (4 * cfg.waves) == 0 && cfg.inter % 128 == 0 && tokens >= 1 && tokens <= 16 &&
         cfg.moe_slots <= 8 && cfg.shared_fp8 == 0 && cfg.experts == 0 && cfg.hidden % 128 == 0 &&
         cfg.wide_live_rows == 0;  // MXFP4 experts only; V2 exclude_pad: the fast up/gate has no slot_joins yet
}

namespace {

using namespace k4::xmma;


constexpr int kUses = 16;        // (token, slot) uses a pass: 2 column groups of 8
constexpr int kMaxUseList = 16 * 8 + 1;

__device__ inline uint4 load_stream(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldcs(reinterpret_cast<const uint4*>(p));
#else
  return *reinterpret_cast<const uint4*>(p);
#endif
}
__device__ inline uint32_t word_of(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

__device__ inline float cvt_rn(int32_t S) {
#if defined(__CUDA_ARCH__)
  float s;
  asm("cvt.rn.f32.s32 %0, %1;" : "=f"(s) : "r"(S));
  return s;
#else
  return float(S);
#endif
}

// The block values: b_factor, sa_factor, block_fast and block_edge (device/exact_mma.hpp; the
// tiles take block_edge only where a row's scale is past 227: one branch a fragment, not
// several a value, so that the block epilogues of a tile, most of the kernels' instructions,
// schedule together).

// A fragments (P and Q) of one 16 x 32 tile: w_lo / w_hi = word j of rows g and g + 8. The low
// halves go in whole: e2m1_pq4 reads a selector's low 16 bits only.
__device__ inline void a_pq(uint32_t w_lo, uint32_t w_hi, FragA& P, FragA& Q) {
  e2m1_pq4(w_lo, P.r[0], Q.r[0]);
  e2m1_pq4(w_hi, P.r[1], Q.r[1]);
  e2m1_pq4(w_lo >> 16, P.r[2], Q.r[2]);
  e2m1_pq4(w_hi >> 16, P.r[3], Q.r[3]);
}

// Block b's B fragments of the NG column groups, 3 limbs each (e4m3_limbs' layout: 24 words a
// block from the group's lane pointer src[grp]); a group past the uses (nullptr) reads zeros.
template <int NG>
__device__ inline void load_b(FragB (&B)[NG][3], const uint32_t* const (&src)[NG], int b) {
  for (int grp = 0; grp < NG; ++grp)
    for (int m = 0; m < 3; ++m) {
      if (src[grp] != nullptr) {
        const uint2 v = *reinterpret_cast<const uint2*>(src[grp] + size_t(b) * 24 + m * 8);
        B[grp][m].r[0] = v.x, B[grp][m].r[1] = v.y;
      } else {
        B[grp][m].r[0] = 0, B[grp][m].r[1] = 0;
      }
    }
}

// Block b (word j of each lane's 16-byte loads) of one 16 x 32 E2M1 tile, rows g and g + 8 in
// w_lo / w_hi with their scales in byte j of s_lo / s_hi, against the NG column groups' B:
// the exact sum S = D0 + 2^7 D1 + 2^14 D2 of the three limbs (P and Q into one accumulator),
// the model's block value, and each lane's chains c[grp][i] = c[grp][i] + value. fb / sb: the
// columns' B factors and scales, `stride` blocks a column. fast_up_gate's tiles and
// fast_down_units' share it.
template <int NG>
__device__ inline void tile_block(float (&c)[NG][4], const uint4& w_lo, const uint4& w_hi, uint32_t s_lo, uint32_t s_hi, int j,
                                  const FragB (&B)[NG][3], const float* fb, const uint8_t* sb, int stride, int b, int t) {
  FragA P, Q;
  a_pq(word_of(w_lo, j), word_of(w_hi, j), P, Q);
  const uint8_t sa0 = uint8_t(s_lo >> (8 * j)), sa1 = uint8_t(s_hi >> (8 * j));
  const float pa0 = sa_factor(sa0), pa1 = sa_factor(sa1);
  const int max_sa = K4_MUTANT_ON(87) ? 255 : kBlockFastMaxSa;
  const bool edge = sa0 > max_sa || sa1 > max_sa;
K4_FAST_UNROLL
  for (int grp = 0; grp < NG; ++grp) {
    FragC D[3] = {};
    for (int m = 0; m < 3; ++m) {
      mma_s8(D[m], P, B[grp][m]);
      mma_s8(D[m], Q, B[grp][m]);
    }
    const int col0 = grp * 8 + 2 * t;  // element i: column col0 + i % 2, row g + 8 (i / 2)
    const float fb0 = fb[col0 * stride + b], fb1 = fb[(col0 + 1) * stride + b];
    float v[4];
    for (int i = 0; i < 4; ++i)
      v[i] = block_fast(cvt_rn(D[0].r[i] + 128 * D[1].r[i] + 16384 * D[2].r[i]), i < 2 ? pa0 : pa1, i % 2 ? fb1 : fb0);
    if (edge)
      for (int i = 0; i < 4; ++i) {
        const uint8_t sa = i < 2 ? sa0 : sa1;
        const int col = col0 + i % 2;
        if (sa > max_sa) v[i] = block_edge(cvt_rn(D[0].r[i] + 128 * D[1].r[i] + 16384 * D[2].r[i]), sa, i % 2 ? fb1 : fb0, sb[col * stride + b]);
      }
    for (int i = 0; i < 4; ++i) c[grp][i] = c[grp][i] + v[i];
  }
}

// One or two uses by column rotation: each n8 accumulator holds 4 blocks' limb sums, block
// b0 + j in columns 2j, 2j + 1, so after the 4 blocks of a 64-byte group lane (g, t) holds block
// b0 + t's three limb sums of rows g and g + 8 for every use -- every lane one block value a
// (row, use) instead of 1 lane in 8 (tile_block's columns). The accumulators, a column pair each:
//   N = 1: D0 = (lo, mid) of the use, D1 = (hi, 0);
//   N = 2: D0 = (lo, mid) of use 0, D1 = (hi of use 0, hi of use 1), D2 = (lo, mid) of use 1.
// Lane (g, t) feeds column g of every block's B (load_rot: its words of block b0 + g / 2), used in
// MMA j = g / 2 and 0 in the others. The same exact sums as tile_block's (each column only ever
// holds one block's products), the same block values, and each (row, use) chain c = c + value
// over the 4 blocks in order (block b0 + j's value from lane (g, j)), so the same bits.
template <int N>
inline constexpr int rot_accs = N == 1 ? 2 : 3;
template <int N>
__device__ inline void tile_rot(float (&c)[2][N], const uint4& w_lo, const uint4& w_hi, uint32_t s_lo, uint32_t s_hi,
                                const uint2 (&bw)[rot_accs<N>], const float* fb, const uint8_t* sb, int stride, int b0,
                                int g, int t) {
  static_assert(N == 1 || N == 2, "the rotated tiles hold one or two uses");
  constexpr int NA = rot_accs<N>;
  FragC D[NA] = {};
K4_FAST_UNROLL
  for (int j = 0; j < 4; ++j) {
    FragA P, Q;
    a_pq(word_of(w_lo, j), word_of(w_hi, j), P, Q);
    const bool mine = g / 2 == j;
K4_FAST_UNROLL
    for (int k = 0; k < NA; ++k) {
      FragB B;
      B.r[0] = mine ? bw[k].x : 0u, B.r[1] = mine ? bw[k].y : 0u;
      mma_s8(D[k], P, B);
      mma_s8(D[k], Q, B);
    }
  }
  const int b = b0 + t;
  const uint8_t sa[2] = {uint8_t(s_lo >> (8 * t)), uint8_t(s_hi >> (8 * t))};  // rows g, g + 8
  float S[2][N], v[2][N];
K4_FAST_UNROLL
  for (int h = 0; h < 2; ++h)
K4_FAST_UNROLL
    for (int u = 0; u < N; ++u) {
      const int32_t d[3] = {D[u == 0 ? 0 : 2].r[2 * h], D[u == 0 ? 0 : 2].r[2 * h + 1], D[1].r[2 * h + (N == 1 ? 0 : u)]};
      S[h][u] = cvt_rn(combine_f4f8(d));  // d: use u's lo, mid (elements 2h, 2h + 1 of D0 or D2), hi
      v[h][u] = block_fast(S[h][u], sa_factor(sa[h]), fb[u * stride + b]);
    }
  const int max_sa = K4_MUTANT_ON(87) ? 255 : kBlockFastMaxSa;
  if (sa[0] > max_sa || sa[1] > max_sa) {  // as in tile_block
K4_FAST_UNROLL
    for (int h = 0; h < 2; ++h)
K4_FAST_UNROLL
      for (int u = 0; u < N; ++u)
        if (sa[h] > max_sa) v[h][u] = block_edge(S[h][u], sa[h], fb[u * stride + b], sb[u * stride + b]);
  }
K4_FAST_UNROLL
  for (int j = 0; j < 4; ++j)
K4_FAST_UNROLL
    for (int h = 0; h < 2; ++h)
K4_FAST_UNROLL
      for (int u = 0; u < N; ++u) c[h][u] = c[h][u] + f32_from_bits(lane_shfl(f32_bits(v[h][u]), g * 4 + (K4_MUTANT_ON(83) ? 3 - j : j)));
}
// Lane (g, t)'s B words of a rotated group (tile_rot's bw) for block bj = b0 + g / 2, from the
// uses' limbs (e4m3_limbs' layout, lane pointers src): N = 1: limb g % 2, and limb 2 where g is
// even (else 0); N = 2: limb g % 2 of use 0, limb 2 of use g % 2, limb g % 2 of use 1.
template <int N>
__device__ inline void load_rot(uint2 (&bw)[rot_accs<N>], const uint32_t* const (&src)[N], int bj, int g) {
  const size_t o = size_t(bj) * 24;
  bw[0] = *reinterpret_cast<const uint2*>(src[0] + o + (g % 2) * 8);
  if constexpr (N == 1) {
    bw[1] = g % 2 == 0 ? *reinterpret_cast<const uint2*>(src[0] + o + 16) : make_uint2(0u, 0u);
  } else {
    bw[1] = *reinterpret_cast<const uint2*>((g % 2 == 0 ? src[0] : src[1]) + o + 16);  // a select: no local array
    bw[2] = *reinterpret_cast<const uint2*>(src[1] + o + (g % 2) * 8);
  }
}

// The (token, slot) uses of expert e on rank r, token-major (moe.cu's order); count returned.
// Thread ks (= k * slots + s) tests its slot; a use's place is the number of hits before it
// (the hit bytes summed a word at a time), so the list is in ks order, as one thread's loop
// over k, then s would write it. Needs blockDim.x >= S * slots (<= 128) and `hit` of
// kMaxUseList bytes, 4-byte aligned.
__device__ inline int build_uses(int* uses, uint8_t* hit, const int32_t* ids, int r, int e, int S, const DevCfg& cfg) {
  const int n_ks = S * cfg.moe_slots, i = int(threadIdx.x), words = (n_ks + 3) / 4;
  if (i < words * 4) {
    const int id = i < n_ks ? ids[size_t(r) * n_ks + i] : -1;
    hit[i] = i < n_ks && (id < cfg.n_experts - 1 ? id : cfg.n_experts - 1) == e ? 1 : 0;  // slot_expert
  }
  __syncthreads();
  if (i < n_ks && hit[i] != 0) {
    const uint32_t* hw = reinterpret_cast<const uint32_t*>(hit);
    int before = 0;
    for (int w = 0; w < i / 4; ++w) before += int((hw[w] * 0x01010101u) >> 24);  // bytes are 0 / 1
    for (int j = i & ~3; j < i; ++j) before += hit[j];
    uses[before] = i;
  }
  if (i == 0) {
    const uint32_t* hw = reinterpret_cast<const uint32_t*>(hit);
    int n = 0;
    for (int w = 0; w < words; ++w) n += int((hw[w] * 0x01010101u) >> 24);
    uses[kMaxUseList - 1] = n;
  }
  __syncthreads();
  return uses[kMaxUseList - 1];
}

// ------------------------------------------------------------------------------ limbs
__global__ void __launch_bounds__(128) e4m3_limbs_kernel(LimbsArgs a) {
  k4_grid_dep_start();
  const int NB = a.n / 32;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;  // (row, block, lane t)
  const bool valid = i < size_t(a.rows) * NB * 4;
  const int t = int(i % 4);
  const size_t rb = i / 4;  // row * NB + block
  bool nan = false;
  if (valid) {
    const uint8_t* c = a.codes + rb * 32 + 8 * t;
    const uint2 v = *reinterpret_cast<const uint2*>(c);
    uint8_t code[8];
    for (int j = 0; j < 4; ++j) code[j] = uint8_t(v.x >> (8 * j)), code[4 + j] = uint8_t(v.y >> (8 * j));
    Limbs l[8];
    for (int j = 0; j < 8; ++j) l[j] = e4m3_limbs(code[j]), nan |= e4m3_is_nan(code[j]);
    uint32_t* out = a.limbs + (rb * 3) * 8 + t * 2;
    for (int m = 0; m < 3; ++m) {
      out[m * 8] = pack4(l[0].d[m], l[1].d[m], l[2].d[m], l[3].d[m]);
      out[m * 8 + 1] = pack4(l[4].d[m], l[5].d[m], l[6].d[m], l[7].d[m]);
    }
  }
  // the block's flag: OR over its 4 lanes (consecutive threads of one warp; all lanes take part)
  int f = nan ? 1 : 0;
  f |= k4_shfl_xor(f, 1, 32);
  f |= k4_shfl_xor(f, 2, 32);
  if (valid && t == 0) a.nan[rb] = uint8_t(f);
}

// The columns' B factors and scales of a pass (fb / sb: (cols, nb)): column u < nu is use
// uses[u], whose E4M3 row is row0 + uses[u] / per_row of sc / nan ((rows, nb) scales and
// NaN-block flags); columns past nu are empty (scale 127, factor 0: their outputs are not
// stored). A thread's loads of 4 items are issued before their stores (the stores to shared
// memory would otherwise order each item's loads after the last's).
__device__ inline void fill_b_factors(float* fb, uint8_t* sb, const uint8_t* sc, const uint8_t* nan, const int* uses,
                                      int nu, int cols, int nb, size_t row0, int per_row) {
  constexpr int kBatch = 4;
  const int n = cols * nb, step = int(blockDim.x);
  for (int i0 = int(threadIdx.x); i0 < n; i0 += kBatch * step) {
    uint8_t s[kBatch], f[kBatch];
K4_FAST_UNROLL
    for (int j = 0; j < kBatch; ++j) {
      const int i = i0 + j * step, u = i / nb;
      s[j] = 127, f[j] = 0;
      if (i < n && u < nu) {
        const size_t at = (row0 + uses[u] / per_row) * nb + i % nb;
        s[j] = sc[at], f[j] = nan[at];
      }
    }
K4_FAST_UNROLL
    for (int j = 0; j < kBatch; ++j) {
      const int i = i0 + j * step;
      if (i >= n) break;
      sb[i] = s[j];
      fb[i] = i / nb < nu ? b_factor(s[j], !K4_MUTANT_ON(84) && f[j] != 0) : 0.0f;
    }
  }
}

// ---------------------------------------------------------------------------- up / gate
// Shared memory of a CTA: the uses, the pass's B factors and scales, the 8 waves' chains, mid.
// Each thread forms the pointers from the shared arrays themselves (not read from shared
// memory), so that the compiler knows them shared: ld.shared, not generic loads, in the tiles.
struct UgSmem {
  int* uses;        // kMaxUseList
  uint8_t* hit;     // kMaxUseList + 3, 4-byte aligned
  float* fb;        // (kUses, KB)
  uint8_t* sb;      // (kUses, KB)
  float* chains;    // (waves, 4 tiles, 16 rows, kUses)
  float* midv;      // (kUses, 32)
};

// Row x of the 8 a lane reads of an up/gate task (tile q = x / 2: gate (q < 2) or up rows, 16 (q % 2)
// .. of the 32; rows g, g + 8), as its offset row KB: its weights at w13 + 16 roff + 16 t, its
// scales at s13 + roff. 32-bit offsets (an expert's w13 is 2 I HID / 2 bytes < 2^32): 8
// registers where 16 row pointers took 32.
__device__ inline void w13_rows(uint32_t (&roff)[8], int I, int KB, int rg, int g) {
  for (int q = 0; q < 4; ++q)
    for (int x = 0; x < 2; ++x) roff[2 * q + x] = uint32_t((q / 2) * I + rg * 32 + (q % 2) * 16 + g + 8 * x) * uint32_t(KB);
}
// A lane's share of an up/gate task (expert e, rows 32 rg.., rank r) in wave w: its rows (w13_rows)
// and its groups G0 .. G1 - 1 of 4 blocks.
struct UgLane {
  int KB, g, t, G0, G1;
  const uint8_t* w13;  // lane t's 16 bytes of a group
  const uint8_t* s13;
  uint32_t roff[8];
};
__device__ inline UgLane ug_lane(const FastUpGateArgs& a, int r, int e, int rg, int w) {
  const DevCfg& cfg = a.cfg;
  const int lane = int(threadIdx.x) % 32, KB = cfg.hidden / 32, wb = KB / cfg.waves;
  UgLane L;
  L.KB = KB, L.g = lane / 4, L.t = lane % 4, L.G0 = w * wb / 4, L.G1 = (w + 1) * wb / 4;
  const size_t ex = size_t(r) * cfg.n_experts + e;
  L.w13 = a.ex.w13[ex] + 16 * L.t;
  L.s13 = a.ex.s13[ex];
  w13_rows(L.roff, cfg.inter, KB, rg, L.g);
  return L;
}
// Group G (4 blocks) of those rows: 16 bytes of weights and 4 scales each (w13 at lane t's 16 bytes).
__device__ inline void w13_group(uint4 (&wv)[8], uint32_t (&sv)[8], const uint8_t* w13, const uint8_t* s13,
                                 const uint32_t (&roff)[8], int G) {
  for (int x = 0; x < 8; ++x) {
    wv[x] = load_stream(w13 + (16 * roff[x] + 64 * uint32_t(G)));
    sv[x] = *reinterpret_cast<const uint32_t*>(s13 + (roff[x] + 4 * uint32_t(G)));
  }
}

template <int NG>
__device__ void up_gate_slice(const FastUpGateArgs& a, int r, int e, int rg, int w, const UgSmem& sm, int u0, int nu) {
  const UgLane L = ug_lane(a, r, e, rg, w);
  const int KB = L.KB, SL = a.cfg.moe_slots, S = a.tokens, g = L.g, t = L.t, G0 = L.G0, G1 = L.G1;
  const uint8_t *w13 = L.w13, *s13 = L.s13;
  const uint32_t(&roff)[8] = L.roff;
  const uint32_t* xb[NG];
  for (int grp = 0; grp < NG; ++grp) {
    const int u = grp * 8 + g;  // this lane's B column
    xb[grp] = u < nu ? a.xlimbs + ((size_t(r) * S + sm.uses[u0 + u] / SL) * KB) * 24 + t * 2 : nullptr;
  }
  float ch[4][NG][4];  // tile q, column group, fragment element
  for (int grp = 0; grp < NG; ++grp)
    for (int q = 0; q < 4; ++q)
      for (int i = 0; i < 4; ++i) ch[q][grp][i] = 0.0f;
  for (int G = G0; G < G1; ++G) {
    uint4 wv[8];
    uint32_t sv[8];
    w13_group(wv, sv, w13, s13, roff, G);
K4_FAST_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int b = 4 * G + j;
      FragB B[NG][3];
      load_b(B, xb, b);
K4_FAST_UNROLL
      for (int q = 0; q < 4; ++q) tile_block(ch[q], wv[2 * q], wv[2 * q + 1], sv[2 * q], sv[2 * q + 1], j, B, sm.fb, sm.sb, KB, b, t);
    }
  }
  for (int grp = 0; grp < NG; ++grp)
    for (int q = 0; q < 4; ++q)
      for (int i = 0; i < 4; ++i) {
        const int col = grp * 8 + 2 * t + (i % 2), rin = g + 8 * (i / 2);
        sm.chains[((w * 4 + q) * 16 + rin) * kUses + col] = ch[q][grp][i];
      }
}

// up_gate_slice for a pass of N = 1 or 2 uses: the rotated tiles (tile_rot), rows g and g + 8
// of each tile's chains a lane.
template <int N>
__device__ void up_gate_slice_rot(const FastUpGateArgs& a, int r, int e, int rg, int w, const UgSmem& sm, int u0) {
  const UgLane L = ug_lane(a, r, e, rg, w);
  const int KB = L.KB, SL = a.cfg.moe_slots, S = a.tokens, g = L.g, t = L.t, G0 = L.G0, G1 = L.G1;
  const uint8_t *w13 = L.w13, *s13 = L.s13;
  const uint32_t(&roff)[8] = L.roff;
  const uint32_t* xr[N];
  for (int u = 0; u < N; ++u) xr[u] = a.xlimbs + ((size_t(r) * S + sm.uses[u0 + u] / SL) * KB) * 24 + t * 2;
  float cr[4][2][N];
  for (int q = 0; q < 4; ++q)
    for (int h = 0; h < 2; ++h)
      for (int u = 0; u < N; ++u) cr[q][h][u] = 0.0f;
  for (int G = G0; G < G1; ++G) {
    uint4 wv[8];
    uint32_t sv[8];
    w13_group(wv, sv, w13, s13, roff, G);
    uint2 bw[rot_accs<N>];
    load_rot<N>(bw, xr, 4 * G + g / 2, g);
K4_FAST_UNROLL
    for (int q = 0; q < 4; ++q)
      tile_rot<N>(cr[q], wv[2 * q], wv[2 * q + 1], sv[2 * q], sv[2 * q + 1], bw, sm.fb, sm.sb, KB, 4 * G, g, t);
  }
  if (t == 0)
    for (int q = 0; q < 4; ++q)
      for (int h = 0; h < 2; ++h)
        for (int u = 0; u < N; ++u) sm.chains[((w * 4 + q) * 16 + g + 8 * h) * kUses + u] = cr[q][h][u];
}

// 2 CTAs a SM (registers capped at 128; ptxas spills ~100 bytes a thread to L1-resident stack):
// the kernel is issue-latency bound with 8 warps a SM (ncu: 8.2 cycles between a warp's
// instructions, 23% SM throughput), and 16 warps measured 1.5x faster on the H200
// (docs/performance.md). The bits cannot change: the same instructions, other registers.
template <bool kRot>
__global__ void __launch_bounds__(256, 2) fast_up_gate_kernel(FastUpGateArgs a) {
  k4_grid_dep_start();
  K4_DYNAMIC_SMEM(dyn);
  __shared__ int uses[kMaxUseList];
  __shared__ __align__(4) uint8_t hit[kMaxUseList + 3];
  const DevCfg& cfg = a.cfg;
  const int r = blockIdx.z, rg = blockIdx.y, S = a.tokens, HID = cfg.hidden, I = cfg.inter, SL = cfg.moe_slots;
  const int KB = HID / 32;
  const int32_t* list = a.ulist + size_t(r) * (cfg.n_experts + 1);
  if (int(blockIdx.x) >= list[cfg.n_experts]) return;  // uniform
  const int e = list[blockIdx.x];
  const size_t ex = size_t(r) * cfg.n_experts + e;
  if (a.ex.w13[ex] == nullptr || a.ex.s13[ex] == nullptr) {  // not on the device: the runner uploads, reruns
    if (threadIdx.x == 0) atomicExch(a.missing, 1);
    return;
  }
  UgSmem sm;
  sm.uses = uses, sm.hit = hit;
  sm.fb = reinterpret_cast<float*>(dyn);
  sm.chains = sm.fb + kUses * KB;
  sm.midv = sm.chains + cfg.waves * 4 * 16 * kUses;
  sm.sb = reinterpret_cast<uint8_t*>(sm.midv + kUses * 32);
  const int n_use = build_uses(sm.uses, sm.hit, a.ids, r, e, S, cfg);
  const int w = int(threadIdx.x) / 32;
  for (int u0 = 0; u0 < n_use; u0 += kUses) {
    const int nu = n_use - u0 < kUses ? n_use - u0 : kUses;
    // only the columns this pass's tiles read: two n8 groups, one, or the rotated tiles' one
    const int cols = nu > 8 ? kUses : kRot && nu <= 2 ? nu : 8;
    fill_b_factors(sm.fb, sm.sb, a.xsc, a.xnan, sm.uses + u0, nu, cols, KB, size_t(r) * S, SL);
    __syncthreads();
    if (nu > 8) up_gate_slice<2>(a, r, e, rg, w, sm, u0, nu);
    else if (kRot && nu == 1) up_gate_slice_rot<1>(a, r, e, rg, w, sm, u0);
    else if (kRot && nu == 2) up_gate_slice_rot<2>(a, r, e, rg, w, sm, u0);
    else up_gate_slice<1>(a, r, e, rg, w, sm, u0, nu);
    __syncthreads();
    for (int i = int(threadIdx.x); i < nu * 32; i += int(blockDim.x)) {
      const int col = i / 32, rr = i % 32, h = rr / 16, rin = rr % 16, ks = sm.uses[u0 + col];
      float g = 0.0f, up = 0.0f;  // gsum = 0.0; gsum = gsum + wave partial, waves in order
      for (int wv = 0; wv < cfg.waves; ++wv) g = g + sm.chains[(((K4_MUTANT_ON(85) ? cfg.waves - 1 - wv : wv) * 4 + h) * 16 + rin) * kUses + col];
      for (int wv = 0; wv < cfg.waves; ++wv) up = up + sm.chains[((wv * 4 + 2 + h) * 16 + rin) * kUses + col];
      const size_t o = (size_t(r) * S * SL + ks) * I + rg * 32 + rr;
      a.gate[o] = canon_nan(g);
      a.up[o] = canon_nan(up);
      uint16_t m = bf16_bits_rne(swiglu(g, up, cfg.swiglu_limit));
      if (kPlantFast && r == 0 && ks == 0 && rg == 0 && rr == 0) m ^= 1;
      a.mid[o] = m;
      sm.midv[col * 32 + rr] = bf16_to_f32(m);
    }
    __syncthreads();
    // mid -> MXFP8, the slot's block rg: a warp a use, a lane an element (one thread a use left
    // the CTA waiting at the barrier below). The amax is IEEE maximum (fmax_ieee: NaN wins, -0 <
    // +0), associative and commutative, so a butterfly over the 32 lanes gives mx8_block_amax's
    // bits (test_mx: "MXFP8 amax by a butterfly"); then each lane quantizes its element.
    const int lane = int(threadIdx.x) % 32;
    for (int col = w; col < nu; col += cfg.waves) {  // uniform in a warp: every lane shuffles
      const int ks = sm.uses[u0 + col];
      const float x = sm.midv[col * 32 + lane];
      float amax = fmax_ieee(x, -x);
      for (int off = 16; off > 0; off /= 2) {
        const float other = k4_shfl_xor(amax, off, 32);
        amax = K4_MUTANT_ON(86) ? mut::fmax_drop_nan(amax, other) : fmax_ieee(amax, other);
      }
      const Mx8Scale sc = mx8_scale_of_amax(amax);
      a.mid8[(size_t(r) * S * SL + ks) * I + rg * 32 + lane] = mx8_quant(x, sc.inv);
      if (lane == 0) a.midsc[(size_t(r) * S * SL + ks) * (I / kBlockK) + rg] = sc.e;
    }
    __syncthreads();
  }
}

// ------------------------------------------------------------------------------ down units
// Lane (g, t)'s rows row0 + 16 h + g + 8 x (x = 0, 1 of tile h = 0, 1) of expert e's w2 (fragment
// order: its 16 bytes of a group) and s2.
__device__ inline void w2_rows(const uint8_t* (&wrow)[4], const uint8_t* (&srow)[4], const FastUnitsArgs& a, int r, int e,
                               int row0, int g, int t) {
  const int I = a.cfg.inter, IB = I / 32;
  const size_t ex = size_t(r) * a.cfg.n_experts + e;
  for (int h = 0; h < 2; ++h)
    for (int x = 0; x < 2; ++x) {
      const int row = row0 + 16 * h + g + 8 * x;
      wrow[2 * h + x] = a.ex.w2[ex] + size_t(row) * (I / 2) + 16 * t;
      srow[2 * h + x] = a.ex.s2[ex] + size_t(row) * IB;
    }
}
// Group kc (a 128-k unit) of those rows: 16 bytes of weights and 4 scales each.
__device__ inline void w2_group(uint4 (&wv)[4], uint32_t (&sv)[4], const uint8_t* const (&wrow)[4],
                                const uint8_t* const (&srow)[4], int kc) {
  for (int x = 0; x < 4; ++x) {
    wv[x] = load_stream(wrow[x] + size_t(kc) * 64);
    sv[x] = *reinterpret_cast<const uint32_t*>(srow[x] + 4 * kc);
  }
}
// A down-units lane's shape and its w2 / s2 rows (w2_rows), shared by the plain and rotated tiles.
struct DownLane {
  int HID, IB, KC, SL, S, g, t;
  const uint8_t* wrow[4];
  const uint8_t* srow[4];
  __device__ DownLane(const FastUnitsArgs& a, int r, int e, int row0)
      : HID(a.cfg.hidden), IB(a.cfg.inter / 32), KC(a.cfg.inter / 128), SL(a.cfg.moe_slots), S(a.tokens),
        g(int(threadIdx.x) % 32 / 4), t(int(threadIdx.x) % 4) {
    w2_rows(wrow, srow, a, r, e, row0, g, t);
  }
};
template <int NG>
__device__ void down_units_tile(const FastUnitsArgs& a, int r, int e, int row0, const int* uses, int u0, int nu,
                                const float* fb, const uint8_t* sbs) {
  const DownLane L(a, r, e, row0);
  const int HID = L.HID, IB = L.IB, KC = L.KC, SL = L.SL, S = L.S, g = L.g, t = L.t;
  const uint8_t* const(&wrow)[4] = L.wrow;
  const uint8_t* const(&srow)[4] = L.srow;
  const uint32_t* mb[NG];
  for (int grp = 0; grp < NG; ++grp) {
    const int u = grp * 8 + g;
    mb[grp] = u < nu ? a.mlimbs + ((size_t(r) * S * SL + uses[u0 + u]) * IB) * 24 + t * 2 : nullptr;
  }
  for (int kc = 0; kc < KC; ++kc) {  // a unit = a 128-k chunk = one 64-byte group of 4 blocks
    uint4 wv[4];
    uint32_t sv[4];
    w2_group(wv, sv, wrow, srow, kc);
    float un[2][NG][4];  // tile h, column group, fragment element
    for (int grp = 0; grp < NG; ++grp)
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 4; ++i) un[h][grp][i] = 0.0f;
K4_FAST_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int b = 4 * kc + j;
      FragB B[NG][3];
      load_b(B, mb, b);
K4_FAST_UNROLL
      for (int h = 0; h < 2; ++h) tile_block(un[h], wv[2 * h], wv[2 * h + 1], sv[2 * h], sv[2 * h + 1], j, B, fb, sbs, IB, b, t);
    }
    for (int grp = 0; grp < NG; ++grp)
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 4; ++i) {
          const int col = grp * 8 + 2 * t + (i % 2);
          if (col >= nu) continue;
          const int row = row0 + 16 * h + g + 8 * (i / 2);
          a.units[(((size_t(r) * S * SL + uses[u0 + col]) * HID) + row) * KC + kc] = un[h][grp][i];
        }
  }
}

// down_units_tile for a pass of N = 1 or 2 uses: the rotated tiles (tile_rot), a unit = one
// 64-byte group.
template <int N>
__device__ void down_units_rot(const FastUnitsArgs& a, int r, int e, int row0, const int* uses, int u0, const float* fb,
                               const uint8_t* sbs) {
  const DownLane L(a, r, e, row0);
  const int HID = L.HID, IB = L.IB, KC = L.KC, SL = L.SL, S = L.S, g = L.g, t = L.t;
  const uint8_t* const(&wrow)[4] = L.wrow;
  const uint8_t* const(&srow)[4] = L.srow;
  size_t use[N];
  const uint32_t* mr[N];
  for (int u = 0; u < N; ++u) {
    use[u] = size_t(r) * S * SL + uses[u0 + u];
    mr[u] = a.mlimbs + (use[u] * IB) * 24 + t * 2;
  }
  for (int kc = 0; kc < KC; ++kc) {
    uint4 wv[4];
    uint32_t sv[4];
    w2_group(wv, sv, wrow, srow, kc);
    uint2 bw[rot_accs<N>];
    load_rot<N>(bw, mr, 4 * kc + g / 2, g);
K4_FAST_UNROLL
    for (int h = 0; h < 2; ++h) {
      float un[2][N];
      for (int x = 0; x < 2; ++x)
        for (int u = 0; u < N; ++u) un[x][u] = 0.0f;
      tile_rot<N>(un, wv[2 * h], wv[2 * h + 1], sv[2 * h], sv[2 * h + 1], bw, fb, sbs, IB, 4 * kc, g, t);
      if (t == 0)
        for (int x = 0; x < 2; ++x)
          for (int u = 0; u < N; ++u) a.units[(use[u] * HID + row0 + 16 * h + g + 8 * x) * KC + kc] = un[x][u];
    }
  }
}

constexpr int kDnWarps = 4;  // 32 rows a warp, 128 a CTA

template <bool kRot>
__global__ void __launch_bounds__(128) fast_down_units_kernel(FastUnitsArgs a) {
  k4_grid_dep_start();
  __shared__ int uses[kMaxUseList];
  __shared__ __align__(4) uint8_t hit[kMaxUseList + 3];
  __shared__ float fb[kUses * 32];  // (kUses, IB <= 32)
  __shared__ uint8_t sbs[kUses * 32];
  const DevCfg& cfg = a.cfg;
  const int r = blockIdx.z, S = a.tokens, I = cfg.inter, IB = I / 32, SL = cfg.moe_slots;
  const int32_t* list = a.ulist + size_t(r) * (cfg.n_experts + 1);
  if (int(blockIdx.x) >= list[cfg.n_experts]) return;
  const int e = list[blockIdx.x];
  const size_t ex = size_t(r) * cfg.n_experts + e;
  if (a.ex.w2[ex] == nullptr || a.ex.s2[ex] == nullptr) {
    if (threadIdx.x == 0) atomicExch(a.missing, 1);
    return;
  }
  const int n_use = build_uses(uses, hit, a.ids, r, e, S, cfg);
  const int row0 = int(blockIdx.y) * 32 * kDnWarps + 32 * (int(threadIdx.x) / 32);
  for (int u0 = 0; u0 < n_use; u0 += kUses) {
    const int nu = n_use - u0 < kUses ? n_use - u0 : kUses;
    fill_b_factors(fb, sbs, a.midsc, a.mnan, uses + u0, nu, kUses, IB, size_t(r) * S * SL, 1);
    __syncthreads();
    if (nu > 8) down_units_tile<2>(a, r, e, row0, uses, u0, nu, fb, sbs);
    else if (kRot && nu == 1) down_units_rot<1>(a, r, e, row0, uses, u0, fb, sbs);
    else if (kRot && nu == 2) down_units_rot<2>(a, r, e, row0, uses, u0, fb, sbs);
    else down_units_tile<1>(a, r, e, row0, uses, u0, nu, fb, sbs);
    __syncthreads();
  }
}

// K4_FAST_ROT=0: one- and two-use passes on the plain tiles too (the column rotation off; for timing)
bool fast_rot() {
  static const bool on = k4_env_on("K4_FAST_ROT");
  return on;
}

size_t up_gate_smem(const DevCfg& cfg) {
  const size_t KB = size_t(cfg.hidden) / 32;
  return kUses * KB * 4 + size_t(cfg.waves) * 4 * 16 * kUses * 4 + kUses * 32 * 4 + kUses * KB;
}

}  // namespace

void launch_e4m3_limbs(const LimbsArgs& a, hipStream_t s) {
  if (a.n % 32 != 0) throw std::invalid_argument("e4m3_limbs: rows must be whole 32-blocks");
  const size_t threads = size_t(a.rows) * (a.n / 32) * 4;
  if (threads == 0) return;
  k4_launch_dependent(e4m3_limbs_kernel, dim3(unsigned((threads + 127) / 128)), dim3(128), 0, s, a);
  K4_HIP_CHECK_LAUNCH();
}

void launch_fast_up_gate(const FastUpGateArgs& a, hipStream_t s) {
  const DevCfg& cfg = a.cfg;
  if (!fast_moe_supported(cfg, a.tokens)) throw std::invalid_argument("fast up/gate: this config is not supported");
  const size_t smem = up_gate_smem(cfg);
  const bool rot = fast_rot();
  static size_t allowed[2] = {48 * 1024, 48 * 1024};
  if (smem > allowed[rot]) {
    K4_HIP_CHECK(hipFuncSetAttribute(reinterpret_cast<const void*>(rot ? &fast_up_gate_kernel<true> : &fast_up_gate_kernel<false>),
                                     hipFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    allowed[rot] = smem;
  }
  const int max_experts = std::min(cfg.n_experts, cfg.top_k * a.tokens + 1);
  void (*const kernel)(FastUpGateArgs) = rot ? &fast_up_gate_kernel<true> : &fast_up_gate_kernel<false>;
  k4_launch_dependent(kernel, dim3(unsigned(max_experts), unsigned(cfg.inter / 32), unsigned(a.ranks)),
                     dim3(32 * cfg.waves), smem, s, a);
  K4_HIP_CHECK_LAUNCH();
}

void launch_fast_down_units(const FastUnitsArgs& a, hipStream_t s) {
  const DevCfg& cfg = a.cfg;
  if (!fast_moe_supported(cfg, a.tokens) || cfg.hidden % (32 * kDnWarps) != 0 || cfg.inter / 32 > 32)
    throw std::invalid_argument("fast down: this config is not supported");
  const int max_experts = std::min(cfg.n_experts, cfg.top_k * a.tokens + 1);
  void (*const kernel)(FastUnitsArgs) = fast_rot() ? &fast_down_units_kernel<true> : &fast_down_units_kernel<false>;
  k4_launch_dependent(kernel,
                     dim3(unsigned(max_experts), unsigned(cfg.hidden / (32 * kDnWarps)), unsigned(a.ranks)),
                     dim3(32 * kDnWarps), 0, s, a);
  K4_HIP_CHECK_LAUNCH();
}

}  // namespace k4::gpu
