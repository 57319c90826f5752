// Stage 5, experts: top-4 routing, up/gate (MXFP4 x MXFP8), swiglu, mid MXFP8, down,
// shared expert, bf16 partial rows, rank-ordered sum (experts (seed:L1483-L2570)).
//   route_top4: 4 rounds of an integer max over the 128 route keys; weights
//     sig[pick] * (route_scale / max((w0 + w1) + (w2 + w3), 1e-20)); slot 4: the shared
//     expert (id n_routed) with shared_weight.
//   up/gate (slot s, row r): wave w takes 128-k chunks w*C .. (C = hidden/1024), each
//     mma_f4f8_k128 chained from 0; g = 0 + P_w0 + ... + P_w7, likewise u;
//     y = swiglu(g, u): g' = min(g, L), u' = clamp(u, -L, L),
//     (g' * sigmoid(f32(1.702) * g')) * (u' + 1); mid = bf16(y); MXFP8 per 32 of a slot.
//   down, narrow (S <= 4): quarter q takes units j = q, q+4, ... of (slot j / KC, chunk j % KC)
//     acc += mfma * w_slot; shared units alike with shared_weight, where the units past the
//     last chunk run on the last chunk and are multiplied by 0 and added (NaN-poisoning, not
//     skipped); tot = 0 + R0 + R1 + R2 + R3 + S0 + S1 + S2 + S3; partial = bf16(tot).
//   down, wide (S >= 5): units over the distinct experts in id order (shared last), chunk
//     within; acc += ok ? mfma * w : 0 (w = 0 where the token did not route there);
//     tot = 0 + A0 + A1 + A2 + A3.
//   moe.wide_down_order = per_expert (V3, ATOM): quarter q takes, for u = 0..nu in order,
//     (E_u, chunk q) then (E_u, chunk q + 4) where the chunk exists, over 2 U_MAX iterations;
//     tot = 0 + A0 + A1 + A2 + A3.
//   moe.narrow_final = split (V5.1, ATOM fork): tot = (0 + R0 + .. + R3) + (0 + S0 + .. + S3).
//   ar_out = rank-ordered sum (W == 1: the partial itself).
//   moe.wide_live_rows = exclude_pad (V2, wide steps only): a pad row's routed slots join no
//     expert: the distinct list, the up/gate uses and the down tables count live rows only
//     (a pad row's routed units are its zero mid row times weight 0); its routed-slot gate,
//     up, mid and mid8 are not computed (+0; midsc that of a zero block); its shared slot is.
#pragma once
#include <cstdint>
#include <vector>

#include "reference/config.hpp"
#include "reference/numerics/keys.hpp"
#include "reference/stages/router.hpp"
#include "reference/weights.hpp"

namespace k4 {

struct RouteOut {
  std::vector<int32_t> ids;      // (S, 5) slot 0..3 the picks in pick order, 4 = shared
  std::vector<float> weights;    // (S, 5)
  // (S,) 1 where the row's routed slots join the wide MoE's experts (live_rows); empty: every
  // row. Not an output of route_top4: run_step (and the golden reader) set it from seq_lens.
  std::vector<uint8_t> live;
};

// The rows whose routed picks join the wide MoE (V2): every row under moe.wide_live_rows =
// all; under exclude_pad the rows with seq_len > 0 (aiter's seq_lens[k] > 0; ATOM's
// batch_ids[k] >= 0 marks the same CUDA-graph pad rows).
std::vector<uint8_t> live_rows(const Config& cfg, const std::vector<int32_t>& seq_lens);
// Whether (token k, slot s) is one of its expert's uses in this step: the shared slot always,
// a routed slot unless the step is wide and k is not live (V2).
bool slot_joins(const RouteOut& route, int k, int slot, int tokens, const Config& cfg);

struct MoeOut {
  std::vector<uint16_t> mid;     // (S, 5, inter)        bf16 swiglu output
  std::vector<float> gate;       // (S, 5, inter)        f32 gate GEMV (before swiglu)
  std::vector<float> up;         // (S, 5, inter)        f32 up GEMV
  std::vector<uint8_t> mid8;     // (S, 5, inter)        E4M3
  std::vector<uint8_t> midsc;    // (S, 5, inter / 32)   E8M0
  std::vector<uint16_t> partial; // (S, hidden)          bf16 this rank's partial rows
};

void route_top4(RouteOut& out, const RouterOut& r, int tokens, const Config& cfg);

// swiglu (the seed's swiglu_mul_batch(g, u, -limit)) is in reference/numerics/keys.hpp.

void experts_up_gate(MoeOut& out, const RouteOut& route, const RouterOut& r, const ExpertSource& src, int rank,
                     int tokens, const Config& cfg);
void experts_down(MoeOut& out, const RouteOut& route, const ExpertSource& src, int rank, int tokens,
                  const Config& cfg);

}  // namespace k4
