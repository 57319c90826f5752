// split.cu -- stage 1, split: FP8 attention over one partition of the selected keys; the twin
// of reference/stages/split.cpp (stage_split (seed:L645-L880)).
//
// Contract (reference/stages/split.hpp), per token, partition t (keys t*256 .. +256 of the
// sparse context), head h:
//   q8   = E4M3(q) (NoSaturate)
//   c    = 0; c = c + block_dot(q8 chunk s, K chunk s) for the 4 dim chunks in order
//   s    = (f32(sm_scale) * k_scale[key]) * c, NEG past n_ctx
//   m    = per wave (32 keys) the 16-lane tree of max(s[l16], s[16 + l16]), waves in order
//   vmax = per wave the 64-lane tree of max(v_scale or 0), waves in order
//   fscale = 448 * rcp(vmax + 1e-8), pscale = vmax * f32(1/448)
//   p    = exp2((s - m) * log2e); P8 = E4M3((vs * fscale) * p) (NoSaturate)
//   l    = per wave and lane (p0 + p1), the 16-lane tree, waves in order
//   PV   = per wave 0 + block_dot(P8 of its 32 keys, V column masked past n_ctx), waves in order
//   o    = bf16((pscale * acc) * (1 / (l > 0 ? l : 1)))
// KV-scale modes (docs/numerics.md §13 V4): scalar reads k_scale[0] / v_scale[0]; static448
// (vLLM) has P8 = E4M3((valid ? 448 : 0) * p) and pscale = v_scale[0] / 448; atom_vllm (ATOM's
// cache_mode="vllm") runs split t over the keys [t span, min(t span + span, n_ctx)),
// span = ceil(n_ctx / 8), tile by tile (256 keys) with P8 = E4M3(p) and a running
// (m, l, o): o = (o * factor) + (v_scale[0] * PV), l = (factor * l) + lsum.
// One block of 512 threads a (token, partition) and rank; phases: q -> q8 (decoded once),
// QK (a thread a key and 8 heads: its K chunk decoded once for the 8), maxima, P, exp-sums,
// PV + output (a thread a dim and 4 heads: its V column decoded once for the 4). K and V
// are read straight from the pages as 16-byte loads (consecutive keys / dims: consecutive
// 16 bytes); keys past n_ctx are not read at all.
// SplitBody<true> (K4_FAST=1) runs QK and PV on the integer tensor cores instead
// (device/exact_mma.hpp: the 16 heads are one m16 tile, a block's exact sum from 9 mma.sync s8,
// the same block values in the same chains); every other phase is the same code.
#include <stdexcept>

#include "device/exact_mma.hpp"
#include "device/mutants.hpp"
#include "device/stages.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/butterfly.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/mma.hpp"
#include "reference/numerics/policy.hpp"

namespace k4::gpu {
namespace {

constexpr int kHeads = 16, kHeadDim = 128, kSplitKeys = 256, kWaveKeys = 32, kWaves = 8, kPage = 16;
constexpr int kChunks = kHeadDim / kBlockK;        // 4 QK blocks a head
constexpr float kNegScore = -3.4e38f;              // the seed's NEG
constexpr size_t kPageBytes = size_t(kPage) * kHeadDim;

// 32 E4M3 codes -> exact integers (x 2^9) and whether one is NaN.
K4_BODY bool decode_e4m3_block(int32_t* out, const uint8_t* codes) {
  bool nan = false;
  for (int i = 0; i < kBlockK; ++i) {
    out[i] = e4m3_to_int_x512(codes[i]);
    nan |= e4m3_is_nan(codes[i]);
  }
  return nan;
}

struct Smem {
  float* sc;         // (16, 256) scores
  int32_t* p_int;    // (16, 256) P8 decoded
  int32_t* q_int;    // (16, 128) q8 decoded
  float* lane_l;     // (16, 8, 16) exp-sum lane values
  uint8_t* q8;       // (16, 128)
  uint8_t* p8;       // (16, 256)
  uint8_t* qnan;     // (16, 4)
  uint8_t* pnan;     // (16, 8)
  float* mx;         // (16)
  float* ls;         // (8, 16)
  float* misc;       // vmax, fscale, pscale, -, the 8 waves' v_scale maxima
  float* vs;         // (256) v_scale of the valid keys, 0 otherwise
  int32_t* pages;    // (16) the tile's pages + n_ctx
  float* o_run;      // (16, 128) ATOM's running output (V4.3)
  float* m_run;      // (16)
  float* l_run;      // (16)
};

template <class C>
K4_BODY Smem carve(C& cv) {
  Smem s;
  s.sc = cv.template take<float>(kHeads * kSplitKeys);
  s.p_int = cv.template take<int32_t>(kHeads * kSplitKeys);
  s.q_int = cv.template take<int32_t>(kHeads * kHeadDim);
  s.lane_l = cv.template take<float>(kHeads * kWaves * 16);
  s.q8 = cv.template take<uint8_t>(kHeads * kHeadDim);
  s.p8 = cv.template take<uint8_t>(kHeads * kSplitKeys);
  s.qnan = cv.template take<uint8_t>(kHeads * kChunks);
  s.pnan = cv.template take<uint8_t>(kHeads * kWaves);
  s.mx = cv.template take<float>(kHeads);
  s.ls = cv.template take<float>(kWaves * kHeads);
  s.misc = cv.template take<float>(4 + kWaves);
  s.vs = cv.template take<float>(kSplitKeys);
  s.pages = cv.template take<int32_t>(kSplitKeys / kPage + 1);
  s.o_run = cv.template take<float>(kHeads * kHeadDim);
  s.m_run = cv.template take<float>(kHeads);
  s.l_run = cv.template take<float>(kHeads);
  return s;
}

constexpr int kStatic448 = int(KvScale::static448), kAtomVllm = int(KvScale::atom_vllm);

// The tensor-core body's shared memory, after the CUDA-core body's (carve): the limb table
// and the A fragments of q8 (4 blocks) and of P8 (8 waves), 3 limbs each.
struct MmaSmem {
  uint32_t* dec;  // (256) code -> limbs (xmma::limbs_entry)
  uint32_t* qa;   // (4 blocks, 3 limbs, 32 lanes, 4 registers)
  uint32_t* pa;   // (8 waves, 3 limbs, 32 lanes, 4 registers)
};
template <class C>
K4_BODY MmaSmem carve_mma(C& cv) {
  MmaSmem x;
  x.dec = cv.template take<uint32_t>(256);
  x.qa = cv.template take<uint32_t>(kChunks * 3 * 32 * 4);
  x.pa = cv.template take<uint32_t>(kWaves * 3 * 32 * 4);
  return x;
}
constexpr int kThreads = 512;

// kMma: QK and PV on the integer tensor cores (the fast path); otherwise on the CUDA
// cores, a thread a key / a dim. Every other phase is the same code.
template <bool kMma>
struct SplitBody {
  SplitArgs a;

  // Head hh, dim d's PV chain acc -> the output o (and m, l at d = 0), or ATOM's running o (V4.3).
  K4_BODY void emit_o(const Smem& m, int hh, int d, float acc, float pscale, size_t ts, int r, const float* vsc) const {
    const DevCfg& cfg = a.cfg;
    const int NS = cfg.n_split, S = a.tokens, OK = cfg.o_k;
    if (cfg.kv_scale == kAtomVllm) {  // V4.3: o_run = (o_run * factor) + (vs * acc)
      const float factor = exp2_approx((m.m_run[hh] - m.mx[hh]) * kLog2e);
      m.o_run[hh * kHeadDim + d] = (m.o_run[hh * kHeadDim + d] * factor) + (vsc[0] * acc);
      return;
    }
    float lsum = m.ls[hh];
    for (int w = 1; w < kWaves; ++w) lsum = lsum + m.ls[(K4_MUTANT_ON(19) ? kWaves - w : w) * kHeads + hh];
    const float inv_l = 1.0f / (lsum > 0.0f || K4_MUTANT_ON(20) ? lsum : 1.0f);
    uint16_t ob = bf16_bits_rne((pscale * acc) * inv_l);
    if (kPlantStage == 1 && r == 0 && ts == 0 && hh == 0 && d == 0) ob ^= 1;
    a.o[(size_t(r) * S * NS + ts) * OK + hh * kHeadDim + d] = ob;
    if (d == 0) {
      a.m[(size_t(r) * S * NS + ts) * kHeads + hh] = canon_nan(m.mx[hh]);
      a.l[(size_t(r) * S * NS + ts) * kHeads + hh] = canon_nan(lsum);
    }
  }

  // One 256-key tile tau of the sparse context with the keys [lo, hi) valid: scores, maxima,
  // P and exp-sums, then PV. The seed's partition t is tile t with [0, n_ctx) (mode per_key,
  // scalar, static448: the output is written here); ATOM's split ranges (V4.3) fold each tile
  // into the running m / l / o instead.
  template <class Ctx>
  K4_BODY void tile(Ctx& c, const Smem& m, const MmaSmem& x, int tau, int lo, int hi) const {
    const DevCfg& cfg = a.cfg;
    const int NS = cfg.n_split, tok = c.bx / NS, t = c.bx % NS, r = c.by, S = a.tokens;
    const int mode = cfg.kv_scale;
    const int32_t* table = a.sparse_table + (size_t(r) * S + tok) * cfg.table_words;
    const uint8_t* kc = a.k_cache + size_t(r) * a.cache_slice;
    const uint8_t* vc = a.v_cache + size_t(r) * a.cache_slice;
    const float* ksc = a.k_scale + size_t(r) * a.scale_slice;
    const float* vsc = a.v_scale + size_t(r) * a.scale_slice;
    const int key0 = tau * kSplitKeys;  // the tile's first key
    auto valid = [&](int kp) { return lo <= key0 + kp && key0 + kp < hi; };
    auto kscale = [&](int kp) { return cfg.one_kv_scale ? ksc[0] : ksc[size_t(m.pages[kp / kPage]) * kPage + kp % kPage]; };
    auto vscale = [&](int kp) { return cfg.one_kv_scale ? vsc[0] : vsc[size_t(m.pages[kp / kPage]) * kPage + kp % kPage]; };

    // the tile's 16 pages (slots 2 tau, 2 tau + 1)
    c.each(kSplitKeys / kPage, [&](int i) { m.pages[i] = table[tau * (kSplitKeys / kPage) + i]; });
    c.each(kSplitKeys, [&](int kp) { m.vs[kp] = valid(kp) || K4_MUTANT_ON(17) ? vscale(kp) : 0.0f; });

    // QK, sc (seed:L750-L765): thread (key kp, heads 8 hg .. + 8), or the tensor cores
    if constexpr (kMma) {
      this->qk_mma(c, m, x, kc, valid, kscale);
    } else {
    c.each(2 * kSplitKeys, [&](int i) {
      const int kp = i % kSplitKeys, hg = i / kSplitKeys;
      const bool ok = valid(kp);
      float acc[8];
      for (int h = 0; h < 8; ++h) acc[h] = 0.0f;
      const uint8_t* kpage = kc + size_t(m.pages[kp / kPage]) * kPageBytes;
      for (int s0 = 0, s; s0 < kChunks && (s = K4_MUTANT_ON(18) ? kChunks - 1 - s0 : s0, true); ++s0) {
        uint8_t kb[kBlockK];
        for (int half = 0; half < 2; ++half) {  // dims 32 s + 16 half .. + 16: bytes (d / 16) * 256 + t * 16
          Bytes16 v{};
          if (ok) v = load16(kpage + size_t(2 * s + half) * 256 + (kp % kPage) * 16);
          for (int j = 0; j < 16; ++j) kb[16 * half + j] = v.b[j];
        }
        int32_t ki[kBlockK];
        const bool knan = decode_e4m3_block(ki, kb);
        for (int h = 0; h < 8; ++h) {
          const int hh = hg * 8 + h;
          acc[h] = acc[h] + block_dot_ints(m.q_int + hh * kHeadDim + s * kBlockK, ki,
                                           knan || m.qnan[hh * kChunks + s] != 0, 18);
        }
      }
      const float qk = ok ? cfg.sm_scale * kscale(kp) : 0.0f;
      for (int h = 0; h < 8; ++h) m.sc[(hg * 8 + h) * kSplitKeys + kp] = ok || K4_MUTANT_ON(15) ? qk * acc[h] : kNegScore;
    });
    }

    // maxima, vloc (seed:L767-L792): head max per wave (16-lane tree) and v_scale max per wave
    // (64-lane tree), then the waves in order
    float* mh = m.ls;  // (16, 8) per-wave head maxima; ls is written only later
    c.each(kHeads * kWaves + kWaves, [&](int i) {
      if (i < kHeads * kWaves) {
        const int h = i / kWaves, w = i % kWaves;
        float v16[16];
        for (int l16 = 0; l16 < 16; ++l16)
          v16[l16] = fmax_ieee(m.sc[h * kSplitKeys + w * kWaveKeys + l16], m.sc[h * kSplitKeys + w * kWaveKeys + kPage + l16]);
        mh[i] = group_reduce(v16, 16, MaxF32{});
      } else {
        const int w = i - kHeads * kWaves;
        float vloc[kWaveLanes];
        for (int lane = 0; lane < kWaveLanes; ++lane) {
          const int l16 = lane % 16, k0 = w * kWaveKeys + l16, k1 = k0 + kPage;
          vloc[lane] = fmax_ieee(m.vs[k0], m.vs[k1]);  // valid ? v_scale : 0
        }
        m.misc[4 + w] = wave_max(vloc);
      }
    });
    c.each(kHeads + 1, [&](int h) {
      if (h < kHeads) {
        float mx = mh[h * kWaves];
        for (int w = 1; w < kWaves; ++w) mx = fmax_ieee(mx, mh[h * kWaves + w]);
        m.mx[h] = mode == kAtomVllm ? fmax_ieee(mx, m.m_run[h]) : mx;  // V4.3: max(M, m_run)
      } else {
        float vmax = m.misc[4];
        for (int w = 1; w < kWaves; ++w) vmax = fmax_ieee(vmax, m.misc[4 + w]);
        m.misc[0] = vmax;
        m.misc[1] = kFp8Max * rcp_approx(vmax + (K4_MUTANT_ON(22) ? 0.0f : 1e-8f));                          // fscale
        m.misc[2] = (mode == kStatic448 ? vsc[0] : vmax) * kInvFp8Max;          // pscale (V4.2: vs / 448)
      }
    });

    // P, pj (seed:L796-L822): item (head, wave, lane l16) -> its 2 keys' P8 and lane exp-sum.
    // P8 = E4M3((vs * fscale) * p); static448: E4M3((valid ? 448 : 0) * p); atom_vllm: E4M3(p)
    const float fscale = m.misc[1];
    c.each(kHeads * kWaves * 16, [&](int i) {
      const int h = i / (kWaves * 16), w = (i / 16) % kWaves, l16 = i % 16;
      float acc = 0.0f;
      for (int j = 0; j < 2; ++j) {
        const int kp = w * kWaveKeys + j * kPage + l16;
        const float pj = exp2_approx((m.sc[h * kSplitKeys + kp] - m.mx[h]) * kLog2e);
        acc = acc + pj;
        const float x = mode == kAtomVllm ? pj : (mode == kStatic448 ? (valid(kp) ? kFp8Max : 0.0f) * pj : K4_MUTANT_ON(21) ? m.vs[kp] * (fscale * pj) : (m.vs[kp] * fscale) * pj);
        const uint8_t b = e4m3_bits(x, Fp8Overflow::NoSaturate);
        m.p8[h * kSplitKeys + kp] = b;
        m.p_int[h * kSplitKeys + kp] = e4m3_to_int_x512(b);
      }
      m.lane_l[i] = acc;
    });
    c.each(kHeads * kWaves, [&](int i) {
      const int h = i / kWaves, w = i % kWaves;
      m.ls[w * kHeads + h] = group_reduce(m.lane_l + i * 16, 16, AddF32{});
      bool nan = false;
      for (int j = 0; j < kWaveKeys; ++j) nan |= e4m3_is_nan(m.p8[h * kSplitKeys + w * kWaveKeys + j]);
      m.pnan[h * kWaves + w] = nan ? 1 : 0;
    });
    if constexpr (kMma) this->a_fragments(c, x.pa, m.p8, kSplitKeys, kWaves, x.dec);

    // PV, pw (seed:L824-L852), and the output, lsum (seed:L857-L877): thread (dim d, heads 4 hg .. + 4)
    const float pscale = m.misc[2];
    const size_t ts = size_t(tok) * NS + t;
    auto emit = [&](int hh, int d, float acc) { emit_o(m, hh, d, acc, pscale, ts, r, vsc); };
    if constexpr (kMma) {
      this->pv_mma(c, m, x, vc, key0, lo, hi, valid, emit);
    } else {
    c.each(kHeadDim * 4, [&](int i) {
      const int d = i % kHeadDim, hg = i / kHeadDim;
      float acc[4];
      for (int h = 0; h < 4; ++h) acc[h] = 0.0f;
      for (int w = 0; w < kWaves; ++w) {
        uint8_t vb[kWaveKeys];
        for (int half = 0; half < 2; ++half) {  // keys 32 w + 16 half .. + 16 = page 2 w + half, bytes d * 16 + key
          const int kp0 = w * kWaveKeys + half * kPage;
          Bytes16 v{};  // a page half is read where one of its keys is valid
          if (key0 + kp0 < hi && key0 + kp0 + kPage > lo) v = load16(vc + size_t(m.pages[kp0 / kPage]) * kPageBytes + size_t(d) * 16);
          for (int j = 0; j < 16; ++j) vb[16 * half + j] = valid(kp0 + j) || K4_MUTANT_ON(16) ? v.b[j] : uint8_t(0);
        }
        int32_t vi[kBlockK];
        const bool vnan = decode_e4m3_block(vi, vb);
        for (int h = 0; h < 4; ++h) {
          const int hh = hg * 4 + h;
          const float part = 0.0f + block_dot_ints(m.p_int + hh * kSplitKeys + w * kWaveKeys, vi,
                                                   vnan || m.pnan[hh * kWaves + w] != 0, 18);
          acc[h] = w == 0 ? part : acc[h] + part;
        }
      }
      for (int h = 0; h < 4; ++h) emit(hg * 4 + h, d, acc[h]);
    });
    }
    if (mode != kAtomVllm) return;
    // V4.3: l_run = (factor * l_run) + lsum, m_run = max(M, m_run), after every o_run used them
    c.each(kHeads, [&](int h) {
      const float factor = exp2_approx((m.m_run[h] - m.mx[h]) * kLog2e);
      float lsum = m.ls[h];
      for (int w = 1; w < kWaves; ++w) lsum = lsum + m.ls[w * kHeads + h];
      m.l_run[h] = (factor * m.l_run[h]) + lsum;
      m.m_run[h] = m.mx[h];
    });
  }

  // ---- the tensor-core phases (kMma): the exact block sums of device/exact_mma.hpp, the same
  // block values (finish_block64(S, 18): block_dot_ints' NaN and rounding) in the same chains.
  // The A fragments (16 heads x 32, 3 limbs) of every block of a row-major (16, n) E4M3 matrix
  // in shared memory (q8: 4 dim blocks; P8: 8 waves of 32 keys), for every lane.
  template <class Ctx>
  __device__ void a_fragments(Ctx& c, uint32_t* frag, const uint8_t* rows, int n, int blocks, const uint32_t* dec) const {
    c.each(blocks * 32, [&](int i) {
      const int b = i / 32, lane = i % 32, g = lane / 4, t = lane % 4;
      const uint2 lo = *reinterpret_cast<const uint2*>(rows + g * n + 32 * b + 8 * t);
      const uint2 hi = *reinterpret_cast<const uint2*>(rows + (g + 8) * n + 32 * b + 8 * t);
      xmma::FragA A[3];
      xmma::a_limbs(A, lo, hi, dec);
      for (int l = 0; l < 3; ++l)
        reinterpret_cast<uint4*>(frag)[(b * 3 + l) * 32 + lane] = make_uint4(A[l].r[0], A[l].r[1], A[l].r[2], A[l].r[3]);
    });
  }
  __device__ static void load_a(xmma::FragA (&A)[3], const uint32_t* frag, int b, int lane) {
    for (int l = 0; l < 3; ++l) {
      const uint4 v = reinterpret_cast<const uint4*>(frag)[(b * 3 + l) * 32 + lane];
      A[l].r[0] = v.x, A[l].r[1] = v.y, A[l].r[2] = v.z, A[l].r[3] = v.w;
    }
  }
  // The NaN flag of C column 2t + j (j = 0, 1) from each lane's flag of its B column g: the
  // quad's OR is column g's, held by lanes 4 g ...
  __device__ static void column_nan(int (&col)[2], bool mine, int t) {
    int f = mine ? 1 : 0;
    f |= k4_shfl_xor(f, 1, 32);
    f |= k4_shfl_xor(f, 2, 32);
    col[0] = xmma::lane_shfl(uint32_t(f), 4 * (2 * t)) != 0;
    col[1] = xmma::lane_shfl(uint32_t(f), 4 * (2 * t + 1)) != 0;
  }

  // One block of a 16 x 8 tile: the B column's 8 codes a lane (bv), the A fragments of block b
  // (frag), the 9 MMAs into E, and the NaN flags of the lane's two C columns (the B block's).
  __device__ static void tile_block(xmma::FragC (&E)[5], int (&col_nan)[2], const uint2& bv, const uint32_t* frag, int b,
                                    const MmaSmem& x, int lane) {
    xmma::FragB B[3];
    xmma::b_limbs(B, bv, x.dec);
    xmma::FragA A[3];
    load_a(A, frag, b, lane);
    xmma::mma_f8f8(E, A, B);
    column_nan(col_nan, xmma::any_nan4(bv.x) || xmma::any_nan4(bv.y), lane % 4);
  }

  // QK: warp w takes the n8 key tiles w, w + 16 (B column g = key 8 tile + g: its K dims 32 s +
  // 8t .. of the page row; C reg i = head g + 8 (i / 2), key 8 tile + 2t + i % 2); per block s
  // in order: 9 MMAs, the block value (NaN: the key's K block or the head's q block), acc =
  // acc + value; then sc as the CUDA-core path writes it.
  template <class Ctx, class Valid, class Kscale>
  __device__ void qk_mma(Ctx& c, const Smem& m, const MmaSmem& x, const uint8_t* kc, Valid valid, Kscale kscale) const {
    const DevCfg& cfg = a.cfg;
    c.each(kThreads, [&](int i) {
      const int warp = i / 32, lane = i % 32, g = lane / 4, t = lane % 4;
      for (int tile = warp; tile < kSplitKeys / 8; tile += kThreads / 32) {
        const int kb = 8 * tile + g;
        const bool okb = valid(kb);
        const uint8_t* row = kc + size_t(m.pages[kb / kPage]) * kPageBytes + (kb % kPage) * 16 + (t % 2) * 8;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s = 0; s < kChunks; ++s) {  // dims 32 s + 8t .. + 8 = bytes (2 s + t / 2) * 256 + (t % 2) * 8
          const uint2 kv = okb ? *reinterpret_cast<const uint2*>(row + size_t(2 * s + t / 2) * 256) : make_uint2(0u, 0u);
          xmma::FragC E[5] = {};
          int kn[2];
          tile_block(E, kn, kv, x.qa, s, x, lane);
          for (int r = 0; r < 4; ++r) {
            const bool nan = kn[r % 2] != 0 || m.qnan[(g + 8 * (r / 2)) * kChunks + s] != 0;
            acc[r] = acc[r] + xmma::finish_block64(xmma::sum_f8f8(E, r), 18, 127, 127, nan);
          }
        }
        for (int r = 0; r < 4; ++r) {
          const int kp = 8 * tile + 2 * t + r % 2, h = g + 8 * (r / 2);
          const bool ok = valid(kp);
          const float qk = ok ? cfg.sm_scale * kscale(kp) : 0.0f;
          m.sc[h * kSplitKeys + kp] = ok ? qk * acc[r] : kNegScore;
        }
      }
    });
  }

  // PV: warp w takes the n8 dim tile w (B column g = dim 8 w + g: its V bytes of keys 32 v + 8t
  // .. + 8 of the wave, invalid keys 0; C reg i = head g + 8 (i / 2), dim 8 w + 2t + i % 2); per
  // wave v in order: 9 MMAs, part = 0 + the block value (NaN: the dim's V block or the head's
  // P8 block), acc = part (v = 0) or acc + part; then emit(head, dim, acc).
  template <class Ctx, class Valid, class Emit>
  __device__ void pv_mma(Ctx& c, const Smem& m, const MmaSmem& x, const uint8_t* vc, int key0, int lo, int hi, Valid valid,
                         Emit emit) const {
    c.each(kThreads, [&](int i) {
      const int warp = i / 32, lane = i % 32, g = lane / 4, t = lane % 4;
      for (int tile = warp; tile < kHeadDim / 8; tile += kThreads / 32) {
        const int db = 8 * tile + g;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int v = 0; v < kWaves; ++v) {
          const int kp0 = v * kWaveKeys + 8 * t;  // the lane's 8 keys: page 2 v + t / 2, bytes 16 db + (t % 2) * 8
          uint2 vv = make_uint2(0u, 0u);
          if (key0 + kp0 < hi && key0 + kp0 + 8 > lo) {  // read where one of the 8 keys is valid
            vv = *reinterpret_cast<const uint2*>(vc + size_t(m.pages[kp0 / kPage]) * kPageBytes + size_t(db) * 16 + (t % 2) * 8);
            uint32_t keep[2] = {0u, 0u};
            for (int j = 0; j < 8; ++j)
              if (valid(kp0 + j)) keep[j / 4] |= 0xFFu << (8 * (j % 4));
            vv.x &= keep[0], vv.y &= keep[1];
          }
          xmma::FragC E[5] = {};
          int vn[2];
          tile_block(E, vn, vv, x.pa, v, x, lane);
          for (int r = 0; r < 4; ++r) {
            const bool nan = vn[r % 2] != 0 || m.pnan[(g + 8 * (r / 2)) * kWaves + v] != 0;
            const float part = 0.0f + xmma::finish_block64(xmma::sum_f8f8(E, r), 18, 127, 127, nan);
            acc[r] = v == 0 ? part : acc[r] + part;
          }
        }
        for (int r = 0; r < 4; ++r) emit(g + 8 * (r / 2), 8 * tile + 2 * t + r % 2, acc[r]);
      }
    });
  }

  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int NS = cfg.n_split, tok = c.bx / NS, t = c.bx % NS, r = c.by, S = a.tokens, OK = cfg.o_k;
    SmemCarver cv{smem};
    const Smem m = carve(cv);
    MmaSmem x{};
    if constexpr (kMma) x = carve_mma(cv);
    const int32_t* table = a.sparse_table + (size_t(r) * S + tok) * cfg.table_words;
    const uint16_t* q = a.q + (size_t(r) * S + tok) * OK;

    // q -> E4M3, no clamp (fp8_pack4 (seed:L743)); n_ctx; ATOM's running state from (NEG, +0, +0)
    c.each(OK, [&](int i) {
      const uint8_t b = e4m3_bits(bf16_to_f32(q[i]), K4_MUTANT_ON(14) ? Fp8Overflow::Saturate : Fp8Overflow::NoSaturate);
      m.q8[i] = b;
      m.q_int[i] = e4m3_to_int_x512(b);
      if (t == 0) a.q8[(size_t(r) * S + tok) * OK + i] = b;
      if (i == 0) m.pages[kSplitKeys / kPage] = table[cfg.table_words - 1];
      if (i < kHeads * kHeadDim) m.o_run[i] = 0.0f;
      if (i < kHeads) m.m_run[i] = kNegScore, m.l_run[i] = 0.0f;
    });
    const int n_ctx = m.pages[kSplitKeys / kPage];
    c.each(kHeads * kChunks, [&](int i) {
      bool nan = false;
      for (int j = 0; j < kBlockK; ++j) nan |= e4m3_is_nan(m.q8[i * kBlockK + j]);
      m.qnan[i] = nan ? 1 : 0;
    });
    if constexpr (kMma) {
      c.each(256, [&](int i) { x.dec[i] = xmma::limbs_entry(uint8_t(i)); });
      this->a_fragments(c, x.qa, m.q8, kHeadDim, kChunks, x.dec);
    }
    if (cfg.kv_scale != kAtomVllm) {
      tile(c, m, x, t, 0, n_ctx);
      return;
    }
    // V4.3: split t covers [t span, min(t span + span, n_ctx)), span = ceil(n_ctx / 8), over the
    // 256-key tiles it meets in ascending order; o = bf16(o_run * (1 / (l_run > 0 ? l_run : 1)))
    const int span = (n_ctx + NS - 1) / NS, begin = t * span, end = begin + span < n_ctx ? begin + span : n_ctx;
    const int tau_end = begin < end ? (end + kSplitKeys - 1) / kSplitKeys : 0;
    for (int tau = begin / kSplitKeys; tau < tau_end; ++tau) tile(c, m, x, tau, begin, end);
    const size_t ts = size_t(tok) * NS + t;
    c.each(kHeads * kHeadDim, [&](int i) {
      const int hh = i / kHeadDim, d = i % kHeadDim;
      const float lr = m.l_run[hh];
      uint16_t ob = bf16_bits_rne(m.o_run[i] * (1.0f / (lr > 0.0f ? lr : 1.0f)));
      if (kPlantStage == 1 && r == 0 && ts == 0 && i == 0) ob ^= 1;
      a.o[(size_t(r) * S * NS + ts) * OK + i] = ob;
      if (d == 0) {
        a.m[(size_t(r) * S * NS + ts) * kHeads + hh] = canon_nan(m.m_run[hh]);
        a.l[(size_t(r) * S * NS + ts) * kHeads + hh] = canon_nan(lr);
      }
    });
  }
};

}  // namespace

#if defined(K4_HOST_EMULATION)
template <>
struct body_has_warps<SplitBody<true>> : std::true_type {};  // the MMA phases' items are warps (kernel.hpp)
#endif

bool fast_split_supported(const DevCfg& cfg, int tokens) {
  (void)cfg;
  return tokens >= 1;
}

void launch_split_attention(const SplitArgs& a, hipStream_t s, bool fast) {
  const DevCfg& cfg = a.cfg;
  if (cfg.heads != kHeads || cfg.head_dim != kHeadDim || cfg.split_keys != kSplitKeys || cfg.waves != kWaves ||
      cfg.page != kPage)
    throw std::invalid_argument("split kernel: needs 16 heads of 128, 256 keys a partition, 8 waves, 16-key pages");
  SmemSize sz;
  sz.add<float>(kHeads * kSplitKeys).add<int32_t>(kHeads * kSplitKeys).add<int32_t>(kHeads * kHeadDim);
  sz.add<float>(kHeads * kWaves * 16).add<uint8_t>(kHeads * kHeadDim).add<uint8_t>(kHeads * kSplitKeys);
  sz.add<uint8_t>(kHeads * kChunks).add<uint8_t>(kHeads * kWaves).add<float>(kHeads).add<float>(kWaves * kHeads);
  sz.add<float>(4 + kWaves).add<float>(kSplitKeys).add<int32_t>(kSplitKeys / kPage + 1);
  sz.add<float>(kHeads * kHeadDim).add<float>(kHeads).add<float>(kHeads);
  if (fast) {  // + the tensor-core body's MmaSmem (16 bytes for its alignment)
    const size_t extra =
        SmemSize().add<uint32_t>(256).add<uint32_t>(kChunks * 3 * 32 * 4).add<uint32_t>(kWaves * 3 * 32 * 4).used + 16;
    launch(SplitBody<true>{a}, Grid{a.tokens * cfg.n_split, a.ranks, 1}, kThreads, sz.used + extra, s);
    return;
  }
  launch(SplitBody<false>{a}, Grid{a.tokens * cfg.n_split, a.ranks, 1}, kThreads, sz.used, s);
}

}  // namespace k4::gpu
