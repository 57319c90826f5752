// Stage 2, merge: LSE merge of the partitions and the per-token FP8 quant
// (merge_token (seed:L882-L943)). Contract in merge.hpp.
#include "reference/stages/merge.hpp"

#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/policy.hpp"
#include "reference/model_mutants.hpp"

namespace k4 {

void merge_partitions(MergeOut& out, const SplitOut& sp, int tokens, const Config& cfg) {
  const int OK = cfg.o_k(), NS = cfg.n_split, H = cfg.heads, D = cfg.head_dim;
  out.attn.assign(size_t(tokens) * OK, 0);
  out.attn8.assign(size_t(tokens) * OK, 0);
  out.x_scale.assign(tokens, 0.0f);
#pragma omp parallel for schedule(static)
  for (int k = 0; k < tokens; ++k) {
    std::vector<float> a(OK);
    for (int h = 0; h < H; ++h) {
      const float* m = sp.m.data() + size_t(k) * NS * H;
      const float* l = sp.l.data() + size_t(k) * NS * H;
      float gm = m[h];  // gm (seed:L914-L916)
      for (int i = 1; i < NS; ++i) gm = fmax_ieee(gm, m[i * H + h]);
      std::vector<float> sl(NS);
      for (int i = 0; i < NS; ++i) sl[i] = l[i * H + h] * exp2_approx((m[i * H + h] - gm) * (K4_MODEL_MUTANT_ON(11) ? 1.0f : kLog2e));
      float gs = sl[0];
      for (int i = 1; i < NS; ++i) gs = gs + sl[i];
      gs = gs > 0.0f ? gs : 1.0f;  // gs (seed:L921)
      for (int d = 0; d < D; ++d) {
        float av = 0.0f;
        for (int i0 = 0, i; i0 < NS && (i = K4_MODEL_MUTANT_ON(13) ? NS - 1 - i0 : i0, true); ++i0) {
          const float wi = K4_MODEL_MUTANT_ON(12) ? sl[i] : sl[i] / gs;
          av = av + wi * bf16_to_f32(sp.o[(size_t(k) * NS + i) * OK + h * D + d]);
        }
        a[h * D + d] = bf16_round(av);  // bf16_round (seed:L933)
      }
    }
    // block_max over the token's O_K values (max is order-free with canonical NaN)
    float amax = fabs_f32(a[0]);
    for (int i = 1; i < OK; ++i) amax = fmax_ieee(amax, fabs_f32(a[i]));
    const float x_scale = amax * kInvFp8Max;
    const float inv = amax == 0.0f ? 0.0f : rcp_approx(x_scale);  // an all-zero row -> zeros
    for (int i = 0; i < OK; ++i) {
      out.attn[size_t(k) * OK + i] = bf16_bits_rne(a[i]);
      out.attn8[size_t(k) * OK + i] = e4m3_bits(a[i] * inv, Fp8Overflow::NoSaturate);
    }
    out.x_scale[k] = canon_nan(x_scale);
  }
}

}  // namespace k4
