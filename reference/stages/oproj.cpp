// Stage 3, o_proj: FP8 GEMV with row scales, bf16 partial rows (stage_o (seed:L968-L1162)),
// the rank-ordered all-reduce and h_mid. Contract in oproj.hpp.
#include "reference/stages/oproj.hpp"

#include "reference/numerics/bf16.hpp"
#include "reference/numerics/mma.hpp"
#include "reference/stages/fast_dot.hpp"

namespace k4 {

namespace {

// E4M3 row -> exact integers (x 2^9) and a NaN flag a 32-block.
void decode_row(int32_t* v, uint8_t* nan, const uint8_t* x, int n) {
  decode_e4m3_row_fast(v, x, n);
  for (int b = 0; b < n / kBlockK; ++b) nan[b] = 0;
  for (int i = 0; i < n; ++i) nan[i / kBlockK] |= e4m3_is_nan(x[i]);
}

}  // namespace

void o_proj_partials(OprojOut& out, const MergeOut& mg, const RankWeights& w, int tokens, const Config& cfg) {
  const int OK = cfg.o_k(), HID = cfg.hidden, KB = OK / kBlockK;
  const int quarter_blocks = KB / 4;  // waves w % 4 split k in quarters
  std::vector<int32_t> x(size_t(tokens) * OK);
  std::vector<uint8_t> xnan(size_t(tokens) * KB);
  for (int k = 0; k < tokens; ++k) decode_row(&x[size_t(k) * OK], &xnan[size_t(k) * KB], &mg.attn8[size_t(k) * OK], OK);
  out.partial.assign(size_t(tokens) * HID, 0);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < HID; ++r) {
    std::vector<int32_t> wr(OK);
    std::vector<uint8_t> wnan(KB);
    decode_row(wr.data(), wnan.data(), &w.w_o[size_t(r) * OK], OK);
    for (int k = 0; k < tokens; ++k) {
      const int32_t* xk = &x[size_t(k) * OK];
      const uint8_t* nk = &xnan[size_t(k) * KB];
      float tot = 0.0f;
      for (int q = 0; q < 4; ++q) {
        float c = 0.0f;  // the wave's MFMA chain: 16x16x128 unit-scale, blocks in k order
        for (int b = q * quarter_blocks; b < (q + 1) * quarter_blocks; ++b)
          c = c + block_dot_ints(&wr[b * kBlockK], xk + b * kBlockK, wnan[b] | nk[b], 18);
        tot = tot + c;  // grp (seed:L1073-L1080): the 4 waves of the row group, from 0
      }
      out.partial[size_t(k) * HID + r] = bf16_bits_rne((tot * mg.x_scale[k]) * w.s_o[r]);
    }
  }
}

namespace {

// Rank-ordered sum of one element over the peers' partials (f32 adds of bf16 values).
uint16_t rank_sum(const std::vector<const std::vector<uint16_t>*>& partials, size_t i, bool zero_start) {
  float s = bf16_to_f32((*partials[0])[i]);
  if (zero_start) s = 0.0f + s;  // the seed's t0 = 0.0; t0 = t0 + f0 (turns -0 into +0)
  for (size_t src = 1; src < partials.size(); ++src) s = s + bf16_to_f32((*partials[src])[i]);
  return bf16_bits_rne(s);
}

}  // namespace

void all_reduce_rows(std::vector<std::vector<uint16_t>>& out, const std::vector<const std::vector<uint16_t>*>& partials,
                     int tokens, int hidden, bool zero_start, bool reduce_scatter, int rows_per_task) {
  const int W = int(partials.size());
  out.assign(W, std::vector<uint16_t>(size_t(tokens) * hidden, 0));
  for (int t = 0; t < hidden / rows_per_task; ++t)
    for (int k = 0; k < tokens; ++k)
      for (int r = t * rows_per_task; r < (t + 1) * rows_per_task; ++r) {
        const size_t i = size_t(k) * hidden + r;
        if (reduce_scatter) {
          // the row group's owner sums every peer's partials, then gathers the bf16 sums
          const uint16_t sum = rank_sum(partials, i, zero_start);
          for (int dst = 0; dst < W; ++dst) out[dst][i] = sum;
        } else {
          // every rank sums the partials pushed to it, in rank order
          for (int dst = 0; dst < W; ++dst) out[dst][i] = rank_sum(partials, i, zero_start);
        }
      }
}

void residual_add(std::vector<uint16_t>& h_mid, const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in) {
  h_mid.resize(a.size());
  for (size_t i = 0; i < a.size(); ++i) h_mid[i] = bf16_bits_rne(bf16_to_f32(a[i]) + bf16_to_f32(h_in[i]));
}

}  // namespace k4
