// Stage 1, split: FP8 attention over the selected keys. Contract in split.hpp; the seed's
// stage_split (seed:L645-L880); the KV-scale modes are docs/numerics.md §13 V4.
#include "reference/stages/split.hpp"

#include <algorithm>

#include "reference/numerics/bf16.hpp"
#include "reference/numerics/butterfly.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/mma.hpp"
#include "reference/stages/fast_dot.hpp"
#include "reference/numerics/policy.hpp"

namespace k4 {
namespace {

constexpr int kHeads = 16, kHeadDim = 128, kSplitKeys = 256, kWaveKeys = 32, kWaves = 8, kPage = 16;

// An E4M3 vector decoded once: exact integers (x 2^9) and a NaN flag a 32-block.
struct Fp8Vec {
  int32_t v[kHeadDim];
  uint8_t nan[kHeadDim / kBlockK];
  void load(const uint8_t* x, int n) {
    decode_e4m3_row_fast(v, x, n);
    for (int b = 0; b < n / kBlockK; ++b) nan[b] = 0;
    for (int i = 0; i < n; ++i) nan[i / kBlockK] |= e4m3_is_nan(x[i]);
  }
};

// One 256-key tile of the sparse context (keys 256 tau .. + 256: table words 16 tau .. + 16)
// with the keys [lo, hi) valid. The seed's partition t is tile t with [0, n_ctx); ATOM's
// split ranges (V4.3) take one or two tiles with their own [begin, end).
struct Tile {
  int32_t pages[kSplitKeys / kPage];
  bool valid[kSplitKeys];
  float ks[kSplitKeys], vs[kSplitKeys];  // the key's K / V scale (+0 where not valid)
};

void make_tile(Tile& tl, const StepRank& rk, const int32_t* table, int tau, int lo, int hi, const Config& cfg) {
  for (int p = 0; p < kSplitKeys / kPage; ++p) tl.pages[p] = table[tau * (kSplitKeys / kPage) + p];
  for (int kp = 0; kp < kSplitKeys; ++kp) {
    const int key = tau * kSplitKeys + kp;
    tl.valid[kp] = lo <= key && key < hi;
    const size_t at = cfg.one_kv_scale() ? 0 : size_t(tl.pages[kp / kPage]) * kPage + kp % kPage;
    tl.ks[kp] = tl.valid[kp] ? rk.k_scale[at] : 0.0f;
    tl.vs[kp] = tl.valid[kp] ? rk.v_scale[at] : 0.0f;
  }
}

const uint8_t* page_at(const std::vector<uint8_t>& cache, int32_t page) {
  return cache.data() + size_t(page) * size_t(kPage) * kHeadDim;
}

// QK (R1.2, R1.3), sc (seed:L750-L765): c = 0; c = c + block(s) over the 4 dim chunks;
// s = valid ? (f32(sm_scale) * ks) * c : NEG.
void tile_scores(float (*sc)[kSplitKeys], const StepRank& rk, const Tile& tl, const Fp8Vec* qh, float sm_scale) {
  for (int kp = 0; kp < kSplitKeys; ++kp) {
    const uint8_t* kpage = page_at(rk.k_cache, tl.pages[kp / kPage]);
    uint8_t kvec[kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) kvec[d] = kpage[k_byte(kp % kPage, d)];
    Fp8Vec kk;
    kk.load(kvec, kHeadDim);
    const float qk = sm_scale * tl.ks[kp];
    for (int h = 0; h < kHeads; ++h) {
      float c = 0.0f;
      for (int s = 0; s < kHeadDim / kBlockK; ++s)
        c = c + block_dot_ints(qh[h].v + s * kBlockK, kk.v + s * kBlockK, qh[h].nan[s] | kk.nan[s], 18);
      sc[h][kp] = tl.valid[kp] ? qk * c : kNegScore;
    }
  }
}

// Head max (R1.4), mh (seed:L773-L790): per wave max(s[j=0], s[j=1]) a lane, the 16-lane
// butterfly, then the waves in order.
void tile_head_max(float* mx, const float (*sc)[kSplitKeys]) {
  for (int h = 0; h < kHeads; ++h)
    for (int w = 0; w < kWaves; ++w) {
      float v16[16];
      for (int l16 = 0; l16 < 16; ++l16) v16[l16] = fmax_ieee(sc[h][w * kWaveKeys + l16], sc[h][w * kWaveKeys + kPage + l16]);
      const float mh = group_reduce(v16, 16, MaxF32{});
      mx[h] = w == 0 ? mh : fmax_ieee(mx[h], mh);
    }
}

// vmax (R1.5), vloc (seed:L767-L784): per wave the 64-lane max of (valid ? vs : +0), waves in order.
float tile_v_max(const Tile& tl) {
  float vmax = 0.0f;
  for (int w = 0; w < kWaves; ++w) {
    float vloc[kWaveLanes];
    for (int lane = 0; lane < kWaveLanes; ++lane) {
      const int k0 = w * kWaveKeys + lane % 16;
      vloc[lane] = fmax_ieee(tl.vs[k0], tl.vs[k0 + kPage]);
    }
    const float vw = wave_max(vloc);
    vmax = w == 0 ? vw : fmax_ieee(vmax, vw);
  }
  return vmax;
}

// P (R1.7-R1.9), pj (seed:L796-L822): p = exp2((s - m) * LOG2E) for every key; P8 =
// E4M3_NoSat(fold[key] * p), or E4M3_NoSat(p) without a fold (V4.3); the exp-sum:
// lane (0 + p_j0) + p_j1, the 16-lane butterfly, then sumf over the waves.
void tile_probs(uint8_t (*p8)[kSplitKeys], float* lsum, const float (*sc)[kSplitKeys], const float* mx,
                const float* fold) {
  for (int h = 0; h < kHeads; ++h)
    for (int w = 0; w < kWaves; ++w) {
      float lane_l[16];
      for (int l16 = 0; l16 < 16; ++l16) {
        float acc = 0.0f;
        for (int j = 0; j < 2; ++j) {
          const int kp = w * kWaveKeys + j * kPage + l16;
          const float pj = exp2_approx((sc[h][kp] - mx[h]) * kLog2e);
          acc = acc + pj;
          p8[h][kp] = e4m3_bits(fold ? fold[kp] * pj : pj, Fp8Overflow::NoSaturate);
        }
        lane_l[l16] = acc;
      }
      const float lw = group_reduce(lane_l, 16, AddF32{});
      lsum[h] = w == 0 ? lw : lsum[h] + lw;
    }
}

// PV (R1.10, R1.11), pw (seed:L824-L865): V bytes of keys not valid masked to 0; per wave
// 0 + the block dot over its 32 keys; acc = sumf over the waves.
void tile_pv(float (*acc)[kHeadDim], const StepRank& rk, const Tile& tl, const uint8_t (*p8)[kSplitKeys]) {
  for (int w = 0; w < kWaves; ++w) {
    uint8_t vcol[kHeadDim][kWaveKeys];
    for (int kw = 0; kw < kWaveKeys; ++kw) {
      const int kp = w * kWaveKeys + kw;
      const uint8_t* vpage = page_at(rk.v_cache, tl.pages[kp / kPage]);
      for (int d = 0; d < kHeadDim; ++d) vcol[d][kw] = tl.valid[kp] ? vpage[v_byte(kp % kPage, d)] : uint8_t(0);
    }
    Fp8Vec vd[kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) vd[d].load(vcol[d], kWaveKeys);
    for (int h = 0; h < kHeads; ++h) {
      Fp8Vec ph;
      ph.load(&p8[h][w * kWaveKeys], kWaveKeys);
      for (int d = 0; d < kHeadDim; ++d) {
        const float part = 0.0f + block_dot_ints(ph.v, vd[d].v, ph.nan[0] | vd[d].nan[0], 18);
        acc[h][d] = w == 0 ? part : acc[h][d] + part;
      }
    }
  }
}

struct TaskOut {
  uint16_t* o;  // (heads, head_dim)
  float* m;     // (heads)
  float* l;     // (heads)
};

// The seed's partition t (per_key, scalar: R1.1-R1.13) and vLLM's static path (static448,
// V4.2): one tile, keys [0, n_ctx).
void split_partition(TaskOut out, const StepRank& rk, const int32_t* table, int n_ctx, const Fp8Vec* qh, int t,
                     const Config& cfg) {
  static thread_local Tile tl;
  static thread_local float sc[kHeads][kSplitKeys], acc[kHeads][kHeadDim];
  static thread_local uint8_t p8[kHeads][kSplitKeys];
  make_tile(tl, rk, table, t, 0, n_ctx, cfg);
  tile_scores(sc, rk, tl, qh, cfg.sm_scale);
  float mx[kHeads], lsum[kHeads], fold[kSplitKeys], pscale;
  tile_head_max(mx, sc);
  if (cfg.variant.kv_scale == KvScale::static448) {
    // V4.2: no vmax and no fscale; P8 = E4M3(448 p) at a valid key; pscale = vs * INV448
    for (int kp = 0; kp < kSplitKeys; ++kp) fold[kp] = tl.valid[kp] ? kFp8Max : 0.0f;
    pscale = rk.v_scale[0] * kInvFp8Max;
  } else {
    const float vmax = tile_v_max(tl);
    const float fscale = kFp8Max * rcp_approx(vmax + 1e-8f);  // R1.6, fscale (seed:L791)
    pscale = vmax * kInvFp8Max;                               // pscale (seed:L792)
    for (int kp = 0; kp < kSplitKeys; ++kp) fold[kp] = tl.vs[kp] * fscale;  // R1.8
  }
  tile_probs(p8, lsum, sc, mx, fold);
  tile_pv(acc, rk, tl, p8);
  // R1.12, lsum (seed:L857-L877): o = bf16((pscale * acc) * (1 / (l > 0 ? l : 1)))
  for (int h = 0; h < kHeads; ++h) {
    const float inv_l = 1.0f / (lsum[h] > 0.0f ? lsum[h] : 1.0f);
    for (int d = 0; d < kHeadDim; ++d) out.o[h * kHeadDim + d] = bf16_bits_rne((pscale * acc[h][d]) * inv_l);
    out.m[h] = canon_nan(mx[h]);
    out.l[h] = canon_nan(lsum[h]);
  }
}

// ATOM's cache_mode="vllm" split t (V4.3): the keys [t span, min(t span + span, n_ctx)) with
// span = ceil(n_ctx / 8), over the one or two 256-key tiles they meet, by online softmax.
void split_range(TaskOut out, const StepRank& rk, const int32_t* table, int n_ctx, const Fp8Vec* qh, int t,
                 const Config& cfg) {
  static thread_local Tile tl;
  static thread_local float sc[kHeads][kSplitKeys], acc[kHeads][kHeadDim], o_run[kHeads][kHeadDim];
  static thread_local uint8_t p8[kHeads][kSplitKeys];
  const int span = (n_ctx + cfg.n_split - 1) / cfg.n_split, begin = t * span, end = std::min(begin + span, n_ctx);
  const float vs = rk.v_scale[0];
  float m_run[kHeads], l_run[kHeads];
  for (int h = 0; h < kHeads; ++h) {
    m_run[h] = kNegScore, l_run[h] = 0.0f;
    for (int d = 0; d < kHeadDim; ++d) o_run[h][d] = 0.0f;
  }
  const int tau_end = begin < end ? (end + kSplitKeys - 1) / kSplitKeys : 0;
  for (int tau = begin / kSplitKeys; tau < tau_end; ++tau) {
    make_tile(tl, rk, table, tau, begin, end, cfg);
    tile_scores(sc, rk, tl, qh, cfg.sm_scale);
    float mx[kHeads], lsum[kHeads];
    tile_head_max(mx, sc);
    for (int h = 0; h < kHeads; ++h) mx[h] = fmax_ieee(mx[h], m_run[h]);
    tile_probs(p8, lsum, sc, mx, nullptr);  // P8 = E4M3_NoSat(p): no 448, no scale
    tile_pv(acc, rk, tl, p8);
    for (int h = 0; h < kHeads; ++h) {
      const float factor = exp2_approx((m_run[h] - mx[h]) * kLog2e);
      for (int d = 0; d < kHeadDim; ++d) o_run[h][d] = (o_run[h][d] * factor) + (vs * acc[h][d]);
      l_run[h] = (factor * l_run[h]) + lsum[h];
      m_run[h] = mx[h];
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    const float inv_l = 1.0f / (l_run[h] > 0.0f ? l_run[h] : 1.0f);
    for (int d = 0; d < kHeadDim; ++d) out.o[h * kHeadDim + d] = bf16_bits_rne(o_run[h][d] * inv_l);
    out.m[h] = canon_nan(m_run[h]);
    out.l[h] = canon_nan(l_run[h]);
  }
}

}  // namespace

void split_attention(SplitOut& out, const StepShared& sh, const StepRank& rk, const IndexOut& idx, const Config& cfg) {
  const int S = sh.tokens, OK = cfg.o_k(), NS = cfg.n_split, TW = cfg.sparse_table_words();
  out.q8.assign(size_t(S) * OK, 0);
  out.o.assign(size_t(S) * NS * OK, 0);
  out.m.assign(size_t(S) * NS * kHeads, 0.0f);
  out.l.assign(size_t(S) * NS * kHeads, 0.0f);
  // q -> E4M3, no clamp (fp8_pack4 (seed:L743))
  for (size_t i = 0; i < out.q8.size(); ++i) out.q8[i] = e4m3_bits(bf16_to_f32(rk.q[i]), Fp8Overflow::NoSaturate);
  const bool ranges = cfg.variant.kv_scale == KvScale::atom_vllm;
#pragma omp parallel for schedule(dynamic)
  for (int task = 0; task < S * NS; ++task) {
    const int tok = task / NS, t = task % NS;
    const int32_t* table = idx.sparse_table.data() + size_t(tok) * TW;
    Fp8Vec qh[kHeads];
    for (int h = 0; h < kHeads; ++h) qh[h].load(out.q8.data() + size_t(tok) * OK + h * kHeadDim, kHeadDim);
    const size_t ts = size_t(task);  // tok * N_SPLIT + t
    const TaskOut to{out.o.data() + ts * OK, out.m.data() + ts * kHeads, out.l.data() + ts * kHeads};
    if (ranges)
      split_range(to, rk, table, table[TW - 1], qh, t, cfg);
    else
      split_partition(to, rk, table, table[TW - 1], qh, t, cfg);
  }
}

}  // namespace k4
