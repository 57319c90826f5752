// Stage 3, o_proj: FP8 x FP8 GEMV with row scales, bf16 partial rows, the rank-ordered
// all-reduce and h_mid (stage_o (seed:L968-L1162)).
//   per row r, token k: 4 k-quarters of 512 (waves w % 4), each 16 blocks of 32 in order
//   (mma_fp8_k128_unit chained from 0); tot = 0 + q0 + q1 + q2 + q3;
//   partial = bf16((tot * x_scale[k]) * s_o[r]).
//   all-reduce: a = bf16(0 + p_rank0 + p_rank1 + ...) (f32, ranks in order); the
//   reduce-scatter + all-gather form (S >= 12) computes the same sum on the row's owner.
//   h_mid = bf16(f32(a) + f32(h_in)).
#pragma once
#include <cstdint>
#include <vector>

#include "reference/config.hpp"
#include "reference/stages/merge.hpp"
#include "reference/weights.hpp"

namespace k4 {

struct OprojOut {
  std::vector<uint16_t> partial;  // (S, hidden) bf16 this rank's partial rows
};

void o_proj_partials(OprojOut& out, const MergeOut& mg, const RankWeights& w, int tokens, const Config& cfg);

// Rank-ordered sum of bf16 partial rows, per destination rank:
// out[dst] = bf16(0 + p[0] + p[1] + ...), f32 adds. zero_start = false models the seed's
// W == 1 FFN path (ar_out = the partial itself). reduce_scatter: the AG_RS form (the row
// group's owner sums, then gathers the bf16 sums to every rank): the same bits.
void all_reduce_rows(std::vector<std::vector<uint16_t>>& out, const std::vector<const std::vector<uint16_t>*>& partials,
                     int tokens, int hidden, bool zero_start, bool reduce_scatter, int rows_per_task);

// h_mid = bf16(f32(a) + f32(h_in)).
void residual_add(std::vector<uint16_t>& h_mid, const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in);

}  // namespace k4
