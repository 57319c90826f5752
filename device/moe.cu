// moe.cu -- stage 5, experts: top-4 routing, up/gate + swiglu, mid MXFP8, down (narrow and
// wide), bf16 partial rows pushed to the peers; the twin of reference/stages/moe.cpp
// (route_top4 (seed:L1176-L1209), ug_compute (seed:L1551-L1594), wug_load (seed:L1844-L1981),
// moe_down (seed:L2446-L2570), wide_down (seed:L2174-L2324)).
//
// Contract (reference/stages/moe.hpp):
//   route_top4: 4 rounds of an integer max over the route keys (lane L: experts L, L + 64);
//     weights sig[pick] * (route_scale / max((w0 + w1) + (w2 + w3), 1e-20)); slot 4 shared.
//   up/gate (slot s, row r): wave w's 128-k chunks from 0 (c = c + scale_block(block)),
//     g = 0 + P_w0 + ... + P_w7, likewise u; mid = bf16(swiglu(g, u)); MXFP8 per 32 of a slot.
//   down, narrow (S < wide_from): quarter q's units j = q, q + 4, .. of (slot j / KC, chunk
//     j % KC), acc += unit * w_slot (0 weight past the last unit); the shared chunks alike;
//     tot = 0 + R0 + R1 + R2 + R3 + S0 + S1 + S2 + S3.
//   down, wide: units over the distinct experts in id order (shared last), chunk within,
//     acc += ok ? unit * w : 0, a token not routed to the unit's expert multiplying its zero
//     mid row (NaN if a weight scale is NaN) by weight 0; tot = 0 + A0 + A1 + A2 + A3.
//   A unit = the 16x16x128 MFMA from 0: c = 0; c = c + scale_block(block) for its 4 blocks.
//   moe.wide_down_order = per_expert (V3): quarter q takes expert E_u's chunks q, q + 4 for
//   u = 0..nu; moe.narrow_final = split (V5.1): tot = (0 + R0..R3) + (0 + S0..S3).
//   moe.wide_live_rows = exclude_pad (V2): in wide steps a pad row's routed slots are no
//   expert's use (slot_joins): not computed (+0, midsc of a zero block), zero rows in the down.
// Kernels: routing (a thread a token); up/gate (one block an (expert, 32 mid rows) and
// rank: the expert's rows read once for all its tokens, 4 tokens at a time; blocks of experts
// no token uses return at once); down (one block a 32-row task and rank, thread (row, quarter,
// token group)).
#include <algorithm>
#include <climits>
#include <type_traits>

#include "device/mutants.hpp"
#include "device/stages.hpp"
#include "reference/numerics/keys.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/e8m0.hpp"
#include "reference/numerics/mma.hpp"
#include "reference/numerics/mx.hpp"
#include "reference/numerics/policy.hpp"

namespace k4::gpu {
namespace {

constexpr int kMaxTokens = 16, kMaxSlots = 8;

// The E2M1 pair table: byte b -> (value x 2 of its low nibble, of its high nibble).
K4_BODY void fp4_pair_entry(int32_t* tab, int b) {
  tab[2 * b] = e2m1_to_int_x2(fp4_lo(uint8_t(b)));
  tab[2 * b + 1] = e2m1_to_int_x2(fp4_hi(uint8_t(b)));
}
// 16 bytes of packed E2M1 (32 elements, even low) -> values x 2, through the pair table.
K4_BODY void decode_fp4_block(int32_t* out, const Bytes16& w, const int32_t* tab) {
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = tab[2 * w.b[i]];
    out[2 * i + 1] = tab[2 * w.b[i] + 1];
  }
}
// 32 E4M3 codes (16-byte aligned) -> values x 2^9; returns whether one is NaN.
K4_BODY bool decode_fp8_block(int32_t* out, const uint8_t* codes, const int32_t* dec) {
  const Bytes16 a = load16(codes), b = load16(codes + 16);
  bool nan = false;
  for (int i = 0; i < 16; ++i) {
    out[i] = dec[a.b[i]], out[16 + i] = dec[b.b[i]];
    nan |= e4m3_is_nan(a.b[i]) || e4m3_is_nan(b.b[i]);
  }
  return nan;
}

// Expert e's weights are E4M3 (moe.experts = mxfp8, V7; the shared expert under
// moe.shared_fp8, V6.1): one byte an element, NaN codes possible; else E2M1 pairs.
K4_BODY bool expert_fp8(const DevCfg& cfg, int e) { return cfg.experts == 1 || (cfg.shared_fp8 != 0 && e == cfg.n_routed); }

// Block b of a weight row -> integers (E2M1 x 2 or E4M3 x 2^9); returns whether one is NaN.
K4_BODY bool decode_weight_block(int32_t* out, const uint8_t* row, int b, bool fp8, const int32_t* dec, const int32_t* fp4) {
  if (fp8) return decode_fp8_block(out, row + size_t(b) * kBlockK, dec);
  decode_fp4_block(out, load16(row + size_t(b) * 16), fp4);
  return false;
}

// --------------------------------------------------------------------------- routing
struct RouteBody {
  RouteArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char*) const {
    const DevCfg& cfg = a.cfg;
    const int r = c.by, S = a.tokens, E = cfg.n_routed, SL = cfg.moe_slots;
    c.each(S, [&](int k) {
      const size_t tk = size_t(r) * S + k;
      const int32_t* key = a.key + tk * E;
      int32_t k0[64], k1[64];  // lane L holds experts L and L + 64; missing experts INT_MIN
      for (int L = 0; L < 64; ++L) {
        k0[L] = L < E ? key[L] : INT32_MIN;
        k1[L] = L + 64 < E ? key[L + 64] : INT32_MIN;
      }
      int pid[4];
      for (int p = 0; p < 4; ++p) {
        int32_t m = INT32_MIN;  // the butterfly's integer max: any order
        for (int L = 0; L < 64; ++L) {
          const int32_t hi = k0[L] > k1[L] ? k0[L] : k1[L];
          m = hi > m ? hi : m;
        }
        for (int L = 0; L < 64; ++L) {
          if (k0[L] == m) k0[L] = INT32_MIN;
          if (k1[L] == m && k0[L] != m) k1[L] = INT32_MIN;
        }
        pid[p] = 127 - (m & 127);
      }
      float w[4];
      for (int p = 0; p < 4; ++p) w[p] = K4_MUTANT_ON(52) ? mut::route_key_value(a.key[tk * E + (pid[p] < E - 1 ? pid[p] : E - 1)]) : a.sig[tk * E + (pid[p] < E - 1 ? pid[p] : E - 1)];
      const float tot = K4_MUTANT_ON(55) ? ((w[0] + w[1]) + w[2]) + w[3] : (w[0] + w[1]) + (w[2] + w[3]);  // butterfly (1, 2) over 4 lanes
      for (int p = 0; p < 4; ++p) {
        a.ids[tk * SL + p] = pid[p];
        a.weights[tk * SL + p] = canon_nan(w[p] * (K4_MUTANT_ON(53) ? cfg.route_scale : cfg.route_scale / fmax_ieee(tot, K4_MUTANT_ON(56) ? 0.0f : 1e-20f)));
      }
      a.ids[tk * SL + cfg.top_k] = cfg.n_routed;  // the shared expert
      a.weights[tk * SL + cfg.top_k] = K4_MUTANT_ON(54) ? cfg.shared_weight * cfg.route_scale : cfg.shared_weight;
    });
  }
};

// --------------------------------------------------------------------------- up / gate
constexpr int kUgRows = 32;    // mid rows a block: one MXFP8 32-block of every slot
constexpr int kUgBatch = 2;    // tokens (uses) a pass: their xn8 decoded once into shared memory

// Each rank's distinct experts (any slot, clamped as the loads clamp them) in id order, the
// count last: the up/gate grid's x is an index into this list (work distribution only).
struct ExpertListBody {
  UpGateArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int r = c.by, S = a.tokens, SL = cfg.moe_slots;
    SmemCarver cv{smem};
    int32_t* ids = cv.take<int32_t>(kMaxTokens * kMaxSlots);
    uint8_t* used = cv.take<uint8_t>(cfg.n_experts);
    c.each(S * SL + cfg.n_experts, [&](int i) {
      if (i < S * SL) ids[i] = a.ids[size_t(r) * S * SL + i];
      else used[i - S * SL] = 0;
    });
    c.each(S * SL, [&](int ks) {  // an expert's byte is written by each of its uses, all with 1
      if (slot_joins(a.live, ks / SL, ks % SL, S, cfg)) used[slot_expert(ids + (ks / SL) * SL, ks % SL, cfg)] = 1;
    });
    // V2: the (token, slot) pairs no expert serves are not computed: +0, midsc that of a zero
    // block (an item a 32-block, so that a step of uses only checks S x slots x blocks)
    const int I = cfg.inter, IB = I / kBlockK;
    const size_t base = size_t(r) * S * SL;
    c.each(S * SL * IB, [&](int i) {
      const int ks = i / IB;
      if (slot_joins(a.live, ks / SL, ks % SL, S, cfg)) return;
      for (int j = 0; j < kBlockK; ++j) {
        const size_t o = base * I + size_t(i) * kBlockK + j;
        a.gate[o] = 0.0f, a.up[o] = 0.0f, a.mid[o] = 0, a.mid8[o] = 0;
      }
      const float zero[kBlockK] = {};
      uint8_t q[kBlockK];
      a.midsc[base * IB + i] = mx8_quantize_block(zero, q);
    });
    c.one([&] {
      int32_t* list = a.ulist + size_t(r) * (cfg.n_experts + 1);
      int n = 0;
      for (int e = 0; e < cfg.n_experts; ++e)
        if (used[e]) list[n++] = e;
      list[cfg.n_experts] = n;
    });
  }
};

struct UpGateBody {
  UpGateArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int rg = c.by, r = c.bz, S = a.tokens, HID = cfg.hidden, I = cfg.inter, SL = cfg.moe_slots;
    const int KB = HID / kBlockK, wave_blocks = KB / cfg.waves;
    const int32_t* list = a.ulist + size_t(r) * (cfg.n_experts + 1);
    if (c.bx >= list[cfg.n_experts]) return;  // uniform: fewer distinct experts on this rank
    const int e = list[c.bx];
    SmemCarver cv{smem};
    int32_t* uses = cv.take<int32_t>(kMaxTokens * kMaxSlots + 1);  // (token, slot) pairs, count last
    int32_t* xi = cv.take<int32_t>(size_t(kUgBatch) * HID);         // the pass's tokens' xn8, x 2^9
    uint8_t* xnan = cv.take<uint8_t>(size_t(kUgBatch) * KB);        // a NaN in the 32-block
    uint8_t* xs = cv.take<uint8_t>(size_t(kUgBatch) * KB);          // and the E8M0 scales
    float* chains = cv.take<float>(kUgBatch * kUgRows * 2 * cfg.waves);
    float* midv = cv.take<float>(kUgBatch * kUgRows);
    int32_t* dec = cv.take<int32_t>(256);
    int32_t* fp4 = cv.take<int32_t>(512);
    int32_t* ids = cv.take<int32_t>(kMaxTokens * kMaxSlots);
    c.each(256 + S * SL, [&](int i) {
      if (i < 256) dec[i] = e4m3_to_int_x512(uint8_t(i)), fp4_pair_entry(fp4, i);
      else ids[i - 256] = a.ids[size_t(r) * S * SL + i - 256];
    });
    c.one([&] {
      int n = 0;  // the (token, slot) pairs this expert serves, token-major
      for (int k = 0; k < S; ++k)
        for (int s = 0; s < SL; ++s)
          if (slot_expert(ids + size_t(k) * SL, s, cfg) == e && slot_joins(a.live, k, s, S, cfg)) uses[n++] = k * SL + s;
      uses[kMaxTokens * kMaxSlots] = n;
    });
    const int n_use = uses[kMaxTokens * kMaxSlots];
    const size_t ex = size_t(r) * cfg.n_experts + e;
    const bool fp8 = expert_fp8(cfg, e);
    const size_t row_bytes = fp8 ? size_t(HID) : size_t(HID) / 2;
    const uint8_t* w13 = a.ex.w13[ex];
    const uint8_t* s13 = a.ex.s13[ex];
    const uint8_t* xn8 = a.xn8 + size_t(r) * S * HID;
    const uint8_t* xsc = a.xsc + size_t(r) * S * KB;
    for (int u0 = 0; u0 < n_use; u0 += kUgBatch) {
      const int nb = n_use - u0 < kUgBatch ? n_use - u0 : kUgBatch;
      c.each(nb * (HID / 16) + nb * KB, [&](int i) {
        if (i < nb * (HID / 16)) {
          const int u = i / (HID / 16), j = i % (HID / 16), k = uses[u0 + u] / SL;
          const Bytes16 v = load16(xn8 + size_t(k) * HID + 16 * j);
          for (int e = 0; e < 16; ++e) xi[size_t(u) * HID + 16 * j + e] = dec[v.b[e]];
        } else {
          const int u = (i - nb * (HID / 16)) / KB, b = (i - nb * (HID / 16)) % KB, k = uses[u0 + u] / SL;
          xs[u * KB + b] = xsc[size_t(k) * KB + b];
          bool nan = false;
          for (int e = 0; e < kBlockK; ++e) nan |= e4m3_is_nan(xn8[size_t(k) * HID + b * kBlockK + e]);
          xnan[u * KB + b] = nan ? 1 : 0;
        }
      });
      // thread (row, gate/up, wave): its chain over the wave's blocks for the pass's tokens
      c.each(kUgRows * 2 * cfg.waves, [&](int i) {
        const int rr = i % kUgRows, gu = (i / kUgRows) % 2, w = i / (2 * kUgRows);
        const size_t wrow = size_t((K4_MUTANT_ON(58) ? 1 - gu : gu) * I + rg * kUgRows + rr);
        const uint8_t* wp = w13 + wrow * row_bytes;
        const uint8_t* sp = s13 + wrow * KB;
        float acc[kUgBatch];
        for (int u = 0; u < kUgBatch; ++u) acc[u] = 0.0f;
        for (int b = w * wave_blocks; b < (w + 1) * wave_blocks; ++b) {
          int32_t wi[kBlockK];
          const bool wnan = decode_weight_block(wi, wp, b, fp8, dec, fp4);
          const uint8_t sa = sp[b];
          for (int u = 0; u < kUgBatch; ++u) {
            if (u >= nb) break;
            const float blk = scale_block(block_dot_ints(wi, xi + size_t(u) * HID + b * kBlockK,
                                                         wnan || (xnan[u * KB + b] != 0 && !K4_MUTANT_ON(75)), fp8 ? 18 : 10),
                                          sa, xs[u * KB + b]);
            acc[u] = acc[u] + (K4_MUTANT_ON(59) ? mut::ftz(blk) : blk);
          }
        }
        for (int u = 0; u < nb; ++u) chains[((u * kUgRows + rr) * 2 + gu) * cfg.waves + w] = acc[u];
      });
      c.each(nb * kUgRows, [&](int i) {
        const int u = i / kUgRows, rr = i % kUgRows, ks = uses[u0 + u];
        const float* ch = chains + (u * kUgRows + rr) * 2 * cfg.waves;
        float g = 0.0f, up = 0.0f;  // gsum = 0.0; gsum = gsum + wave partial, waves in order
        for (int w = 0; w < cfg.waves; ++w) g = g + ch[K4_MUTANT_ON(57) ? cfg.waves - 1 - w : w];
        for (int w = 0; w < cfg.waves; ++w) up = up + ch[cfg.waves + w];
        const size_t o = (size_t(r) * S * SL + ks) * I + rg * kUgRows + rr;
        a.gate[o] = canon_nan(g);
        a.up[o] = canon_nan(up);
        const int sw = K4_MUTANT_ON(60) ? 0 : K4_MUTANT_ON(61) ? 1 : K4_MUTANT_ON(62) ? 2 : K4_MUTANT_ON(63) ? 3 : -1;
        const float y = sw >= 0 ? mut::swiglu_wrong(sw, g, up, cfg.swiglu_limit) : swiglu(g, up, cfg.swiglu_limit);
        const uint16_t m = K4_MUTANT_ON(64) ? mut::bf16_bits_trunc(y) : bf16_bits_rne(y);
        a.mid[o] = m;
        midv[i] = bf16_to_f32(m);
      });
      c.each(nb, [&](int u) {  // mid -> MXFP8, the slot's 32-block rg
        const int ks = uses[u0 + u];
        uint8_t q[kBlockK];
        const uint8_t sc = mut::mx8_block(K4_MUTANT_ON(65), K4_MUTANT_ON(66), midv + u * kUgRows, q);
        const size_t o = (size_t(r) * S * SL + ks) * I + rg * kUgRows;
        for (int j = 0; j < kBlockK; ++j) a.mid8[o + j] = q[j];
        a.midsc[(size_t(r) * S * SL + ks) * (I / kBlockK) + rg] = sc;
      });
    }
  }
};

// ------------------------------------------------------------------------------ down
constexpr int kDnRows = 32, kQuarters = 4, kTokenGroups = 4;

// One unit: row wrow of an expert's w2 (scales srow; E4M3 where fp8), 128-k chunk kc, against
// a mid row (mid8 / midsc); mid8 == nullptr: the zero mid row (scales 0), whose blocks are
// exactly +0 (NaN against an E4M3 NaN weight code).
// The zero mid row's unit (chunk kc; sc4: the chunk's 4 weight scales, block 4 kc + j in byte j):
// +0 a block, NaN where an E4M3 weight code is NaN, scaled as any block (a NaN scale: NaN).
K4_BODY float zero_row_unit(const uint8_t* wrow, const uint8_t* sc4, int kc, bool fp8, const int32_t* dec,
                            const int32_t* fp4) {
  if (!fp8) {  // E2M1 has no NaN code: each block is scale_block(+0, s, 0), +0 unless s is NaN
    bool nan = false;
    for (int j = 0; j < 4; ++j) nan |= e8m0_is_nan(sc4[j]);
    return nan ? f32_from_bits(kCanonicalNan) : 0.0f;
  }
  float c = 0.0f;
  for (int b0 = kc * 4, b; b0 < kc * 4 + 4 && (b = K4_MUTANT_ON(74) ? 8 * kc + 3 - b0 : b0, true); ++b0) {
    int32_t wi[kBlockK];
    const bool wnan = decode_weight_block(wi, wrow, b, fp8, dec, fp4);
    c = c + scale_block(wnan ? f32_from_bits(kCanonicalNan) : 0.0f, sc4[b - kc * 4], 0);  // block_dot of a zero row
  }
  return c;
}

K4_BODY float down_unit(const uint8_t* wrow, const uint8_t* srow, int kc, bool fp8, const uint8_t* mid8,
                        const uint8_t* midsc, const int32_t* dec, const int32_t* fp4) {
  if (mid8 == nullptr) return zero_row_unit(wrow, srow + kc * 4, kc, fp8, dec, fp4);
  float c = 0.0f;
  for (int b0 = kc * 4, b; b0 < kc * 4 + 4 && (b = K4_MUTANT_ON(74) ? 8 * kc + 3 - b0 : b0, true); ++b0) {
    int32_t wi[kBlockK], mi[kBlockK];
    const bool wnan = decode_weight_block(wi, wrow, b, fp8, dec, fp4);
    const bool mnan = decode_fp8_block(mi, mid8 + size_t(b) * kBlockK, dec);
    c = c + scale_block(block_dot_ints(wi, mi, wnan || (mnan && !K4_MUTANT_ON(76)), fp8 ? 18 : 10), srow[b], midsc[b]);
  }
  return c;
}

// An expert's zero-row flags (ExpertTable::z2, computed once when it is uploaded): the wide
// step's chains add the zero mid row's unit for every (token, distinct expert) the token does
// not use, which is +0 unless the unit is NaN; this is that test, the unit times 0 as the
// chains would form it, for every (row, chunk) of the expert's w2. Bytes: (hidden) "one of the
// row's chunks is NaN", then (hidden, chunk) each chunk's.
K4_BODY size_t zero_chunk_flag(int hidden, int row, int KC, int kc) { return size_t(hidden) + size_t(row) * KC + kc; }

constexpr int kZeroFlagRows = 256;  // rows a CTA

struct ZeroRowFlagsBody {
  ZeroRowFlagsArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int HID = cfg.hidden, I = cfg.inter, KC = I / 128, IB = I / kBlockK;
    const bool fp8 = expert_fp8(cfg, a.expert);
    SmemCarver cv{smem};
    int32_t* dec = cv.take<int32_t>(256);
    int32_t* fp4 = cv.take<int32_t>(512);
    c.each(256, [&](int i) {
      dec[i] = e4m3_to_int_x512(uint8_t(i));
      fp4_pair_entry(fp4, i);
    });
    c.each(kZeroFlagRows, [&](int i) {
      const int row = c.bx * kZeroFlagRows + i;
      if (row >= HID) return;
      const uint8_t* wrow = a.w2 + size_t(row) * size_t(fp8 ? I : I / 2);
      bool any = false;
      for (int kc = 0; kc < KC; ++kc) {
        const bool nan = is_nan(zero_row_unit(wrow, a.s2 + size_t(row) * IB + 4 * kc, kc, fp8, dec, fp4) * 0.0f);
        a.flags[zero_chunk_flag(HID, row, KC, kc)] = nan ? 1 : 0;
        any |= nan;
      }
      a.flags[row] = any ? 1 : 0;
    });
  }
};

struct DownBody {
  DownArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int task = c.bx, r = c.by, S = a.tokens, HID = cfg.hidden, I = cfg.inter, SL = cfg.moe_slots;
    const int KC = I / 128, IB = I / kBlockK, top_k = cfg.top_k, shared = cfg.n_routed;
    const bool wide = S >= cfg.wide_from + (K4_MUTANT_ON(71) ? 1 : K4_MUTANT_ON(72) ? -1 : 0);
    const int u_max = top_k * S + 1;
    SmemCarver cv{smem};
    float* part = cv.take<float>(size_t(S) * kDnRows * kQuarters * 2);  // (S, 32, 4) routed, then shared
    int32_t* uexp = cv.take<int32_t>(kMaxTokens * 4 + 2);               // wide: distinct experts, count last
    int32_t* slot_for = cv.take<int32_t>(size_t(kMaxTokens) * (kMaxTokens * 4 + 1));  // (S, u) -> slot or -1
    int32_t* dec = cv.take<int32_t>(256);
    int32_t* fp4 = cv.take<int32_t>(512);
    uint8_t* used_e = cv.take<uint8_t>(cfg.n_experts);
    int32_t* ids = cv.take<int32_t>(kMaxTokens * kMaxSlots);
    float* wts = cv.take<float>(kMaxTokens * kMaxSlots);
    uint8_t* rnan = cv.take<uint8_t>(kDnRows);                         // wide: row: a zero-row unit is NaN
    int32_t* real = cv.take<int32_t>(size_t(kMaxTokens) * (kMaxSlots + 1));  // wide: token's distinct experts it uses, ascending, count last
    float* uv = cv.take<float>(size_t(S) * SL * kDnRows * KC);  // fast path: (k, slot, row, chunk) the task's units
    const uint8_t* mid8 = a.mid8 + size_t(r) * S * SL * I;
    const uint8_t* midsc = a.midsc + size_t(r) * S * SL * IB;
    c.each(256 + S * SL, [&](int i) {
      if (i < 256) {
        dec[i] = e4m3_to_int_x512(uint8_t(i));
        fp4_pair_entry(fp4, i);
      } else {
        ids[i - 256] = a.ids[size_t(r) * S * SL + i - 256];
        wts[i - 256] = a.weights[size_t(r) * S * SL + i - 256];
      }
    });
    auto w2_row = [&](int e, int row) {
      return a.ex.w2[size_t(r) * cfg.n_experts + e] + size_t(row) * size_t(expert_fp8(cfg, e) ? I : I / 2);
    };
    auto s2_row = [&](int e, int row) { return a.ex.s2[size_t(r) * cfg.n_experts + e] + size_t(row) * IB; };
    auto zero_flags = [&](int e) {  // (ZeroRowFlagsBody's layout)
      return a.ex.z2[size_t(r) * cfg.n_experts + (e < cfg.n_experts - 1 ? e : cfg.n_experts - 1)];
    };
    // the fast path's units of the task's rows for every use, copied into shared memory in their
    // global layout (read where the chains need them, each chain's load would wait for its add):
    // a use's 32 rows x KC chunks are 8 KC 16-byte pieces; item i copies pieces i + j n_items,
    // so that a warp's loads are 32 consecutive pieces and a thread's 8 loads are in flight together
    if (a.units != nullptr) {
      const int per_use = 8 * KC, n_pieces = S * SL * per_use, n_items = (n_pieces + 7) / 8;
      c.each(n_items, [&](int i) {
        Bytes16 v[8];
        bool got[8];
K4_UNROLL
        for (int j = 0; j < 8; ++j) {
          const int piece = i + j * n_items, ks = piece / per_use;
          got[j] = piece < n_pieces && slot_joins(a.live, ks / SL, ks % SL, S, cfg);  // no use: no units
          if (got[j])
            v[j] = load16(reinterpret_cast<const uint8_t*>(a.units + ((size_t(r) * S * SL + ks) * HID + size_t(task) * kDnRows) * KC) +
                          16 * size_t(piece % per_use));
        }
K4_UNROLL
        for (int j = 0; j < 8; ++j) {
          if (got[j]) store16(reinterpret_cast<uint8_t*>(uv) + 16 * size_t(i + j * n_items), v[j]);
        }
      });
    }
    if (wide) {
      // the distinct routed experts in id order, the shared one last (seed build_experts); an
      // expert's byte is written by each of its uses, all with 1
      c.each(cfg.n_experts + kDnRows, [&](int i) {
        if (i < cfg.n_experts) used_e[i] = 0;
        else rnan[i - cfg.n_experts] = 0;
      });
      c.each(S * SL, [&](int ks) {
        const int e = slot_expert(ids + (ks / SL) * SL, ks % SL, cfg);
        if (e != shared && slot_joins(a.live, ks / SL, ks % SL, S, cfg)) used_e[e] = 1;
      });
      c.one([&] {
        int nu = 0;
        for (int e0 = 0, e; e0 < cfg.n_experts && (e = K4_MUTANT_ON(73) ? cfg.n_experts - 1 - e0 : e0, true); ++e0)
          if (used_e[e]) uexp[nu++] = e;
        uexp[nu] = shared;
        uexp[kMaxTokens * 4 + 1] = nu;
      });
      const int nu = uexp[kMaxTokens * 4 + 1];
      // token k's slot routed to distinct expert u (seed slot_of / down_tables), or -1: the
      // zero mid row, whose unit is +0 unless a weight scale (or E4M3 code) is NaN -- the same
      // for every such token: the expert's zero-row flags, computed when it was uploaded
      // (ZeroRowFlagsBody); a row's byte is written by each of its flags that is set, all with 1
      c.each(S * (nu + 1) + (nu + 1) * kDnRows, [&](int i) {
        if (i < S * (nu + 1)) {
          const int k = i / (nu + 1), u = i % (nu + 1), e = uexp[u];
          int slot = -1;
          for (int s = 0; s < SL; ++s)
            if (slot_expert(ids + size_t(k) * SL, s, cfg) == e && (s == top_k) == (e == shared) && slot_joins(a.live, k, s, S, cfg))
              slot = s;
          slot_for[k * u_max + u] = slot;
          return;
        }
        const int j = i - S * (nu + 1), u = j / kDnRows, rr = j % kDnRows;
        if (zero_flags(uexp[u])[task * kDnRows + rr] != 0) rnan[rr] = 1;
      });
      // token k's distinct experts (u with a slot), ascending: the only units of its chains
      // that are not the zero row's
      c.each(S, [&](int k) {
        int n = 0;
        for (int u = 0; u <= nu; ++u)
          if (slot_for[k * u_max + u] >= 0) real[k * (kMaxSlots + 1) + n++] = u;
        real[k * (kMaxSlots + 1) + kMaxSlots] = n;
      });
    }
    // the chains, in two copies: the fast path's read their units from uv, the other's compute
    // them (in one copy the fast path formed the other's operand addresses for every term)
    auto chain_phase = [&](auto from_units) {
      constexpr bool kFromUnits = decltype(from_units)::value;
      c.each(kDnRows * kQuarters * kTokenGroups, [&](int i) {
        const int rr = i % kDnRows, q = (i / kDnRows) % kQuarters, kg = i / (kDnRows * kQuarters);
        const int row = task * kDnRows + rr;
        // wide: this row's zero-row units are all +0 (no NaN weight scale or code), so a chain
        // need not visit them (the other tokens' units: all but 5 of up to 65 experts at S = 16)
        const bool zero_terms_plus0 = wide && (rnan[rr] == 0 || K4_MUTANT_ON(67));
        for (int k = kg; k < S; k += kTokenGroups) {
          const int32_t* idk = ids + size_t(k) * SL;
          auto unit = [&](int s, int kc) {
            if constexpr (kFromUnits) {  // the fast path's tensor-core units (moe_fast.cu), gathered above
              return uv[((size_t(k) * SL + s) * kDnRows + rr) * KC + kc];
            } else {
              const int e = slot_expert(idk, s, cfg);
              return down_unit(w2_row(e, row), s2_row(e, row), kc, expert_fp8(cfg, e), mid8 + (size_t(k) * SL + s) * I,
                               midsc + (size_t(k) * SL + s) * IB, dec, fp4);
            }
          };
          // wide: token k's unit of its slot, chunk kc, times its weight
          auto term_of = [&](int slot, int kc) { return unit(slot, kc) * wts[k * SL + slot]; };
          float* pk = part + (size_t(k) * kDnRows + rr) * kQuarters * 2;
          if (!wide) {
            const int dn_units = top_k * KC, dn_upw = (dn_units + 3) / 4, sh_upw = (KC + 3) / 4;
            float acc = 0.0f;
            for (int it = 0; it < dn_upw; ++it) {  // units j = q + 4 it: slot j / KC, chunk j % KC
              const int j = q + 4 * it, jj = j < dn_units - 1 ? j : dn_units - 1;
              const float wgt = j < dn_units ? wts[k * SL + jj / KC] : 0.0f;
              acc = acc + unit(jj / KC, jj % KC) * wgt;
            }
            float sh = K4_MUTANT_ON(70) ? acc : 0.0f;
            for (int it = 0; it < sh_upw; ++it) {  // the shared expert's chunks, clamped
              const int j = q + 4 * it;
              const float wgt = j < KC ? cfg.shared_weight : 0.0f;
              if (!(K4_MUTANT_ON(68) && j >= KC)) sh = sh + unit(top_k, j < KC - 1 ? j : KC - 1) * wgt;
            }
            pk[q] = K4_MUTANT_ON(70) ? sh : acc;
            pk[kQuarters + q] = K4_MUTANT_ON(70) ? 0.0f : sh;
          } else if (cfg.wide_down_order != 0 && zero_terms_plus0) {
            // V3 as below, visiting only token k's own units: every other term is +0 here, and a
            // run of +0 terms is one add of +0 (x + +0 = x but -0 + +0 = +0; +0 + +0 = +0)
            const int* rl = real + k * (kMaxSlots + 1);
            float acc = 0.0f;
            int next = 0;  // the next iteration the loop below would visit
            for (int n = 0; n < rl[kMaxSlots]; ++n) {
              const int du = rl[n], slot = slot_for[k * u_max + du];
              for (int h = 0; h < 2; ++h) {
                const int c_raw = q + 4 * h, it = 2 * du + h;
                if (c_raw >= KC) continue;
                if (it > next) acc = acc + 0.0f;
                acc = acc + term_of(slot, c_raw);
                next = it + 1;
              }
            }
            if (2 * u_max - 1 >= next) acc = acc + 0.0f;
            pk[q] = acc;
          } else if (cfg.wide_down_order != 0) {  // V3: expert E_u's chunks q then q + 4, u = 0..nu
            const int nu = uexp[kMaxTokens * 4 + 1];
            float acc = 0.0f;
            for (int it = 0; it < 2 * u_max; ++it) {
              const int du = it / 2, c_raw = q + 4 * (it % 2), dkc = c_raw < KC - 1 ? c_raw : KC - 1;
              float term = 0.0f;
              if (c_raw < KC && du <= nu) {
                const int slot = slot_for[k * u_max + du];
                if (slot >= 0) term = unit(slot, dkc) * wts[k * SL + slot];
                else term = zero_flags(uexp[du])[zero_chunk_flag(HID, row, KC, dkc)] ? f32_from_bits(kCanonicalNan) : 0.0f;  // zero row x 0
              }
              acc = acc + term;
            }
            pk[q] = acc;
          } else {
            // the table's units; under shared_fp8 (V6.1) the routed experts' only
            const int nu = uexp[kMaxTokens * 4 + 1], n_units = (cfg.shared_fp8 ? nu : nu + 1) * KC;
            const int dn_witers = (u_max * KC + 3) / 4;
            float acc = 0.0f;
            if (zero_terms_plus0) {  // as the loop below, visiting only token k's own units (V3's note)
              const int* rl = real + k * (kMaxSlots + 1);
              int next = q;  // the next j the loop below would visit
              for (int n = 0; n < rl[kMaxSlots]; ++n) {
                const int du = rl[n], slot = slot_for[k * u_max + du];
                if (du * KC >= n_units) break;
                for (int dkc = (q - du * KC % 4 + 4) % 4; dkc < KC; dkc += 4) {
                  const int j = du * KC + dkc;
                  if (j > next) acc = acc + 0.0f;
                  acc = acc + term_of(slot, dkc);
                  next = j + 4;
                }
              }
              if (q + 4 * (dn_witers - 1) >= next) acc = acc + 0.0f;
            }
            for (int it = 0; !zero_terms_plus0 && it < dn_witers; ++it) {
              const int j = q + 4 * it;
              float term = 0.0f;
              if (j < n_units) {
                const int du = j / KC < u_max - 1 ? j / KC : u_max - 1, dkc = j % KC;
                const int slot = slot_for[k * u_max + du];
                if (slot >= 0) term = unit(slot, dkc) * wts[k * SL + slot];
                else term = zero_flags(uexp[du])[zero_chunk_flag(HID, row, KC, dkc)] && !K4_MUTANT_ON(67) ? f32_from_bits(kCanonicalNan) : 0.0f;  // zero row x 0
              }
              acc = acc + term;
            }
            // V6.1: the MXFP8 shared expert's chunks after the table's, chunk c in quarter c mod 4
            for (int it = 0; cfg.shared_fp8 && it < (KC + 3) / 4; ++it) {
              const int c_raw = q + 4 * it;
              const float u = unit(top_k, c_raw < KC - 1 ? c_raw : KC - 1) * wts[k * SL + top_k];
              acc = acc + (c_raw < KC ? u : 0.0f);
            }
            pk[q] = acc;
          }
        }
      });
    };
    if (a.units != nullptr) chain_phase(std::true_type{});
    else chain_phase(std::false_type{});
    c.each(S * kDnRows, [&](int i) {
      const int rr = i % kDnRows, k = i / kDnRows, row = task * kDnRows + rr;
      const float* pk = part + (size_t(k) * kDnRows + rr) * kQuarters * 2;
      float tot = 0.0f;
      if (!wide && cfg.narrow_final != 0) {  // V5.1: the routed and the shared chains, then one add
        float tr = 0.0f, ts = 0.0f;
        for (int q = 0; q < kQuarters; ++q) tr = tr + pk[q];
        for (int q = 0; q < kQuarters; ++q) ts = ts + pk[kQuarters + q];
        tot = tr + ts;
      } else {
        for (int q = 0; q < kQuarters; ++q) tot = K4_MUTANT_ON(69) && !wide ? (tot + pk[q]) + pk[kQuarters + q] : tot + pk[q];
        if (!wide && !K4_MUTANT_ON(69))
          for (int q = 0; q < kQuarters; ++q) tot = tot + pk[kQuarters + q];
      }
      uint16_t p = bf16_bits_rne(tot);
      if (kPlantStage == 5 && r == 0 && k == 0 && row == 0) p ^= 1;
      a.partial[(size_t(r) * S + k) * HID + row] = p;
      push_partial(a.recv, p, r, k, row, S, HID, a.ranks, kDnRows, a.ag_rs);
    });
  }
};

}  // namespace

void launch_route_top4(const RouteArgs& a, hipStream_t s) {
  if (a.cfg.top_k != 4 || a.cfg.n_routed > 128) throw std::invalid_argument("route_top4: needs top_k 4, <= 128 experts");
  launch(RouteBody{a}, Grid{1, a.ranks, 1}, 32, 0, s);
}

void launch_expert_list(const UpGateArgs& a, hipStream_t s) {
  const size_t list_smem = SmemSize().add<int32_t>(kMaxTokens * kMaxSlots).add<uint8_t>(a.cfg.n_experts).used;
  launch(ExpertListBody{a}, Grid{1, a.ranks, 1}, 256, list_smem, s);
}

void launch_experts_up_gate(const UpGateArgs& a, hipStream_t s) {
  const DevCfg& cfg = a.cfg;
  if (cfg.inter % kUgRows != 0 || (cfg.hidden / kBlockK) % cfg.waves != 0 || a.tokens > kMaxTokens ||
      cfg.moe_slots > kMaxSlots || 2 * kUgRows * cfg.waves != 512)
    throw std::invalid_argument("up/gate kernel: needs inter % 32 == 0, hidden / 32 % waves == 0, S <= 16");
  const size_t KB = size_t(cfg.hidden) / kBlockK;
  const size_t list_smem = SmemSize().add<int32_t>(kMaxTokens * kMaxSlots).add<uint8_t>(cfg.n_experts).used;
  launch(ExpertListBody{a}, Grid{1, a.ranks, 1}, 256, list_smem, s);
  const size_t smem = SmemSize()
                          .add<int32_t>(kMaxTokens * kMaxSlots + 1)
                          .add<int32_t>(kUgBatch * size_t(cfg.hidden))
                          .add<uint8_t>(kUgBatch * KB)
                          .add<uint8_t>(kUgBatch * KB)
                          .add<float>(size_t(kUgBatch) * kUgRows * 2 * cfg.waves)
                          .add<float>(kUgBatch * kUgRows)
                          .add<int32_t>(256)
                          .add<int32_t>(512)
                          .add<int32_t>(kMaxTokens * kMaxSlots)
                          .used;
  // at most top_k * S + 1 distinct experts a rank: blocks past a rank's count return at once
  const int max_experts = std::min(cfg.n_experts, cfg.top_k * a.tokens + 1);
  launch(UpGateBody{a}, Grid{max_experts, cfg.inter / kUgRows, a.ranks}, 2 * kUgRows * cfg.waves, smem, s);
}

size_t zero_row_flags_bytes(const DevCfg& cfg) { return size_t(cfg.hidden) * (1 + cfg.inter / 128); }

void launch_zero_row_flags(const ZeroRowFlagsArgs& a, hipStream_t s) {
  if (a.cfg.inter % 128 != 0) throw std::invalid_argument("zero-row flags: needs inter % 128 == 0");
  const size_t smem = SmemSize().add<int32_t>(256).add<int32_t>(512).used;
  launch(ZeroRowFlagsBody{a}, Grid{(a.cfg.hidden + kZeroFlagRows - 1) / kZeroFlagRows, 1, 1}, 256, smem, s);
}

void launch_experts_down(const DownArgs& a, hipStream_t s) {
  const DevCfg& cfg = a.cfg;
  if (cfg.dn_rows != kDnRows || cfg.hidden % kDnRows != 0 || cfg.inter % 128 != 0 || a.tokens > kMaxTokens)
    throw std::invalid_argument("down kernel: needs 32-row tasks, inter % 128 == 0, S <= 16");
  if (reinterpret_cast<uintptr_t>(a.units) % 16 != 0) throw std::invalid_argument("down kernel: the units must be 16-byte aligned (16-byte loads)");
  const size_t smem = SmemSize()
                          .add<float>(size_t(a.tokens) * kDnRows * kQuarters * 2)
                          .add<int32_t>(kMaxTokens * 4 + 2)
                          .add<int32_t>(size_t(kMaxTokens) * (kMaxTokens * 4 + 1))
                          .add<int32_t>(256)
                          .add<int32_t>(512)
                          .add<uint8_t>(cfg.n_experts)
                          .add<int32_t>(kMaxTokens * kMaxSlots)
                          .add<float>(kMaxTokens * kMaxSlots)
                          .add<uint8_t>(kDnRows)
                          .add<int32_t>(size_t(kMaxTokens) * (kMaxSlots + 1))
                          .add<float>(size_t(a.tokens) * cfg.moe_slots * (cfg.inter / 128) * kDnRows)
                          .used;
  // The body means the same at any thread count; fewer threads a CTA let more CTAs share a SM
  // (128 registers a thread), so that one CTA's phases run while another waits at a barrier.
  // Measured on the H200 (docs/performance.md): narrow steps 128, wide steps 256 (their shared
  // memory allows 2 CTAs a SM).
  const int threads = a.tokens >= cfg.wide_from ? 256 : 128;
  launch(DownBody{a}, Grid{cfg.hidden / kDnRows, a.ranks, 1}, threads, smem, s);
}

}  // namespace k4::gpu
