// stages.hpp -- the stage kernels' arguments and launchers (device/<stage>.cu), for the runner.
//
// Every launcher runs its stage for all `ranks` TP ranks of the step in one launch (grid y =
// rank). A per-rank tensor is one buffer of `ranks` equal slices: rank r's element i is at
// p[r * slice + i], the slice being the tensor's per-rank shape written next to each field.
// Shapes use S = tokens, W = ranks, OK = o_k, H = heads, NS = n_split, TW = table words.
// Field order: outputs first, then inputs, then sizes (STYLE.md).
#pragma once

#include <cstdint>

#include "device/kernel.hpp"

namespace k4::gpu {

// ------------------------------------------------------------------ stage 0: index.cu
struct IndexArgs {
  int32_t* sparse_table;       // (W, S, TW)      slot s's pages at s*8 + j; last word: n_ctx
  int32_t* blocks;             // (W, S, 16)      block id a slot, -1 where none
  int32_t* n_ctx;              // (W, S)
  uint8_t* long_row;           // (W, S)
  int32_t* cand;               // (W, S, NS, 16, 2) long path: each share's 16 best (key, block)
  const int32_t* seq_lens;     // (S)
  const int32_t* block_table;  // (S, bt_width)
  const float* scores;         // (W, S, score_width) each rank's own: its iscore (seed:L487)
  int tokens, q_len, bt_width, score_width, ranks;
  DevCfg cfg;
};
void launch_select_blocks(const IndexArgs& a, hipStream_t s);

// ------------------------------------------------------------------ stage 1: split.cu
struct SplitArgs {
  uint8_t* q8;                 // (W, S, OK)      E4M3 of q
  uint16_t* o;                 // (W, S, NS, OK)  bf16
  float* m;                    // (W, S, NS, H)
  float* l;                    // (W, S, NS, H)
  const int32_t* sparse_table; // (W, S, TW)
  const uint16_t* q;           // (W, S, OK)      bf16
  const uint8_t* k_cache;      // (W, cache_slice) bytes: (n_pages, page * head_dim) a rank
  const uint8_t* v_cache;
  const float* k_scale;        // (W, scale_slice): (n_pages, page) a rank, or (1) static
  const float* v_scale;
  size_t cache_slice, scale_slice;
  int tokens, ranks;
  DevCfg cfg;
};
// fast: QK and PV on the integer tensor cores (device/exact_mma.hpp; the same bits)
void launch_split_attention(const SplitArgs& a, hipStream_t s, bool fast = false);
bool fast_split_supported(const DevCfg& cfg, int tokens);

// ------------------------------------------------------------------ stage 2: merge.cu
struct MergeArgs {
  uint16_t* attn;              // (W, S, OK)      bf16
  uint8_t* attn8;              // (W, S, OK)      E4M3
  float* x_scale;              // (W, S)
  const uint16_t* o;           // (W, S, NS, OK)
  const float* m;              // (W, S, NS, H)
  const float* l;
  int tokens, ranks;
  DevCfg cfg;
};
void launch_merge_partitions(const MergeArgs& a, hipStream_t s);

// ------------------------------------------------------------------ stage 3: oproj.cu
struct OprojArgs {
  uint16_t* partial;           // (W, S, hidden)  bf16 this rank's partial rows
  uint16_t* recv;              // (W dst, W src, S, hidden) exchange buffers, or nullptr
  const uint8_t* attn8;        // (W, S, OK)
  const float* x_scale;        // (W, S)
  const uint8_t* w_o;          // (W, hidden, OK) E4M3
  const float* s_o;            // (W, hidden)
  int tokens, ranks, ag_rs;    // ag_rs: push each 32-row task's rows to its owner (task % W) only
  DevCfg cfg;
};
void launch_o_proj_partials(const OprojArgs& a, hipStream_t s);
// The same partial rows from device/exact_mma.hpp's mma.sync block dots (oproj_fast.cu): attn8
// as launch_e4m3_limbs' B fragments and NaN flags, the weights decoded to limbs as they stream.
struct FastOprojArgs {
  OprojArgs o;
  const uint32_t* xlimbs;      // (W, S, O_K / 32, 3, 4, 2) launch_e4m3_limbs of attn8
  const uint8_t* xnan;         // (W, S, O_K / 32)
};
void launch_fast_o_proj(const FastOprojArgs& a, hipStream_t s);
bool fast_oproj_supported(const DevCfg& cfg, int tokens);

// ------------------------------------------------------------------ all-reduces: allreduce.cu
struct AllReduceArgs {
  uint16_t* out;               // (W, S, hidden)  bf16 rank-ordered sums
  uint16_t* h_mid;             // (W, S, hidden)  bf16(out + h_in), or nullptr
  const uint16_t* recv;        // (W dst, W src, S, hidden): src's partial rows as pushed to dst
  const uint16_t* h_in;        // (S, hidden)     with h_mid
  int tokens, hidden, ranks, rows_per_task;
  int zero_start;              // s = 0 + p0 + p1 + ... (the seed's t0 = 0.0); else s = p0 + ...
  int ag_rs;                   // the owner (task % W) sums recv[owner] and gathers to every rank
};
void launch_all_reduce_rows(const AllReduceArgs& a, hipStream_t s);

// ------------------------------------------------------------------ stage 4: router.cu
struct RouterArgs {
  uint16_t* xn;                // (W, S, hidden)  bf16
  uint8_t* xn8;                // (W, S, hidden)  E4M3
  uint8_t* xsc;                // (W, S, hidden / 32) E8M0
  float* rstd;                 // (W, S)
  float* logit;                // (W, S, E)
  float* sig;                  // (W, S, E)
  int32_t* key;                // (W, S, E)
  const uint16_t* a;           // (W, S, hidden)  the all-reduced o_proj rows
  const uint16_t* h_in;        // (S, hidden)
  const uint16_t* g_post;      // (W, hidden)
  const uint16_t* w_gate;      // (W, E, hidden)
  const float* w_gate_f32;     // (W, E, hidden)  the F32 gate: read under router.gate = f32 only
  const float* bias;           // (W, E)
  int tokens, ranks;
  DevCfg cfg;
};
void launch_route_scores(const RouterArgs& a, hipStream_t s);

// ------------------------------------------------------------------ stage 5: moe.cu
struct RouteArgs {
  int32_t* ids;                // (W, S, 5)
  float* weights;              // (W, S, 5)
  const float* sig;            // (W, S, E)
  const int32_t* key;          // (W, S, E)
  int tokens, ranks;
  DevCfg cfg;
};
void launch_route_top4(const RouteArgs& a, hipStream_t s);

// Device pointers of the uploaded experts, [rank * n_experts + e]; nullptr where an expert is
// not on the device (no token routed to it: its kernels never read it).
struct ExpertTable {
  const uint8_t* const* w13;   // (2 inter, hidden / 2)  E2M1 pairs
  const uint8_t* const* s13;   // (2 inter, hidden / 32) E8M0
  const uint8_t* const* w2;    // (hidden, inter / 2)
  const uint8_t* const* s2;    // (hidden, inter / 32)
  const uint8_t* const* z2 = nullptr;  // zero_row_flags_bytes: each zero mid row's down unit is NaN (launch_zero_row_flags)
};

struct UpGateArgs {
  uint16_t* mid;               // (W, S, 5, inter) bf16
  float* gate;                 // (W, S, 5, inter)
  float* up;                   // (W, S, 5, inter)
  uint8_t* mid8;               // (W, S, 5, inter) E4M3
  uint8_t* midsc;              // (W, S, 5, inter / 32) E8M0
  int32_t* ulist;              // (W, n_experts + 1) scratch: each rank's distinct experts, count last
  const int32_t* ids;          // (W, S, 5)
  const uint8_t* xn8;          // (W, S, hidden)
  const uint8_t* xsc;          // (W, S, hidden / 32)
  const uint8_t* live;         // (S) V2: rows whose routed slots join the wide experts; null: every row
  ExpertTable ex;
  int tokens, ranks;
  DevCfg cfg;
};
void launch_experts_up_gate(const UpGateArgs& a, hipStream_t s);

struct DownArgs {
  uint16_t* partial;           // (W, S, hidden)  bf16 this rank's FFN partial rows
  uint16_t* recv;              // (W dst, W src, S, hidden) exchange buffers, or nullptr
  const int32_t* ids;          // (W, S, 5)
  const float* weights;        // (W, S, 5)
  const uint8_t* mid8;         // (W, S, 5, inter)
  const uint8_t* midsc;        // (W, S, 5, inter / 32)
  const uint8_t* live;         // (S) V2: rows whose routed slots join the wide experts; null: every row
  ExpertTable ex;
  int tokens, ranks, ag_rs;
  DevCfg cfg;
  // The fast path's units (moe_fast.cu), (W, S, 5, hidden, inter / 128): unit (slot, chunk) of
  // token k and row as the tensor cores computed it; nullptr: the kernel computes its units.
  const float* units = nullptr;
};
void launch_experts_down(const DownArgs& a, hipStream_t s);
// An expert's zero-row flags (ExpertTable::z2), once when it is uploaded: for each row of w2,
// whether the zero mid row's unit of each 128-k chunk, times 0, is NaN (the wide down's chains
// add it for the experts a token does not use); (hidden) any chunk's, then (hidden, chunk).
struct ZeroRowFlagsArgs {
  uint8_t* flags;              // zero_row_flags_bytes(cfg)
  const uint8_t* w2;           // the expert's (hidden, inter / 2) or, E4M3, (hidden, inter)
  const uint8_t* s2;           // (hidden, inter / 32)
  int expert;
  DevCfg cfg;
};
size_t zero_row_flags_bytes(const DevCfg& cfg);
void launch_zero_row_flags(const ZeroRowFlagsArgs& a, hipStream_t s);
// Only the distinct-expert list of launch_experts_up_gate (a.ulist from a.ids).
void launch_expert_list(const UpGateArgs& a, hipStream_t s);

// ------------------------------------------------- stage 5 on integer tensor cores: moe_fast.cu
// The same outputs, bit for bit, from device/exact_mma.hpp's mma.sync block dots: the E4M3 rows
// (xn8, mid8) as B-fragment limbs, the expert weights in fragment order (weight_layout.hpp).
struct LimbsArgs {
  uint32_t* limbs;             // (rows, n / 32, 3 limbs, 4 lanes, 2 words): a lane's B fragment
  uint8_t* nan;                // (rows, n / 32) the block holds a NaN code
  const uint8_t* codes;        // (rows, n) E4M3
  int rows, n;
};
void launch_e4m3_limbs(const LimbsArgs& a, hipStream_t s);

struct FastUpGateArgs {
  uint16_t* mid;               // as UpGateArgs
  float* gate;
  float* up;
  uint8_t* mid8;
  uint8_t* midsc;
  int* missing;                // set to 1 when a routed expert is not on the device
  const int32_t* ulist;        // (W, n_experts + 1) the distinct experts (ExpertListBody's)
  const int32_t* ids;          // (W, S, 5)
  const uint32_t* xlimbs;      // (W, S, hidden / 32, 3, 4, 2) launch_e4m3_limbs of xn8
  const uint8_t* xnan;         // (W, S, hidden / 32)
  const uint8_t* xsc;          // (W, S, hidden / 32)
  ExpertTable ex;              // w13 in fragment order
  int tokens, ranks;
  DevCfg cfg;
};
// ulist must hold the step's list first: launch_expert_list (as launch_experts_up_gate does).
void launch_fast_up_gate(const FastUpGateArgs& a, hipStream_t s);

struct FastUnitsArgs {
  float* units;                // (W, S, 5, hidden, inter / 128) DownArgs::units
  int* missing;
  const int32_t* ulist;        // (W, n_experts + 1)
  const int32_t* ids;          // (W, S, 5)
  const uint32_t* mlimbs;      // (W, S, 5, inter / 32, 3, 4, 2) launch_e4m3_limbs of mid8
  const uint8_t* mnan;         // (W, S, 5, inter / 32)
  const uint8_t* midsc;        // (W, S, 5, inter / 32)
  ExpertTable ex;              // w2 in fragment order
  int tokens, ranks;
  DevCfg cfg;
};
void launch_fast_down_units(const FastUnitsArgs& a, hipStream_t s);
// Whether the fast path computes this config's stage 5 (the seed's variant, the shapes).
bool fast_moe_supported(const DevCfg& cfg, int tokens);

// -------------------------------------------------------------------------- shared helpers
// The expert a slot's route id addresses, clamped into the table (seed ug_load / down_load).
K4_HD int slot_expert(const int32_t* ids_row, int slot, const DevCfg& cfg) {
  const int id = ids_row[slot];
  return id < cfg.n_experts - 1 ? id : cfg.n_experts - 1;
}

// Whether (token k, slot) is one of its expert's uses (reference slot_joins): the shared slot
// always, a routed slot unless the step is wide and the row is not live (V2).
K4_HD bool slot_joins(const uint8_t* live, int k, int slot, int tokens, const DevCfg& cfg) {
  return slot == cfg.top_k || tokens < cfg.wide_from || live == nullptr || live[k] != 0;
}

// Push of one bf16 partial element (token k, row) of rank src into the exchange buffers:
// every rank's (plain) or the row's task owner's (ag_rs), as the seed's push_rows.
K4_HD void push_partial(uint16_t* recv, uint16_t v, int src, int k, int row, int tokens, int hidden, int ranks,
                        int rows_per_task, int ag_rs) {
  if (recv == nullptr) return;
  const size_t slice = size_t(tokens) * hidden, i = size_t(k) * hidden + row;
  if (ag_rs) {
    const int owner = (row / rows_per_task) % ranks;
    recv[(size_t(owner) * ranks + src) * slice + i] = v;
  } else {
    for (int dst = 0; dst < ranks; ++dst) recv[(size_t(dst) * ranks + src) * slice + i] = v;
  }
}

// o_proj's partial row p of token k, row `row` on rank r (both o_proj kernels): the planted
// error of stage 3, this rank's partial, the push to the peers.
K4_HD void store_partial(const OprojArgs& a, uint16_t p, int r, int k, int row, int S, int HID, int rows_per_task) {
  if (kPlantStage == 3 && r == 0 && k == 0 && row == 0) p ^= 1;
  a.partial[(size_t(r) * S + k) * HID + row] = p;
  push_partial(a.recv, p, r, k, row, S, HID, a.ranks, rows_per_task, a.ag_rs);
}

}  // namespace k4::gpu
