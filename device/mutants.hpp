// mutants.hpp -- the kernels' mutants: each a small, realistic kernel mistake behind a switch
// at one site of device/*.cu, written `K4_MUTANT_ON(N) ? wrong : right` (or an `if`). The
// suite must kill every one (tests/gpu/test_mutants_gpu.cpp, docs/gpu-verification.md "Mutants").
//
// The switch, by build:
//   production (neither define)   K4_MUTANT_ON(N) is `false`: compiled out, zero cost
//   -DK4_MUTANT=N                 exactly mutant N compiled in (a one-mutant build)
//   -DK4_MUTANTS                  every mutant compiled in, the active one chosen at run time
//                                 (gpu::set_mutant, or the environment variable K4_MUTANT): the
//                                 host emulation's k4_emu_mutants and the GPU suite's
//                                 k4_gpu_tests_mutants, so that ONE build runs every mutant
// In a K4_MUTANTS CUDA build every translation unit holds its own __constant__ copy of the
// active id, set by set_mutant through the setters the units register at start-up.
//
// The registry below lists every site: id, stage, file, kind, what the mistake is, and the rule
// of docs/numerics.md it breaks with its seed citation; `equivalent` is non-empty for a mutant
// that cannot change any output, with the argument why (the kill runner then checks that no
// case kills it, since a kill would prove the argument wrong).
// The wrong twins of the numerics helpers the sites call are at the end (namespace mut).
#pragma once

#include <cstdint>

#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/hd.hpp"
#include "reference/numerics/mx.hpp"
#include "reference/numerics/policy.hpp"

namespace k4::gpu {

// The active mutant of a K4_MUTANTS build (0: none; the host's copy); the kill runner sets it
// between steps with set_mutant (which also sets the device copies). Its first value is the
// environment variable K4_MUTANT's.
inline int g_mutant_host = 0;
void set_mutant(int id);
// Whether this build can switch mutants at run time (K4_MUTANTS), and the one a K4_MUTANT=N
// build has compiled in (0: none).
bool mutants_switchable();
int compiled_mutant();
// K4_MUTANTS CUDA builds: each translation unit's setter of its __constant__ copy.
using MutantSetter = void (*)(int);
void register_mutant_setter(MutantSetter f);

}  // namespace k4::gpu

#if defined(K4_MUTANT)
#define K4_MUTANT_ON(n) ((n) == (K4_MUTANT))
#elif defined(K4_MUTANTS)
#if defined(K4_HOST_EMULATION)
#define K4_MUTANT_ON(n) (::k4::gpu::g_mutant_host == (n))
#elif defined(__CUDACC__) && !defined(__HIP__)
static __constant__ int k4_mutant_dev;  // this unit's copy of the active id
namespace {
struct K4MutantSetterReg {
  K4MutantSetterReg() {
    ::k4::gpu::register_mutant_setter(
        [](int id) { (void)cudaMemcpyToSymbol(k4_mutant_dev, &id, sizeof id); });
  }
};
[[maybe_unused]] const K4MutantSetterReg k4_mutant_setter_reg;
__host__ __device__ inline int k4_mutant_id() {
#if defined(__CUDA_ARCH__)
  return k4_mutant_dev;
#else
  return ::k4::gpu::g_mutant_host;
#endif
}
}  // namespace
#define K4_MUTANT_ON(n) (k4_mutant_id() == (n))
#else
#error "K4_MUTANTS (mutants chosen at run time) needs the host emulation or CUDA; use K4_MUTANT=N"
#endif
#else
#define K4_MUTANT_ON(n) false
#endif

namespace k4::gpu {

struct MutantInfo {
  int id;
  const char* stage;       // "0 index" .. "5 moe", "ar" (the all-reduces)
  const char* file;        // the device/ source holding the site
  const char* kind;        // order, nan, clamp, conversion, selection, routing, threshold, pad, semantic
  const char* what;        // the mistake, in one line
  const char* rule;        // the rule it breaks (docs/numerics.md) and its seed lines
  const char* equivalent;  // "" or why no output can change
  // "" or why no output can change on NVIDIA GPUs only (their arithmetic's NaN is canonical)
  const char* cuda_equivalent = "";
};

// clang-format off
inline constexpr MutantInfo kMutants[] = {
  // ---------------------------------------------------------------- stage 0: index.cu
  {1, "0 index", "index.cu", "selection", "short path: score ties go to the lower block id", "R0.5: rank (seed:L363-L376)", ""},
  {2, "0 index", "index.cu", "selection", "the tail block keeps its rank slot instead of the last one", "R0.6: place (seed:L453-L475)", ""},
  {3, "0 index", "index.cu", "selection", "the local (tail) block is not pinned: keyed by score 0", "R0.3: index_key (seed:L312-L321)", ""},
  {4, "0 index", "index.cu", "selection", "pinned init blocks off by one (b <= init_blocks): block 0 pinned", "R0.3: index_key (seed:L312-L321)", ""},
  {5, "0 index", "index.cu", "nan", "a NaN score keyed by its raw bits (above +Inf) instead of INT32_MIN", "R0.3: index_key (seed:L312-L321)", ""},
  {6, "0 index", "index.cu", "nan", "-0 score not folded into +0: keyed below +0", "R0.3: index_key (seed:L312-L321)", ""},
  {7, "0 index", "index.cu", "pad", "n_ctx from the raw seq_len (a pad row's 0) instead of max(seq_len, 1)", "R0.1, R0.6: step_rows (seed:L292-L296), place (seed:L453-L475)", ""},
  {8, "0 index", "index.cu", "selection", "n_ctx off by one when the tail block is selected", "R0.6: place (seed:L453-L475)", ""},
  {9, "0 index", "index.cu", "threshold", "long path from n_blk >= 512 (the seed: > 512)", "R0.2: q_len (seed:L294-L302), unlikely (seed:L640)", ""},
  {10, "0 index", "index.cu", "threshold", "long decided by the row's own n_blk, not its request's last row", "R0.2: q_len (seed:L294-L302), n_blk (seed:L488-L489)", ""},
  {11, "0 index", "index.cu", "order", "rank_cands: partner row not reversed (bitonic merge of two descending rows)", "R0.9: rank_cands (seed:L436-L452)", ""},
  {12, "0 index", "index.cu", "selection", "lane networks: ties to the lower block id (and dead slots beat NaN blocks)", "R0.9, R0.10: merge16_best (seed:L395-L435), ch (seed:L583-L584)", ""},
  {13, "0 index", "index.cu", "threshold", "a row is scored from n_blk >= 16 (the seed: > 16, id order at 16)", "R0.2, R0.4: scored_k (seed:L356), n_blk (seed:L488-L489)", ""},
  // index.cp = on (docs/numerics.md V6.2): the CP shares and threshold
  {77, "0 index", "index.cu", "selection", "index.cp: own0 = the owner rank (init_blocks ignored): blocks below init are candidates", "V6.2.2: own0 (seed:L534)", ""},
  {78, "0 index", "index.cu", "selection", "index.cp: own0 with C++'s remainder (negative for a rank below init_blocks) instead of the seed's Python mod", "V6.2.2: own0 (seed:L534)", ""},
  {79, "0 index", "index.cu", "threshold", "index.cp: long path from n_blk >= 288 (the rule: > 288)", "V6.2.1: step_rows (seed:L294-L296)", ""},
  {80, "0 index", "index.cu", "threshold", "index.cp: long path past THREADS blocks (the one-head threshold) instead of 288", "V6.2.1: step_rows (seed:L294-L296)", ""},
  {81, "0 index", "index.cu", "selection", "index.cp: n_own = floor((n_blk - own0) / TP): the owner's last block (the tail for one rank) not a candidate", "V6.2.2: n_own (seed:L535)", ""},
  {82, "0 index", "index.cu", "semantic", "index.cp: the score read at the seed's CP slot min(b, last) div TP of the logical scores instead of min(b, last)", "V6.2.2: slots (seed:L545)", ""},
  // ---------------------------------------------------------------- stage 1: split.cu
  {14, "1 split", "split.cu", "conversion", "q -> E4M3 saturating (the seed's convert does not: > 464 is NaN)", "R1.1: qv (seed:L682), fp8_pack4 (seed:L743)", ""},
  {15, "1 split", "split.cu", "nan", "a masked key's score is its product (0) instead of NEG", "R1.3: kss (seed:L719-L730), sm_scale (seed:L762-L764)", ""},
  {16, "1 split", "split.cu", "nan", "V bytes past n_ctx not masked (a NaN code there poisons PV)", "R1.10: vpg (seed:L705-L718), n_ctx (seed:L834-L841)", ""},
  {17, "1 split", "split.cu", "nan", "vmax over every key of the partition, masked ones too", "R1.5, R1.8: vmax (seed:L782-L784), b8 (seed:L800-L809)", ""},
  {18, "1 split", "split.cu", "order", "QK: the 4 dim chunks chained in reverse order", "R1.2: kw (seed:L685-L704), sc (seed:L750-L761)", ""},
  {19, "1 split", "split.cu", "order", "l: waves summed 0, 7, 6, .., 1 instead of in order", "R1.9: lsum (seed:L857-L859), lt (seed:L874-L876)", ""},
  {20, "1 split", "split.cu", "nan", "o divided by the unguarded l (no l > 0 ? l : 1)", "R1.12: e0 (seed:L855-L877)",
   "l is >= 1 (the max key's p is exp2(0) = 1) or NaN; a NaN l needs a NaN p, whose P8 is 0x7F, so acc and o are NaN with the guard too"},
  {21, "1 split", "split.cu", "order", "P8 = E4M3(vs * (fscale * p)) instead of (vs * fscale) * p", "R1.8: b8 (seed:L800-L809)", ""},
  {22, "1 split", "split.cu", "nan", "fscale = 448 * rcp(vmax) without the 1e-8 (a partition with no valid key: 0 * Inf)", "R1.6: fscale (seed:L791-L792)", ""},
  // ---------------------------------------------------------------- stage 2: merge.cu
  {23, "2 merge", "merge.cu", "order", "partitions merged from the last to the first", "R2.5: av (seed:L922-L933)", ""},
  {24, "2 merge", "merge.cu", "order", "merge products fused into the sum (fma: contraction)", "R2.5: av (seed:L922-L933)", ""},
  {25, "2 merge", "merge.cu", "semantic", "weights applied after the product: (sl_i * o_i) / gs", "R2.4, R2.5: wi (seed:L924)", ""},
  {26, "2 merge", "merge.cu", "nan", "inv = rcp(x_scale) also for amax = 0 (an all-zero row: 0 * Inf)", "R2.8: inv (seed:L941-L942)", ""},
  {27, "2 merge", "merge.cu", "conversion", "attn8 saturating (a tiny row's inv = Inf: 448 instead of NaN)", "R2.9: fp8_pack4 (seed:L943)", ""},
  {28, "2 merge", "merge.cu", "nan", "gs used unguarded (no gs > 0 ? gs : 1)", "R2.3: gs (seed:L918-L921)",
   "gs >= 1 (the partition at gm has exp2(0) * l with l >= 1) or NaN; a NaN gs needs a NaN sl_j, which makes every dim of the head NaN with the guard too"},
  {29, "2 merge", "merge.cu", "conversion", "merged value bf16 by truncation instead of RNE", "R2.5, §1 bf16: av (seed:L922-L933)", ""},
  {30, "2 merge", "merge.cu", "semantic", "LSE weights exp2(m_i - gm) without log2(e)", "R2.2: l_i (seed:L917)", ""},
  // ---------------------------------------------------------------- stage 3: oproj.cu
  {31, "3 o_proj", "oproj.cu", "order", "the 4 k-quarters summed 3, 2, 1, 0", "R3.2: O_ROWS (seed:L1071-L1080)", ""},
  {32, "3 o_proj", "oproj.cu", "order", "partial = bf16(tot * (x_scale * s_o)) instead of (tot * x_scale) * s_o", "R3.3: s_o (seed:L988-L992), partial (seed:L1081)", ""},
  {33, "3 o_proj", "oproj.cu", "order", "a quarter's 32-blocks chained in reverse order", "R3.1: col_tok (seed:L1025-L1068)", ""},
  {34, "3 o_proj", "oproj.cu", "nan", "a NaN weight code (0x7F) not propagated: decoded as a number", "§2 NaN blocks, R3.1: col_tok (seed:L1025-L1068)", ""},
  // ---------------------------------------------------------------- all-reduces: allreduce.cu, runner.cu
  {35, "ar", "allreduce.cu", "order", "ranks summed 0, W-1, .., 1 instead of in rank order", "R3.4, R5.17: t0 (seed:L1143-L1151), rank_sum (seed:L1729-L1747)", ""},
  {36, "ar", "allreduce.cu", "order", "the all-reduces without their 0.0 start (a -0 sum stays -0)", "R3.4: t0 (seed:L1143-L1151)", ""},
  {37, "ar", "allreduce.cu", "conversion", "h_mid from the unrounded f32 sum instead of bf16(a)", "R3.6: tokens (seed:L1152-L1162)", ""},
  {38, "ar", "allreduce.cu", "threshold", "reduce-scatter owner off by one task (the owner sums rows it never got)", "R3.5: AG_RS (seed:L1087-L1113)", ""},
  {39, "ar", "runner.cu", "threshold", "reduce-scatter + all-gather from S = 11 (the seed: 12)", "R3.5, R5.17: AG_RS (seed:L190), AG_RS (seed:L1748-L1773)",
   "the two forms compute one sum in one order at one place and gather its bf16: the same bits (the suite's 'all-reduce forms' forces both at S = 4, 11, 12, 16)"},
  // ---------------------------------------------------------------- stage 4: router.cu
  {40, "4 router", "router.cu", "semantic", "RMSNorm x * rstd * g instead of Gemma's x * rstd * (1 + g)", "R4.5: rstd (seed:L1409-L1416)", ""},
  {41, "4 router", "router.cu", "order", "sum of squares without the fma: ssw + v * v", "R4.2: ssw (seed:L1397-L1399)", ""},
  {42, "4 router", "router.cu", "order", "sum of squares: waves summed 0, 7, .., 1", "R4.3: ssw (seed:L1400-L1406)", ""},
  {43, "4 router", "router.cu", "semantic", "rstd = rsq((ss + eps) / HIDDEN) instead of rsq(ss / HIDDEN + eps)", "R4.4: rstd (seed:L1408)", ""},
  {44, "4 router", "router.cu", "conversion", "sigmoid of the f32 logit, not of bf16(logit)", "R4.8: bf16_round (seed:L1465)", ""},
  {45, "4 router", "router.cu", "order", "fdot2 with the high pair first", "R4.7, P4: gw (seed:L1337-L1347)", ""},
  {46, "4 router", "router.cu", "order", "lane value ((a0 + a1) + a2) + a3 instead of (a0 + a1) + (a2 + a3)", "R4.7: accs (seed:L1446-L1461)", ""},
  {47, "4 router", "router.cu", "conversion", "xn's E8M0 scale rounded down (floor) instead of RoundUp", "R4.6, §9 MXFP8 RoundUp: XN_SLICE (seed:L1419-L1442)", ""},
  {48, "4 router", "router.cu", "clamp", "xn MXFP8 without the +-448 clamp (non-saturating convert: Inf -> NaN)", "R4.6, §1 E4M3 call sites: XN_SLICE (seed:L1419-L1442)", ""},
  {49, "4 router", "router.cu", "routing", "route key from sigmoid(logit + bias) instead of sigmoid(logit) + bias", "R4.8, R4.9: bf16_round (seed:L1465), route_key (seed:L1466)", ""},
  {50, "4 router", "router.cu", "selection", "route key ties (one bucket) go to the higher expert id", "R4.9: route_key (seed:L174-L180)", ""},
  {51, "4 router", "router.cu", "nan", "route key of a NaN as the canonical +NaN (picked first) instead of the sign R4.10 gives it", "R4.9, R4.10: route_key (seed:L174-L180), route_key (seed:L1466)", ""},
  // ---------------------------------------------------------------- stage 5: moe.cu
  {52, "5 moe", "moe.cu", "routing", "route weights from the biased score (the key's value) instead of sig", "R5.2: tot (seed:L1197-L1203)", ""},
  {53, "5 moe", "moe.cu", "routing", "route weights not renormalised: sig * route_scale", "R5.2: tot (seed:L1197-L1203)", ""},
  {54, "5 moe", "moe.cu", "routing", "route_scale applied to the shared expert's weight too", "R5.3: shared_weight (seed:L1207-L1209)", ""},
  {55, "5 moe", "moe.cu", "order", "route weight sum ((w0 + w1) + w2) + w3 instead of the butterfly's", "R5.2: tot (seed:L1197-L1203)", ""},
  {56, "5 moe", "moe.cu", "nan", "route weight sum not floored at 1e-20 (four zero sigmoids: 0 * Inf)", "R5.2: tot (seed:L1197-L1203)", ""},
  {57, "5 moe", "moe.cu", "order", "gate: waves summed in reverse order", "R5.6: shared (seed:L1575-L1587)", ""},
  {58, "5 moe", "moe.cu", "semantic", "gate and up rows swapped (up rows first)", "R5.5: UG_CPW (seed:L1532-L1549)", ""},
  {59, "5 moe", "moe.cu", "conversion", "up/gate block results flushed to zero when subnormal", "§2, P8: cg_ (seed:L1556-L1568)", ""},
  {60, "5 moe", "moe.cu", "clamp", "swiglu: u clamped one-sided (min(u, L)), not to [-L, L]", "R5.7: swiglu_mul_batch (seed:L1588)", ""},
  {61, "5 moe", "moe.cu", "clamp", "swiglu: the clamp after the multiply (y to [-L, L]) instead of on g and u", "R5.7: swiglu_mul_batch (seed:L1588)", ""},
  {62, "5 moe", "moe.cu", "nan", "swiglu: min/max that drop NaN (fminf/fmaxf: a NaN g becomes L)", "R5.7: swiglu_mul_batch (seed:L1588)", ""},
  {63, "5 moe", "moe.cu", "semantic", "swiglu as SiLU: sigmoid(g') instead of sigmoid(1.702 g')", "R5.7: swiglu_mul_batch (seed:L1588)", ""},
  {64, "5 moe", "moe.cu", "conversion", "mid bf16 by truncation instead of RNE", "R5.8: mid (seed:L1592)", ""},
  {65, "5 moe", "moe.cu", "conversion", "mid's E8M0 scale rounded down (floor) instead of RoundUp", "R5.8, §9 MXFP8 RoundUp: mid (seed:L2449-L2495)", ""},
  {66, "5 moe", "moe.cu", "clamp", "mid MXFP8 without the +-448 clamp", "R5.8, §1 E4M3 call sites: mid (seed:L2449-L2495)",
   "|swiglu| <= 7 * 1 * 8 = 56 for finite g, u (g' <= 7, sigmoid <= 1, u' + 1 in [-6, 8]; g' -> -Inf gives -0), and RoundUp keeps |v * inv| <= 448: the clamp never bites; NaN is 0x7F either way"},
  {67, "5 moe", "moe.cu", "nan", "wide down: a not-routed token's zero-row unit is +0 even when the expert's s2 scale is NaN", "R5.13, R5.14: DN_WITERS (seed:L2274-L2290)", ""},
  {68, "5 moe", "moe.cu", "nan", "narrow down: the shared expert's padded units skipped instead of multiplied by 0", "R5.10: down_load_shared (seed:L1686-L1711), min (seed:L2499-L2521)", ""},
  {69, "5 moe", "moe.cu", "order", "narrow down: final sum R0 + S0 + R1 + S1 .. instead of R0..R3 then S0..S3", "R5.11: DN_ROWS (seed:L2550-L2568)", ""},
  {70, "5 moe", "moe.cu", "order", "narrow down: the routed and shared chains merged into one chain", "R5.9-R5.11: tokens (seed:L2524-L2548), DN_ROWS (seed:L2550-L2568)", ""},
  {71, "5 moe", "moe.cu", "threshold", "wide MoE from S = 6 (the seed: 5)", "R5.12, narrow vs wide: build_experts (seed:L1816-L1842)", ""},
  {72, "5 moe", "moe.cu", "threshold", "wide MoE from S = 4 (the seed: 5)", "R5.12, narrow vs wide: build_experts (seed:L1816-L1842)", ""},
  {73, "5 moe", "moe.cu", "order", "wide down: distinct experts in descending id order", "R5.12: build_experts (seed:L1816-L1842)", ""},
  {74, "5 moe", "moe.cu", "order", "down: a unit's 4 blocks chained in reverse order", "R5.9, §2 block order: tokens (seed:L2524-L2548)", ""},
  {75, "5 moe", "moe.cu", "nan", "up/gate: a NaN xn8 code not propagated (decoded as a number)", "§2 NaN blocks, R5.5: cg_ (seed:L1556-L1568)", ""},
  {76, "5 moe", "moe.cu", "nan", "down: a NaN mid8 code not propagated (decoded as a number)", "§2 NaN blocks, R5.9: down_load (seed:L1656-L1685)", ""},
  // ------------------------------------------- the tensor-core path (K4_FAST=1): *_fast.cu
  // Live only on that path: the kill table takes them when K4_FAST=1 (and the others when not).
  {83, "5 moe", "moe_fast.cu", "order", "rotated tiles: a group's 4 block values chained in reverse order", "R5.5, §2 block order: cg_ (seed:L1556-L1568)", ""},
  {84, "5 moe", "moe_fast.cu", "nan", "fast up/gate and down: a NaN x / mid block's flag dropped from the B factor (scaled as a number)", "§2 NaN blocks, R5.5: cg_ (seed:L1556-L1568)", ""},
  {85, "5 moe", "moe_fast.cu", "order", "fast up/gate: gate's wave partials summed in reverse order", "R5.6: shared (seed:L1575-L1587)", ""},
  {86, "5 moe", "moe_fast.cu", "nan", "fast up/gate: mid's MXFP8 amax by fmaxf (drops a NaN) instead of IEEE maximum", "R5.8, §9 MXFP8 amax: mid (seed:L2449-L2495)", ""},
  {87, "5 moe", "moe_fast.cu", "threshold", "block values: the fast form for every scale, the edge branch never taken (a NaN E8M0 scale gives +-Inf, sa > 228 can overflow)", "§2 block scaling, P8: cg_ (seed:L1556-L1568)", ""},
  {88, "3 o_proj", "oproj_fast.cu", "nan", "fast o_proj: a row's NaN flag not shared across the quad (only the lane's own 8 codes)", "§2 NaN blocks, R3.1: col_tok (seed:L1025-L1068)", ""},
};
// clang-format on

inline constexpr int kMutantCount = int(sizeof(kMutants) / sizeof(kMutants[0]));

}  // namespace k4::gpu

// ------------------------------------------------------------------ the wrong twins
// What a site computes when its mutant is on. Each is the numerics helper of reference/numerics
// with the one mistake its mutant names.
namespace k4::mut {

// bf16 by truncation (NaN kept quiet).
K4_HD uint16_t bf16_bits_trunc(float f) {
  const uint32_t b = f32_bits(f);
  return is_nan(f) ? uint16_t(0x7FC0) : uint16_t(b >> 16);
}
// A subnormal result flushed to a zero of its sign.
K4_HD float ftz(float x) {
  const uint32_t b = f32_bits(x);
  return (b & 0x7F800000u) == 0 ? f32_from_bits(b & 0x80000000u) : x;
}
// rocdl.fdot2 with the high pair first.
K4_HD float fdot2_hi_first(uint32_t a_pair, uint32_t b_pair, float c) {
  return fma_f32(bf16_pair_lo(a_pair), bf16_pair_lo(b_pair), fma_f32(bf16_pair_hi(a_pair), bf16_pair_hi(b_pair), c));
}
// MXFP8 block: scale floor(log2(amax / 448)) (no round-up), or without the +-448 clamp.
K4_HD uint8_t mx8_block_floor(const float* v, uint8_t* q32) {
  const float amax = mx8_block_amax(v, 32);
  int32_t e = int32_t((f32_bits(amax * kInvFp8Max) >> 23) & 0xFFu);
  e = e > 254 ? 254 : (e < 1 ? 1 : e);
  const float inv = rcp_approx(f32_from_bits(uint32_t(e) << 23));
  for (int i = 0; i < 32; ++i) q32[i] = mx8_quant(v[i], inv);
  return uint8_t(e);
}
K4_HD uint8_t mx8_block_noclamp(const float* v, uint8_t* q32) {
  const Mx8Scale s = mx8_scale_of_amax(mx8_block_amax(v, 32));
  for (int i = 0; i < 32; ++i) q32[i] = e4m3_bits(v[i] * s.inv, Fp8Overflow::NoSaturate);
  return s.e;
}
// The wrong MXFP8 quantizer for mutant ids (floor, noclamp) when one is on, else the right one.
K4_HD uint8_t mx8_block(bool floor_on, bool noclamp_on, const float* v, uint8_t* q32) {
  return floor_on ? mx8_block_floor(v, q32) : noclamp_on ? mx8_block_noclamp(v, q32) : mx8_quantize_block(v, q32);
}
// route_key with ties to the higher id, or keying every NaN as the canonical +NaN (the sign
// R4.10 gives it dropped).
K4_HD int32_t route_key_ties_high(float v, int e) {
  int32_t b = int32_t(f32_bits(canon_nan(v)));
  b = b < 0 ? (b ^ 0x7FFFFFFF) : b;
  return int32_t(uint32_t(b) & 0xFFFFFF80u) | e;
}
K4_HD int32_t route_key_canon_nan(float v, int e) {
  int32_t b = int32_t(f32_bits(canon_nan(v)));
  b = b < 0 ? (b ^ 0x7FFFFFFF) : b;
  return int32_t(uint32_t(b) & 0xFFFFFF80u) | (127 - e);
}
// The value a route key was made from (its bucket's lowest code): the biased score.
K4_HD float route_key_value(int32_t key) {
  int32_t b = int32_t(uint32_t(key) & 0xFFFFFF80u);
  b = b < 0 ? (b ^ 0x7FFFFFFF) : b;
  return f32_from_bits(uint32_t(b));
}
// swiglu with one of its mistakes: 0 u clamped one-sided, 1 the clamp after the multiply,
// 2 NaN-dropping min / max, 3 SiLU (no 1.702).
K4_HD float fmin_drop_nan(float a, float b) { return is_nan(a) ? b : (is_nan(b) ? a : (a < b ? a : b)); }
K4_HD float fmax_drop_nan(float a, float b) { return is_nan(a) ? b : (is_nan(b) ? a : (a > b ? a : b)); }
K4_HD float swiglu_wrong(int which, float g, float u, float limit) {
  if (which == 0) {
    const float gp = -fmax_ieee(-g, -limit), up = fmin_ieee(u, limit);
    return (gp * sigmoid_approx(1.702f * gp)) * (up + 1.0f);
  }
  if (which == 1) {
    const float y = (g * sigmoid_approx(1.702f * g)) * (u + 1.0f);
    return fmin_ieee(fmax_ieee(y, -limit), limit);
  }
  if (which == 2) {
    const float gp = fmin_drop_nan(g, limit), up = fmin_drop_nan(fmax_drop_nan(u, -limit), limit);
    return (gp * sigmoid_approx(1.702f * gp)) * (up + 1.0f);
  }
  const float gp = -fmax_ieee(-g, -limit), up = fmin_ieee(fmax_ieee(u, -limit), limit);
  return (gp * sigmoid_approx(gp)) * (up + 1.0f);
}

}  // namespace k4::mut
