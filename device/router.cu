// router.cu -- stage 4, router: residual add, Gemma RMSNorm, MXFP8 xn, gate logits, sigmoid,
// route keys; the twin of reference/stages/router.cpp (stage_router (seed:L1309-L1482)).
//
// Contract (reference/stages/router.hpp), per token:
//   v = f32(a) + f32(h_in); thread t = 64 w + L of the seed: ssw = fma(v, v, ssw) over its
//   HIDDEN / 512 consecutive elements from 0; ss = wave_sum of each wave's 64, waves in
//   order; rstd = rsq(ss / f32(HIDDEN) + eps); xn = bf16((v * rstd) * (f32(g) + 1));
//   MXFP8 per 32-block (mx8_quantize_block).
//   logit(e): lane L's 4 chains acc_j = fdot2(gate pair, xn pair, acc_j) over i (elements
//   (i * 64 + L) * 8 + 2 j, + 1), lane value (acc0 + acc1) + (acc2 + acc3), wave_sum;
//   sig = rcp(1 + exp2(-bf16(logit) * log2e)); key = route_key(sig + bias, e).
//   Variants (docs/numerics.md §13): router.gate = f32 reads the F32 gate, the pair step
//   fma(g1, x1, fma(g0, x0, acc)) (V1a); router.round_logit = false: no bf16 rounding.
// Kernels: the norm (one block a token and rank, 512 threads: the seed's thread -> element
// map) and the logits (one block a token, 8 experts and rank: wave w's 64 lanes expert
// 8 t + w, the lane values meeting in shared memory for the 64-lane tree).
#include "device/mutants.hpp"
#include "device/stages.hpp"
#include "reference/numerics/keys.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/butterfly.hpp"
#include "reference/numerics/mx.hpp"
#include "reference/numerics/policy.hpp"

namespace k4::gpu {
namespace {

constexpr int kBlockK = 32;  // an MXFP8 block
constexpr int kVec = 8;      // bf16 elements a 16-byte load

// 8 bf16 (16-byte aligned) as floats, one load on the GPU.
K4_BODY void load8_bf16(float* out, const uint16_t* p) {
  const Bytes16 b = load16(reinterpret_cast<const uint8_t*>(p));
  for (int j = 0; j < kVec; ++j) {
    uint16_t x;
    __builtin_memcpy(&x, b.b + 2 * j, 2);
    out[j] = bf16_to_f32(x);
  }
}

struct NormBody {
  RouterArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int k = c.bx, r = c.by, S = a.tokens, HID = cfg.hidden, T = cfg.threads, re = HID / T;
    SmemCarver cv{smem};
    float* v = cv.take<float>(HID);
    float* gv = cv.take<float>(HID);  // f32(g) (loaded with v: one round of global loads, not two)
    float* lanes = cv.take<float>(T);
    float* red = cv.take<float>(cfg.waves + 1);
    const size_t tk = size_t(r) * S + k;
    const uint16_t* g = a.g_post + size_t(r) * HID;
    c.each(HID / kVec, [&](int i) {  // 16-byte loads: an item's three in flight at once
      float x[kVec], y[kVec];
      load8_bf16(x, a.a + tk * HID + kVec * i);
      load8_bf16(y, a.h_in + size_t(k) * HID + kVec * i);
      load8_bf16(gv + kVec * i, g + kVec * i);
      for (int j = 0; j < kVec; ++j) v[kVec * i + j] = x[j] + y[j];
    });
    c.each(T, [&](int t) {
      float ssw = 0.0f;
      for (int e = 0; e < re; ++e) ssw = K4_MUTANT_ON(41) ? ssw + v[t * re + e] * v[t * re + e] : fma_f32(v[t * re + e], v[t * re + e], ssw);  // the seed's fmath.fma
      lanes[t] = ssw;
    });
    c.each(cfg.waves, [&](int w) { red[w] = wave_sum(lanes + w * kWaveLanes); });
    c.one([&] {
      float ss = red[0];  // ss = red[0]; ss = ss + red[w]
      for (int w = 1; w < cfg.waves; ++w) ss = ss + red[K4_MUTANT_ON(42) ? cfg.waves - w : w];
      const float rstd = rsq_approx(K4_MUTANT_ON(43) ? (ss + cfg.eps) / float(HID) : ss / float(HID) + cfg.eps);
      red[cfg.waves] = rstd;
      a.rstd[tk] = canon_nan(rstd);
    });
    const float rstd = red[cfg.waves];
    c.each(HID / kVec, [&](int i0) {  // each item reads and writes its own 8 elements only
      Bytes16 xs;
      for (int j = 0; j < kVec; ++j) {
        const int i = kVec * i0 + j;
        const uint16_t x = bf16_bits_rne((v[i] * rstd) * (K4_MUTANT_ON(40) ? gv[i] : gv[i] + 1.0f));
        __builtin_memcpy(xs.b + 2 * j, &x, 2);
        v[i] = bf16_to_f32(x);
      }
      store16(reinterpret_cast<uint8_t*>(a.xn + tk * HID + kVec * i0), xs);
    });
    c.each(HID / kBlockK, [&](int b) {  // MXFP8 xn (XN_SLICE (seed:L1419-L1442))
      uint8_t q[kBlockK];
      const uint8_t e = mut::mx8_block(K4_MUTANT_ON(47), K4_MUTANT_ON(48), v + b * kBlockK, q);
      if (kPlantStage == 4 && r == 0 && k == 0 && b == 0) q[0] ^= 1;
      Bytes16 lo, hi;
      __builtin_memcpy(lo.b, q, 16);
      __builtin_memcpy(hi.b, q + 16, 16);
      store16(a.xn8 + tk * HID + b * kBlockK, lo);
      store16(a.xn8 + tk * HID + b * kBlockK + 16, hi);
      a.xsc[tk * (HID / kBlockK) + b] = e;
    });
  }
};

struct LogitBody {
  RouterArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int per_task = cfg.waves, tasks = cfg.n_routed / per_task;
    const int k = c.bx / tasks, task = c.bx % tasks, r = c.by, S = a.tokens, HID = cfg.hidden, E = cfg.n_routed;
    SmemCarver cv{smem};
    float* lanes = cv.take<float>(cfg.threads);
    const size_t tk = size_t(r) * S + k;
    const uint8_t* xn = reinterpret_cast<const uint8_t*>(a.xn + tk * HID);
    c.each(cfg.threads, [&](int t) {
      const int w = t / kWaveLanes, lane = t % kWaveLanes, e = task * per_task + w;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (cfg.router_gate != 0) {  // V1a: the F32 gate, two IEEE fmas a pair, the even element first
        const float* g32 = a.w_gate_f32 + (size_t(r) * E + e) * HID;
        const uint16_t* x16 = a.xn + tk * HID;
        for (int i = 0; i < HID / 512; ++i)
          for (int j = 0; j < 4; ++j) {
            const int el = (i * 64 + lane) * 8 + 2 * j;
            acc[j] = fma_f32(g32[el + 1], bf16_to_f32(x16[el + 1]), fma_f32(g32[el], bf16_to_f32(x16[el]), acc[j]));
          }
        lanes[t] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        return;
      }
      const uint8_t* gate = reinterpret_cast<const uint8_t*>(a.w_gate + (size_t(r) * E + e) * HID);
      constexpr int kBatch = 4;  // iterations whose loads are issued before the first's arithmetic
      for (int i0 = 0; i0 < HID / 512; i0 += kBatch) {
        Bytes16 gw[kBatch], xv[kBatch];
K4_UNROLL
        for (int b = 0; b < kBatch; ++b) {
          const int el = ((i0 + b) * 64 + lane) * 8;  // 8 bf16 = 16 bytes of each operand
          if (i0 + b < HID / 512) gw[b] = load16(gate + size_t(el) * 2), xv[b] = load16(xn + size_t(el) * 2);
        }
K4_UNROLL
        for (int b = 0; b < kBatch; ++b)
          for (int j = 0; j < 4 && i0 + b < HID / 512; ++j) {
            uint32_t gp, xp;
            __builtin_memcpy(&gp, gw[b].b + 4 * j, 4);
            __builtin_memcpy(&xp, xv[b].b + 4 * j, 4);
            acc[j] = K4_MUTANT_ON(45) ? mut::fdot2_hi_first(gp, xp, acc[j]) : fdot2_bf16(gp, xp, acc[j]);
          }
      }
      lanes[t] = K4_MUTANT_ON(46) ? ((acc[0] + acc[1]) + acc[2]) + acc[3] : (acc[0] + acc[1]) + (acc[2] + acc[3]);
    });
    c.each(per_task, [&](int w) {
      const int e = task * per_task + w;
      const float logit = wave_sum(lanes + w * kWaveLanes);
      const float x = K4_MUTANT_ON(44) ? logit : cfg.round_logit ? bf16_round(logit) : logit;  // bf16_round (seed:L1465); V1b: unrounded
      const float sc = sigmoid_approx(x);  // hw_rcp (seed:L1465)
      a.logit[tk * E + e] = canon_nan(logit);
      a.sig[tk * E + e] = canon_nan(sc);
      const float bias = a.bias[size_t(r) * E + e];
      // route_key (seed:L1466): a NaN sc keys last (route_key_of, docs/numerics.md R4.10)
      a.key[tk * E + e] = K4_MUTANT_ON(49)   ? route_key(sigmoid_approx(x + bias), e)
                          : K4_MUTANT_ON(50) ? mut::route_key_ties_high(sc + bias, e)
                          : K4_MUTANT_ON(51) ? mut::route_key_canon_nan(sc + bias, e)
                                             : route_key_of(sc, bias, e);
    });
  }
};

}  // namespace

void launch_route_scores(const RouterArgs& a, hipStream_t s) {
  const DevCfg& cfg = a.cfg;
  if (cfg.hidden % 512 != 0 || cfg.hidden % cfg.threads != 0 || cfg.n_routed % cfg.waves != 0 || cfg.lanes != kWaveLanes)
    throw std::invalid_argument("router kernels: need hidden % 512 == 0, n_routed % 8 == 0, 64-lane waves");
  for (const void* p : {static_cast<const void*>(a.a), static_cast<const void*>(a.h_in), static_cast<const void*>(a.g_post),
                        static_cast<const void*>(a.xn), static_cast<const void*>(a.xn8)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) throw std::invalid_argument("router kernels: the bf16 and E4M3 rows must be 16-byte aligned (16-byte loads)");
  const size_t norm_smem =
      SmemSize().add<float>(cfg.hidden).add<float>(cfg.hidden).add<float>(cfg.threads).add<float>(cfg.waves + 1).used;
  launch(NormBody{a}, Grid{a.tokens, a.ranks, 1}, cfg.threads, norm_smem, s);
  const size_t logit_smem = SmemSize().add<float>(cfg.threads).used;
  launch(LogitBody{a}, Grid{a.tokens * (cfg.n_routed / cfg.waves), a.ranks, 1}, cfg.threads, logit_smem, s);
}

}  // namespace k4::gpu
