// Stage 0, index: sparse block selection (index (seed:L289-L640): step_rows, index_key,
// rank_blocks, place, select_blocks, select_long, wave_best, rank_cands).
//
// Per rank, from that rank's own index scores (its index head: iscore (seed:L487)), per token row k,
// with ctx = max(seq_len, 1) and n_blk = ceil(ctx / 128):
//  - key(b): score bits as a signed-orderable int; b < init_blocks pinned to 1e30,
//    b >= n_blk - local_blocks to 1e29; -0 == +0; NaN below -Inf (INT32_MIN).
//    A context of <= TOPK_BLOCKS blocks is not scored: key(b) = -b (id order).
//  - rank(b) = #{j : key(j) > key(b) or (key(j) == key(b) and j > b)}: ties to the higher id.
//  - selected: rank < n_sel = min(n_blk, 16); slot = rank, less one where the tail block
//    beats it; a selected tail block (n_blk - 1) takes slot n_full = n_sel - 1 and
//    n_ctx = n_full * 128 + (ctx - tail * 128); if >= 16 blocks beat the pinned tail (scores
//    above 1e29) it is dropped and n_ctx = min(16 * 128, ctx).
//  - the sparse table's unselected slots hold 0 (a model convention: the seed leaves them
//    unwritten; the kernel writes the 0s).
//  - a request (q_len rows) whose last row has more than THREADS blocks (index.cp = on: 288) is long: its rows
//    select by the split-candidate path (8 shares: eighths of the blocks; index.cp: owner ranks' halves of blocks
//    >= init_blocks (V6.2); each share's exact top 16, merged) = the ranking of the blocks the shares hold.
#pragma once
#include <cstdint>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"

namespace k4 {

struct IndexOut {
  std::vector<int32_t> sparse_table;  // (S, 16*8 + 1) page ids of slot s at s*8 + j; last: n_ctx. unselected: 0
  std::vector<int32_t> blocks;        // (S, 16) the block id in each slot, -1 where none
  std::vector<int32_t> n_ctx;         // (S,)   sparse context length
  std::vector<uint8_t> long_row;      // (S,)   1 where the row took the split-candidate path
};

// Sort key of block b's score word (seed index_key).
int32_t index_key(const Config& cfg, int b, float score, int n_blk);

// Rows' contexts and paths (seed step_rows): ctx = max(seq_len, 1).
struct RowPlan {
  int ctx, n_blk;
  bool long_path;
};
std::vector<RowPlan> plan_rows(const Config& cfg, const StepShared& in);

// scores: one rank's (S, in.score_width) index scores (StepRank::index_scores).
void select_blocks(IndexOut& out, const StepShared& in, const std::vector<float>& scores, const Config& cfg);

// Long-path selection of one row (exposed for the property test: it must equal ranking).
// Returns the 16 (key, block) candidates in rank order (block -1 = none).
void select_long_candidates(int32_t* keys16, int32_t* blocks16, const Config& cfg,
                            const float* scores, int n_blk);

}  // namespace k4
