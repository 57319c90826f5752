// inputs.hpp -- one decode step's inputs to K4 (what the seed's launcher takes besides weights).
#pragma once
#include <cstdint>
#include <vector>

#include "reference/config.hpp"

namespace k4 {

// Inputs that every rank shares (the residual stream and the block tables are replicated).
struct StepShared {
  int tokens = 1;                     // S, 1..16 decode rows
  int q_len = 1;                      // rows a request (q_len consecutive rows; S % q_len == 0)
  std::vector<int32_t> seq_lens;      // (S,)          0 = a pad row
  int bt_width = 0;                   // block-table row width (blocks)
  std::vector<int32_t> block_table;   // (S, bt_width) page ids: block b's 8 pages are entry * stride + j
  int score_width = 0;                // index-score row width (blocks), every rank's
  std::vector<uint16_t> h_in;         // (S, hidden)   bf16 residual
};

// Inputs of one rank (its q heads, its KV head and its index head).
struct StepRank {
  // (S, score_width) K1's per-block score from this rank's own index head: each rank's K4
  // reads its own mailbox's iscore (seed:L487), so ranks may select different blocks. Pinned
  // blocks' words are unread.
  std::vector<float> index_scores;
  std::vector<uint16_t> q;            // (S, o_k)      bf16
  int n_pages = 0;
  std::vector<uint8_t> k_cache;       // (n_pages, page * head_dim) E4M3, K at (d/16)*256 + t*16 + d%16
  std::vector<uint8_t> v_cache;       // (n_pages, page * head_dim) E4M3, V at d*16 + t
  std::vector<float> k_scale;         // (n_pages, page), or (1,) with one_kv_scale()
  std::vector<float> v_scale;
};

struct StepInputs {
  StepShared shared;
  std::vector<StepRank> ranks;        // tp entries
};

// Byte offsets of key t, dim d inside a page (the seed's KV layout).
inline int k_byte(int t, int d) { return (d / 16) * 256 + t * 16 + d % 16; }
inline int v_byte(int t, int d) { return d * 16 + t; }

}  // namespace k4
