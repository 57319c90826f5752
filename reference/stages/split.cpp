// Stage 1, split: FP8 attention over one partition of the selected keys. Contract in
// split.hpp; the seed's stage_split (seed:L645-L880).
#include "reference/stages/split.hpp"

#include <array>

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

// One (token, partition): the seed's split task ts = tok * N_SPLIT + t.
void split_task(SplitOut& out, const StepRank& rk, const int32_t* table, int n_ctx, const uint8_t* q8, int tok,
                int t, const Config& cfg) {
  const int stride_o = cfg.o_k();
  const float sm_scale = cfg.sm_scale;
  // The partition's 16 pages: slots 2t, 2t+1 (seed select_blocks: blk[(slot % 2) * 8 + j]).
  int32_t pages[16];
  for (int p = 0; p < 16; ++p) pages[p] = table[t * 16 + p];
  auto key_valid = [&](int kp) { return t * kSplitKeys + kp < n_ctx; };  // kp: key in partition
  auto page_of = [&](int kp) { return pages[kp / kPage]; };
  auto kscale = [&](int kp) { return cfg.one_kv_scale() ? rk.k_scale[0] : rk.k_scale[size_t(page_of(kp)) * kPage + kp % kPage]; };
  auto vscale = [&](int kp) { return cfg.one_kv_scale() ? rk.v_scale[0] : rk.v_scale[size_t(page_of(kp)) * kPage + kp % kPage]; };
  const size_t page_bytes = size_t(kPage) * kHeadDim;

  // QK, sc (seed:L750-L765): c = 0; c = c + block(s) for the 4 dim chunks; s = (sm * ks) * c.
  static thread_local float sc[kHeads][kSplitKeys];
  Fp8Vec qh[kHeads];
  for (int h = 0; h < kHeads; ++h) qh[h].load(q8 + h * kHeadDim, kHeadDim);
  for (int kp = 0; kp < kSplitKeys; ++kp) {
    const bool valid = key_valid(kp);
    const uint8_t* kpage = rk.k_cache.data() + size_t(page_of(kp)) * page_bytes;
    uint8_t kvec[kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) kvec[d] = kpage[k_byte(kp % kPage, d)];
    Fp8Vec kk;
    kk.load(kvec, kHeadDim);
    const float qk = sm_scale * kscale(kp);
    for (int h = 0; h < kHeads; ++h) {
      float c = 0.0f;
      for (int s = 0; s < kHeadDim / kBlockK; ++s)
        c = c + block_dot_i64(qh[h].v + s * kBlockK, kk.v + s * kBlockK, qh[h].nan[s] | kk.nan[s]);
      sc[h][kp] = valid ? qk * c : kNegScore;
    }
  }
  // Head max: per wave max(sc[j=0], sc[j=1]) per lane, 16-lane butterfly; waves in order
  // (vloc (seed:L767-L790)). v_scale max over valid keys (0 for invalid), per wave then in order.
  float mx[kHeads], vmax = 0.0f;
  for (int w = 0; w < kWaves; ++w) {
    float vloc[kWaveLanes];
    for (int lane = 0; lane < kWaveLanes; ++lane) {
      const int l16 = lane % 16, k0 = w * kWaveKeys + l16, k1 = k0 + kPage;
      vloc[lane] = fmax_ieee(key_valid(k0) ? vscale(k0) : 0.0f, key_valid(k1) ? vscale(k1) : 0.0f);
    }
    const float vw = wave_max(vloc);
    vmax = w == 0 ? vw : fmax_ieee(vmax, vw);
    for (int h = 0; h < kHeads; ++h) {
      float v16[16];
      for (int l16 = 0; l16 < 16; ++l16) v16[l16] = fmax_ieee(sc[h][w * kWaveKeys + l16], sc[h][w * kWaveKeys + kPage + l16]);
      const float mh = group_reduce(v16, 16, MaxF32{});
      mx[h] = w == 0 ? mh : fmax_ieee(mx[h], mh);
    }
  }
  const float fscale = kFp8Max * rcp_approx(vmax + 1e-8f);  // fscale (seed:L791)
  const float pscale = vmax * kInvFp8Max;                    // pscale (seed:L792)
  // P, pj (seed:L796-L822): p = exp2((s - m) * log2e); P8 = E4M3((vs * fscale) * p); l per wave.
  static thread_local uint8_t p8[kHeads][kSplitKeys];
  float ls[kWaves][kHeads];
  for (int h = 0; h < kHeads; ++h) {
    for (int w = 0; w < kWaves; ++w) {
      float lane_l[16];
      for (int l16 = 0; l16 < 16; ++l16) {
        float acc = 0.0f;
        for (int j = 0; j < 2; ++j) {
          const int kp = w * kWaveKeys + j * kPage + l16;
          const float pj = exp2_approx((sc[h][kp] - mx[h]) * kLog2e);
          acc = acc + pj;
          p8[h][kp] = e4m3_bits(((key_valid(kp) ? vscale(kp) : 0.0f) * fscale) * pj, Fp8Overflow::NoSaturate);
        }
        lane_l[l16] = acc;
      }
      ls[w][h] = group_reduce(lane_l, 16, AddF32{});
    }
  }
  // PV per wave, pw (seed:L824-L852): V bytes past n_ctx masked to 0; acc from 0.
  static thread_local float opart[kWaves][kHeads][kHeadDim];
  for (int w = 0; w < kWaves; ++w) {
    uint8_t vcol[kHeadDim][kWaveKeys];
    for (int kw = 0; kw < kWaveKeys; ++kw) {
      const int kp = w * kWaveKeys + kw;
      const uint8_t* vpage = rk.v_cache.data() + size_t(page_of(kp)) * page_bytes;
      const bool valid = key_valid(kp);
      for (int d = 0; d < kHeadDim; ++d) vcol[d][kw] = valid ? vpage[v_byte(kp % kPage, d)] : uint8_t(0);
    }
    Fp8Vec vd[kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) vd[d].load(vcol[d], kWaveKeys);
    for (int h = 0; h < kHeads; ++h) {
      Fp8Vec ph;
      ph.load(&p8[h][w * kWaveKeys], kWaveKeys);
      for (int d = 0; d < kHeadDim; ++d) opart[w][h][d] = 0.0f + block_dot_i64(ph.v, vd[d].v, ph.nan[0] | vd[d].nan[0]);
    }
  }
  // Wave partials summed in wave order; o = bf16((pscale * acc) * (1 / l)) (lsum (seed:L855-L877)).
  const size_t ts = size_t(tok) * cfg.n_split + t;
  for (int h = 0; h < kHeads; ++h) {
    float lsum = ls[0][h];
    for (int w = 1; w < kWaves; ++w) lsum = lsum + ls[w][h];
    const float inv_l = 1.0f / (lsum > 0.0f ? lsum : 1.0f);
    for (int d = 0; d < kHeadDim; ++d) {
      float acc = opart[0][h][d];
      for (int w = 1; w < kWaves; ++w) acc = acc + opart[w][h][d];
      out.o[ts * stride_o + h * kHeadDim + d] = bf16_bits_rne((pscale * acc) * inv_l);
    }
    out.m[ts * kHeads + h] = canon_nan(mx[h]);
    out.l[ts * kHeads + h] = canon_nan(lsum);
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
#pragma omp parallel for schedule(dynamic)
  for (int task = 0; task < S * NS; ++task) {
    const int tok = task / NS, t = task % NS;
    const int32_t* table = idx.sparse_table.data() + size_t(tok) * TW;
    split_task(out, rk, table, table[TW - 1], out.q8.data() + size_t(tok) * OK, tok, t, cfg);
  }
}

}  // namespace k4
