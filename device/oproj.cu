// oproj.cu -- stage 3, o_proj: FP8 x FP8 GEMV with row scales and bf16 partial rows, pushed to
// the peers' exchange buffers; the twin of reference/stages/oproj.cpp
// (stage_o (seed:L968-L1162)). The rank-ordered sum is allreduce.cu's.
//
// Contract (reference/stages/oproj.hpp), per row r and token k:
//   4 k-quarters of O_K / 4 (the seed's waves w % 4), each a chain c = 0; c = c + block_dot
//   over its 32-blocks in k order (mma_fp8_k128_unit, chained); tot = 0 + q0 + q1 + q2 + q3;
//   partial = bf16((tot * x_scale[k]) * s_o[r]).
// One block of 512 threads a 32-row task (O_ROWS) and rank: every token's fp8 input staged in
// shared memory once; thread (row, quarter, token group of 4) decodes each weight block once
// for its tokens; the quarter chains meet in shared memory, summed in quarter order.
#include "device/mutants.hpp"
#include "device/stages.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/mma.hpp"

namespace k4::gpu {
namespace {

constexpr int kRows = 32, kQuarters = 4, kTokenGroups = 4, kMaxTokens = 16;

struct OprojBody {
  OprojArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int task = c.bx, r = c.by, S = a.tokens, OK = cfg.o_k, HID = cfg.hidden;
    const int quarter = OK / kQuarters, blocks_q = quarter / kBlockK;
    SmemCarver cv{smem};
    uint8_t* x8 = cv.take<uint8_t>(size_t(S) * OK);                // (S, OK)
    float* part = cv.take<float>(size_t(S) * kRows * kQuarters);  // (S, 32, 4)
    int32_t* dec = cv.take<int32_t>(256);                          // E4M3 code -> value x 2^9
    const uint8_t* x_src = a.attn8 + size_t(r) * S * OK;
    c.each(S * OK / 16 + 256, [&](int i) {
      if (i < S * OK / 16) store16(x8 + 16 * i, load16(x_src + 16 * i));
      else dec[i - S * OK / 16] = e4m3_to_int_x512(uint8_t(i - S * OK / 16));
    });
    const uint8_t* w_rank = a.w_o + size_t(r) * HID * OK;
    const int groups = S < kTokenGroups ? S : kTokenGroups;  // token k on group k % groups
    c.each(kRows * kQuarters * groups, [&](int i) {
      const int rr = i % kRows, q = (i / kRows) % kQuarters, kg = i / (kRows * kQuarters);
      const uint8_t* wrow = w_rank + size_t(task * kRows + rr) * OK + q * quarter;
      float acc[kMaxTokens / kTokenGroups];
      for (int j = 0; j < kMaxTokens / kTokenGroups; ++j) acc[j] = 0.0f;
      for (int b0 = 0, b; b0 < blocks_q && (b = K4_MUTANT_ON(33) ? blocks_q - 1 - b0 : b0, true); ++b0) {
        const Bytes16 w0 = load16(wrow + b * kBlockK), w1 = load16(wrow + b * kBlockK + 16);
        int32_t wi[kBlockK];
        bool wnan = false;
        for (int e = 0; e < 16; ++e) {
          wi[e] = dec[w0.b[e]], wi[16 + e] = dec[w1.b[e]];
          wnan |= e4m3_is_nan(w0.b[e]) || e4m3_is_nan(w1.b[e]);
        }
        for (int j = 0; j < kMaxTokens / kTokenGroups; ++j) {
          const int k = kg + groups * j;
          if (k >= S) break;
          const uint8_t* xb = x8 + size_t(k) * OK + q * quarter + b * kBlockK;
          int32_t xi[kBlockK];
          bool xnan = false;
          for (int e = 0; e < kBlockK; ++e) xi[e] = dec[xb[e]], xnan |= e4m3_is_nan(xb[e]);
          acc[j] = acc[j] + block_dot_ints(wi, xi, (wnan && !K4_MUTANT_ON(34)) || xnan, 18);
        }
      }
      for (int j = 0; j < kMaxTokens / kTokenGroups; ++j) {
        const int k = kg + groups * j;
        if (k < S) part[(size_t(k) * kRows + rr) * kQuarters + q] = acc[j];
      }
    });
    c.each(S * kRows, [&](int i) {
      const int rr = i % kRows, k = i / kRows, row = task * kRows + rr;
      float tot = 0.0f;  // grp (seed:L1073-L1080): the 4 waves of the row group, from 0
      for (int q = 0; q < kQuarters; ++q) tot = tot + part[(size_t(k) * kRows + rr) * kQuarters + (K4_MUTANT_ON(31) ? kQuarters - 1 - q : q)];
      const float xs = a.x_scale[size_t(r) * S + k], so = a.s_o[size_t(r) * HID + row];
      uint16_t p = bf16_bits_rne(K4_MUTANT_ON(32) ? tot * (xs * so) : (tot * xs) * so);
      store_partial(a, p, r, k, row, S, HID, kRows);
    });
  }
};

}  // namespace

void launch_o_proj_partials(const OprojArgs& a, hipStream_t s) {
  const DevCfg& cfg = a.cfg;
  if (cfg.o_rows != kRows || cfg.hidden % kRows != 0 || cfg.o_k % (kQuarters * kBlockK) != 0 || a.tokens > kMaxTokens)
    throw std::invalid_argument("o_proj kernel: needs 32-row tasks, O_K in whole 32-blocks a quarter, S <= 16");
  const size_t smem = SmemSize()
                          .add<uint8_t>(size_t(a.tokens) * cfg.o_k)
                          .add<float>(size_t(a.tokens) * kRows * kQuarters)
                          .add<int32_t>(256)
                          .used;
  const int groups = a.tokens < kTokenGroups ? a.tokens : kTokenGroups;
  launch(OprojBody{a}, Grid{cfg.hidden / kRows, a.ranks, 1}, kRows * kQuarters * groups, smem, s);
}

}  // namespace k4::gpu
