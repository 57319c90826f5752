// merge.cu -- stage 2, merge: LSE merge of the partitions and the per-token FP8 quant; the twin
// of reference/stages/merge.cpp (merge_token (seed:L882-L943)).
//
// Contract (reference/stages/merge.hpp), per token and head:
//   gm = max_i m_i (in order); sl_i = l_i * exp2((m_i - gm) * log2e); gs = sum in order, 1
//   where not > 0; a = bf16(0 + (sl_0 / gs) * o_0 + (sl_1 / gs) * o_1 + ...);
//   amax = max |a| over the token's O_K (fmax_ieee over non-negative values: any order);
//   x_scale = amax * f32(1/448); inv = amax == 0 ? 0 : rcp(x_scale); attn8 = E4M3(a * inv)
//   (NoSaturate).
// One block of 512 threads a token and rank, a thread 4 dims of one head (the seed's).
#include "device/mutants.hpp"
#include "device/stages.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/policy.hpp"

namespace k4::gpu {
namespace {

constexpr int kMaxSplit = 16, kPer = 4;  // partitions; dims a thread (O_K / THREADS: 16 x 128 / 512)

// 4 consecutive bf16 (8-byte aligned), one load on the GPU: the bits, element j in out[j].
K4_BODY void load4_bf16(uint16_t* out, const uint16_t* p) {
#if defined(K4_HOST_EMULATION)
  std::memcpy(out, p, 8);
#else
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  __builtin_memcpy(out, &v, 8);
#endif
}

struct MergeBody {
  MergeArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int k = c.bx, r = c.by, S = a.tokens, OK = cfg.o_k, NS = cfg.n_split, H = cfg.heads, D = cfg.head_dim;
    constexpr int per = kPer;  // 4 dims a thread (checked at launch)
    SmemCarver cv{smem};
    float* av = cv.take<float>(OK);         // the merged values, bf16-rounded
    float* red = cv.take<float>(cfg.threads);
    const size_t tk = size_t(r) * S + k;
    const float* mv = a.m + tk * NS * H;
    const float* lv = a.l + tk * NS * H;
    c.each(cfg.threads, [&](int tid) {
      const int e0 = tid * per, h = e0 / D;
      // every load of the thread (each partition's m, l and 4 dims of o) before the arithmetic,
      // which then runs in the seed's order on registers
      float mi[kMaxSplit], sl[kMaxSplit];  // sl: l until the scaling below
      uint16_t ov[kMaxSplit][per];
K4_UNROLL
      for (int i = 0; i < kMaxSplit; ++i)
        if (i < NS) mi[i] = mv[i * H + h], sl[i] = lv[i * H + h], load4_bf16(ov[i], a.o + (tk * NS + i) * OK + e0);
      float gm = mi[0];  // gm (seed:L914-L916)
K4_UNROLL
      for (int i = 1; i < kMaxSplit; ++i)
        if (i < NS) gm = fmax_ieee(gm, mi[i]);
K4_UNROLL
      for (int i = 0; i < kMaxSplit; ++i)
        if (i < NS) sl[i] = sl[i] * exp2_approx((mi[i] - gm) * (K4_MUTANT_ON(30) ? 1.0f : kLog2e));
      float gs = sl[0];
K4_UNROLL
      for (int i = 1; i < kMaxSplit; ++i)
        if (i < NS) gs = gs + sl[i];
      gs = gs > 0.0f || K4_MUTANT_ON(28) ? gs : 1.0f;  // gs (seed:L921)
      float amax = 0.0f;
K4_UNROLL
      for (int j = 0; j < per; ++j) {
        float acc = 0.0f;
K4_UNROLL
        for (int i0 = 0; i0 < kMaxSplit; ++i0) {
          if (i0 >= NS) break;
          const int i = K4_MUTANT_ON(23) ? NS - 1 - i0 : i0;
          const float wi = sl[i] / gs, oi = bf16_to_f32(ov[i][j]);
          acc = K4_MUTANT_ON(24) ? fma_f32(wi, oi, acc) : K4_MUTANT_ON(25) ? acc + (sl[i] * oi) / gs : acc + wi * oi;
        }
        av[e0 + j] = K4_MUTANT_ON(29) ? bf16_to_f32(mut::bf16_bits_trunc(acc)) : bf16_round(acc);  // bf16_round (seed:L933)
        amax = j == 0 ? fabs_f32(av[e0]) : fmax_ieee(amax, fabs_f32(av[e0 + j]));
      }
      red[tid] = amax;
    });
    for (int off = cfg.threads / 2; off >= 1; off /= 2)  // max of non-negative values: any tree
      c.each(off, [&](int i) { red[i] = fmax_ieee(red[i], red[i + off]); });
    const float amax = red[0];
    const float x_scale = amax * kInvFp8Max;
    const float inv = amax == 0.0f && !K4_MUTANT_ON(26) ? 0.0f : rcp_approx(x_scale);  // an all-zero row -> zeros
    c.each(OK, [&](int i) {
      a.attn[tk * OK + i] = bf16_bits_rne(av[i]);
      uint8_t q = e4m3_bits(av[i] * inv, K4_MUTANT_ON(27) ? Fp8Overflow::Saturate : Fp8Overflow::NoSaturate);
      if (kPlantStage == 2 && r == 0 && k == 0 && i == 0) q ^= 1;
      a.attn8[tk * OK + i] = q;
      if (i == 0) a.x_scale[tk] = canon_nan(x_scale);
    });
  }
};

}  // namespace

void launch_merge_partitions(const MergeArgs& a, hipStream_t s) {
  const DevCfg& cfg = a.cfg;
  if (cfg.n_split > kMaxSplit || cfg.o_k != kPer * cfg.threads || cfg.head_dim % kPer != 0)
    throw std::invalid_argument("merge kernel: needs n_split <= 16 and 4 dims a thread within one head");
  if (reinterpret_cast<uintptr_t>(a.o) % 8 != 0) throw std::invalid_argument("merge kernel: o must be 8-byte aligned (a thread's 4 dims are one load)");
  const size_t smem = SmemSize().add<float>(cfg.o_k).add<float>(cfg.threads).used;
  launch(MergeBody{a}, Grid{a.tokens, a.ranks, 1}, cfg.threads, smem, s);
}

}  // namespace k4::gpu
