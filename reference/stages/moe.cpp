// Stage 5, experts: top-4 routing (route_top4 (seed:L1176-L1209)), up/gate + swiglu
// (ug_compute (seed:L1551-L1594), wide: wug_load (seed:L1844-L1981)), mid MXFP8 (narrow:
// stage_mids (seed:L2449-L2495), wide: wug_publish (seed:L1944-L1981)), down narrow
// (moe_down (seed:L2446-L2570)) and wide (wide_down (seed:L2174-L2324)).
// Contract in moe.hpp.
#include "reference/stages/moe.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <map>

#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e8m0.hpp"
#include "reference/numerics/mma.hpp"
#include "reference/numerics/mx.hpp"
#include "reference/numerics/policy.hpp"
#include "reference/stages/fast_dot.hpp"
#include "reference/model_mutants.hpp"

namespace k4 {

void route_top4(RouteOut& out, const RouterOut& r, int tokens, const Config& cfg) {
  const int E = cfg.n_routed, slots = cfg.moe_slots();
  out.ids.assign(size_t(tokens) * slots, 0);
  out.weights.assign(size_t(tokens) * slots, 0.0f);
  for (int k = 0; k < tokens; ++k) {
    // lane L holds experts L (k0) and L + 64 (k1); an expert a small preset lacks is INT_MIN
    int32_t k0[64], k1[64];
    for (int L = 0; L < 64; ++L) {
      k0[L] = L < E ? r.key[size_t(k) * E + L] : INT32_MIN;
      k1[L] = L + 64 < E ? r.key[size_t(k) * E + L + 64] : INT32_MIN;
    }
    int pid[4];
    for (int p = 0; p < cfg.top_k; ++p) {
      int32_t m = INT32_MIN;  // the butterfly's integer max over max(k0, k1)
      for (int L = 0; L < 64; ++L) m = std::max(m, std::max(k0[L], k1[L]));
      for (int L = 0; L < 64; ++L) {
        if (k0[L] == m) k0[L] = INT32_MIN;
        if (k1[L] == m && k0[L] != m) k1[L] = INT32_MIN;
      }
      pid[p] = 127 - (m & 127);
    }
    float w[4];
    for (int p = 0; p < 4; ++p) w[p] = K4_MODEL_MUTANT_ON(1) ? model_route_key_value(r.key[size_t(k) * E + std::min(pid[p], E - 1)]) : r.sig[size_t(k) * E + std::min(pid[p], E - 1)];
    const float tot = (w[0] + w[1]) + (w[2] + w[3]);  // butterfly (1, 2) over 4 lanes
    for (int p = 0; p < 4; ++p) {
      out.ids[size_t(k) * slots + p] = pid[p];
      out.weights[size_t(k) * slots + p] = canon_nan(w[p] * (K4_MODEL_MUTANT_ON(2) ? cfg.route_scale : cfg.route_scale / fmax_ieee(tot, 1e-20f)));
    }
    out.ids[size_t(k) * slots + cfg.top_k] = cfg.shared_expert();
    out.weights[size_t(k) * slots + cfg.top_k] = K4_MODEL_MUTANT_ON(3) ? cfg.shared_weight * cfg.route_scale : cfg.shared_weight;
  }
}

namespace {

// The expert a slot's route id addresses: clamped to E_TOP (seed ug_load / down_load).
int slot_expert(const RouteOut& route, int k, int slot, const Config& cfg) {
  return std::min(route.ids[size_t(k) * cfg.moe_slots() + slot], cfg.n_experts() - 1);
}

// E4M3 row -> value * 2^9 per element; nan[b]: block b holds a NaN.
void decode_fp8_row(int32_t* out, uint8_t* nan, const uint8_t* x, int n) {
  for (int b = 0; b < n / kBlockK; ++b) nan[b] = 0;
  decode_e4m3_row_fast(out, x, n);
  for (int i = 0; i < n; ++i) nan[i / kBlockK] |= e4m3_is_nan(x[i]);
}

// One weight row of an expert, decoded: E2M1 (value x 2, no NaN code) or, where the expert is
// MXFP8 (V7, V6.1), E4M3 (value x 2^9, NaN codes flagged a block). Against the E4M3 x 2^9
// activations a block sum is an integer times 2^-10 or 2^-18 (mma_f4f8_k128 / mma_f8f8_k128).
struct WeightRow {
  std::vector<int32_t> v;
  std::vector<uint8_t> nan;
  int frac = 10;
  void load(const uint8_t* row, int n, bool fp8) {
    v.resize(size_t(n));
    nan.assign(size_t(n / kBlockK), 0);
    frac = fp8 ? 18 : 10;
    if (fp8)
      decode_fp8_row(v.data(), nan.data(), row, n);
    else
      decode_fp4_row_fast(v.data(), row, n);
  }
};

// One wave's (or unit's) scaled MFMA chain over blocks [b0, b1) from 0: c = c + scaled block.
float mfma_chain(const WeightRow& w, const uint8_t* sa, const int32_t* x, const uint8_t* xnan, const uint8_t* sb, int b0,
                 int b1) {
  float c = 0.0f;
  for (int b = b0; b < b1; ++b) {
    const bool nan = xnan[b] != 0 || w.nan[size_t(b)] != 0;
    const float blk = w.frac == 10 ? block_dot_ints<int32_t>(w.v.data() + b * kBlockK, x + b * kBlockK, nan, 10)
                                   : block_dot_ints(w.v.data() + b * kBlockK, x + b * kBlockK, nan, 18);
    c = c + scale_block(blk, sa[b], sb[b]);
  }
  return c;
}

struct Uses {  // the (token, slot) pairs routed to one expert
  std::vector<std::pair<int, int>> ts;
};

std::map<int, Uses> expert_uses(const RouteOut& route, int tokens, const Config& cfg) {
  std::map<int, Uses> uses;
  for (int k = 0; k < tokens; ++k)
    for (int s = 0; s < cfg.moe_slots(); ++s)
      if (slot_joins(route, k, s, tokens, cfg)) uses[slot_expert(route, k, s, cfg)].ts.push_back({k, s});
  return uses;
}

}  // namespace

std::vector<uint8_t> live_rows(const Config& cfg, const std::vector<int32_t>& seq_lens) {
  std::vector<uint8_t> live(seq_lens.size(), 1);
  if (cfg.variant.wide_live_rows == WideRows::exclude_pad)
    for (size_t k = 0; k < seq_lens.size(); ++k) live[k] = seq_lens[k] > 0 ? 1 : 0;  // the raw seq_len (VARIANTS.md V2)
  return live;
}

bool slot_joins(const RouteOut& route, int k, int slot, int tokens, const Config& cfg) {
  if (slot == cfg.top_k || !cfg.wide(tokens) || route.live.empty()) return true;
  return route.live[size_t(k)] != 0;
}

void experts_up_gate(MoeOut& out, const RouteOut& route, const RouterOut& r, const ExpertSource& src, int rank,
                     int tokens, const Config& cfg) {
  const int HID = cfg.hidden, I = cfg.inter, SL = cfg.moe_slots(), KB = HID / kBlockK;
  const int wave_blocks = KB / cfg.waves;  // each wave a k eighth: hidden / 1024 chunks of 4 blocks
  out.mid.assign(size_t(tokens) * SL * I, 0);
  out.gate.assign(size_t(tokens) * SL * I, 0.0f);
  out.up.assign(size_t(tokens) * SL * I, 0.0f);
  out.mid8.assign(size_t(tokens) * SL * I, 0);
  out.midsc.assign(size_t(tokens) * SL * I / kBlockK, 0);
  std::vector<int32_t> x(size_t(tokens) * HID);
  std::vector<uint8_t> xnan(size_t(tokens) * KB);
  for (int k = 0; k < tokens; ++k) decode_fp8_row(&x[size_t(k) * HID], &xnan[size_t(k) * KB], &r.xn8[size_t(k) * HID], HID);
  for (const auto& eu : expert_uses(route, tokens, cfg)) {
    const int e = eu.first;  // not a structured binding: clang 14 cannot capture one in an OpenMP region
    const auto& uses = eu.second;
    const std::shared_ptr<const ExpertWeights> ew = src.expert(rank, e);
    const bool fp8 = cfg.expert_fp8(e);
    const size_t rb = size_t(cfg.w13_row_bytes(e));
#pragma omp parallel for schedule(static)
    for (int row = 0; row < I; ++row) {
      WeightRow wg, wu;
      wg.load(&ew->w13[size_t(row) * rb], HID, fp8);
      wu.load(&ew->w13[size_t(I + row) * rb], HID, fp8);
      const uint8_t* sg = &ew->s13[size_t(row) * KB];
      const uint8_t* su = &ew->s13[size_t(I + row) * KB];
      for (const auto& [k, s] : uses.ts) {
        const int32_t* xk = &x[size_t(k) * HID];
        const uint8_t* nk = &xnan[size_t(k) * KB];
        const uint8_t* sb = &r.xsc[size_t(k) * KB];
        float g = 0.0f, u = 0.0f;  // gsum = 0.0; gsum = gsum + wave partial, waves in order
        for (int w = 0; w < cfg.waves; ++w) {
          g = g + mfma_chain(wg, sg, xk, nk, sb, w * wave_blocks, (w + 1) * wave_blocks);
          u = u + mfma_chain(wu, su, xk, nk, sb, w * wave_blocks, (w + 1) * wave_blocks);
        }
        const size_t o = (size_t(k) * SL + s) * I + row;
        out.gate[o] = canon_nan(g);
        out.up[o] = canon_nan(u);
        const int sw = K4_MODEL_MUTANT_ON(5) ? 5 : K4_MODEL_MUTANT_ON(6) ? 6 : K4_MODEL_MUTANT_ON(7) ? 7 : 0;
        out.mid[o] = bf16_bits_rne(sw ? model_swiglu_wrong(sw, g, u, cfg.swiglu_limit) : swiglu(g, u, cfg.swiglu_limit));
      }
    }
  }
  // mid -> MXFP8 per 32-block of a slot (narrow: stage_mids (seed:L2449-L2495); wide:
  // wug_publish (seed:L1944-L1981))
  for (size_t b = 0; b < out.midsc.size(); ++b) {
    float f[kBlockK];
    for (int i = 0; i < kBlockK; ++i) f[i] = bf16_to_f32(out.mid[b * kBlockK + i]);
    out.midsc[b] = mx8_quantize_block(f, &out.mid8[b * kBlockK]);
  }
}

void experts_down(MoeOut& out, const RouteOut& route, const ExpertSource& src, int rank, int tokens, const Config& cfg) {
  const int HID = cfg.hidden, I = cfg.inter, SL = cfg.moe_slots(), KC = I / 128, IB = I / kBlockK;
  const bool wide = cfg.wide(tokens);
  // dcu[k][s][r][kc]: the unit MFMA (16x16x128, from 0) of token k's slot s, row r, chunk kc
  std::vector<float> dcu(size_t(tokens) * SL * HID * KC);
  // nanscale[e][r][kc]: the unit's weight scales hold a NaN (a zero mid row gives NaN then)
  std::map<int, std::vector<uint8_t>> nanscale;
  std::vector<int32_t> mid(size_t(tokens) * SL * I);
  std::vector<uint8_t> midnan(size_t(tokens) * SL * IB);
  for (int ks = 0; ks < tokens * SL; ++ks) decode_fp8_row(&mid[size_t(ks) * I], &midnan[size_t(ks) * IB], &out.mid8[size_t(ks) * I], I);
  for (const auto& eu : expert_uses(route, tokens, cfg)) {
    const int e = eu.first;  // not a structured binding: clang 14 cannot capture one in an OpenMP region
    const auto& uses = eu.second;
    const std::shared_ptr<const ExpertWeights> ew = src.expert(rank, e);
    std::vector<uint8_t>& ns = nanscale[e];
    ns.assign(size_t(HID) * KC, 0);
    const bool fp8 = cfg.expert_fp8(e);
    const size_t rb = size_t(cfg.w2_row_bytes(e));
#pragma omp parallel for schedule(static)
    for (int row = 0; row < HID; ++row) {
      WeightRow wr;
      wr.load(&ew->w2[size_t(row) * rb], I, fp8);
      const uint8_t* sa = &ew->s2[size_t(row) * IB];
      // a NaN weight scale, or (E4M3) a NaN weight code, makes the unit on the zero mid row NaN
      for (int kc = 0; kc < KC; ++kc)
        for (int b = 0; b < 4; ++b) ns[size_t(row) * KC + kc] |= e8m0_is_nan(sa[kc * 4 + b]) | wr.nan[size_t(kc * 4 + b)];
      for (const auto& [k, s] : uses.ts) {
        const size_t ks = size_t(k) * SL + s;
        for (int kc = 0; kc < KC; ++kc)
          dcu[(ks * HID + row) * KC + kc] = mfma_chain(wr, sa, &mid[ks * I], &midnan[ks * IB], &out.midsc[ks * IB], kc * 4, kc * 4 + 4);
      }
    }
  }
  out.partial.assign(size_t(tokens) * HID, 0);
  const int top_k = cfg.top_k;
  const int dn_units = top_k * KC, dn_upw = (dn_units + 3) / 4, sh_upw = (KC + 3) / 4;
  // wide: the distinct routed experts in id order, the shared one last (seed build_experts)
  std::vector<int> uexp;
  for (const auto& [e, uses] : expert_uses(route, tokens, cfg))
    if (e != cfg.shared_expert()) uexp.push_back(e);
  const int nu = int(uexp.size());
  uexp.push_back(cfg.shared_expert());
  // the table's units: every distinct expert, the shared one last; under shared_fp8 (V6.1)
  // the routed ones only (n_units (seed:L2180)), the MXFP8 shared expert's units following them
  const bool sh8 = cfg.variant.shared_fp8;
  const int u_max = top_k * tokens + 1, n_tbl_units = (sh8 ? nu : nu + 1) * KC, dn_witers = (u_max * KC + 3) / 4;
  std::vector<const uint8_t*> nan_of_du(nu + 1);  // nanscale of distinct expert du, no map lookups
  for (int du = 0; du <= nu; ++du) nan_of_du[du] = nanscale.at(std::min(uexp[du], cfg.n_experts() - 1)).data();
  // urow (seed down_tables): token k's slot routed to distinct expert du, or -1 (the zero row)
  std::vector<int> urow(size_t(tokens) * (nu + 1), -1);
  for (int k = 0; k < tokens; ++k)
    for (int du = 0; du <= nu; ++du)
      for (int s = 0; s < SL; ++s)
        if (slot_expert(route, k, s, cfg) == uexp[du] && (s == top_k) == (du == nu) && slot_joins(route, k, s, tokens, cfg))
          urow[size_t(k) * (nu + 1) + du] = s;
#pragma omp parallel for schedule(static)
  for (int row = 0; row < HID; ++row)
    for (int k = 0; k < tokens; ++k) {
      auto unit = [&](int s, int kc) { return dcu[((size_t(k) * SL + s) * HID + row) * KC + kc]; };
      auto weight = [&](int s) { return route.weights[size_t(k) * SL + s]; };
      // distinct expert du's chunk dkc in the wide down: token k's unit times its weight, or the
      // zero mid row's (every block +0, scaled +0: NaN if a weight scale is)
      auto table_term = [&](int du, int dkc) {
        const int slot = urow[size_t(k) * (nu + 1) + du];
        if (slot >= 0) return unit(slot, dkc) * weight(slot);
        const float z = nan_of_du[du][size_t(row) * KC + dkc] ? f32_from_bits(kCanonicalNan) : 0.0f;
        return z * 0.0f;
      };
      float tot = 0.0f;
      if (!wide) {
        float acc[4], sh[4];
        for (int q = 0; q < 4; ++q) {
          acc[q] = 0.0f;
          for (int i = 0; i < dn_upw; ++i) {  // units j = q + 4 i: slot j / KC, chunk j % KC
            const int j = q + 4 * i, jj = std::min(j, dn_units - 1);
            const float wgt = j < dn_units ? weight(jj / KC) : 0.0f;
            acc[q] = acc[q] + unit(jj / KC, jj % KC) * wgt;
          }
          sh[q] = 0.0f;
          for (int i = 0; i < sh_upw; ++i) {  // the shared expert's chunks, clamped
            const int j = q + 4 * i;
            const float wgt = j < KC ? cfg.shared_weight : 0.0f;
            sh[q] = sh[q] + unit(top_k, std::min(j, KC - 1)) * wgt;
          }
        }
        if (cfg.variant.narrow_final == NarrowFinal::split) {  // V5.1: two chains, then one add
          float tr = 0.0f, ts = 0.0f;
          for (int q = 0; q < 4; ++q) tr = tr + acc[q];
          for (int q = 0; q < 4; ++q) ts = ts + sh[q];
          tot = tr + ts;
        } else {
          for (int q = 0; q < 4; ++q) tot = tot + acc[q];
          for (int q = 0; q < 4; ++q) tot = tot + sh[q];
        }
      } else if (cfg.variant.wide_down_order == WideDownOrder::per_expert) {
        // V3: quarter q takes, for u = 0..nu in order, expert E_u's chunks q then q + 4
        for (int q = 0; q < 4; ++q) {
          float acc = 0.0f;
          for (int i = 0; i < 2 * u_max; ++i) {
            const int du = i / 2, c_raw = q + 4 * (i % 2), dkc = std::min(c_raw, KC - 1);
            float term = 0.0f;
            if (c_raw < KC && du <= nu) term = table_term(du, dkc);
            acc = acc + term;
          }
          tot = tot + acc;
        }
      } else {
        for (int q = 0; q < 4; ++q) {
          float acc = 0.0f;
          for (int i = 0; i < dn_witers; ++i) {
            const int j = q + 4 * i;
            const float term = j < n_tbl_units ? table_term(std::min(j / KC, u_max - 1), j % KC) : 0.0f;
            acc = acc + term;
          }
          // V6.1, shared_fp8 (seed:L2217-L2235), shared_fp8 (seed:L2291-L2306): the MXFP8 shared expert's units
          // after the table's, chunk c in quarter c mod 4 (the flat order puts it in
          // (2 nu + c) mod 4): c_raw = q + 4 i, c = min(c_raw, KC - 1), +0 past the last chunk
          for (int i = 0; sh8 && i < sh_upw; ++i) {
            const int c_raw = q + 4 * i;
            const float u = unit(top_k, std::min(c_raw, KC - 1)) * weight(top_k);
            acc = acc + (c_raw < KC ? u : 0.0f);
          }
          tot = tot + acc;
        }
      }
      out.partial[size_t(k) * HID + row] = bf16_bits_rne(tot);
    }
}

}  // namespace k4
