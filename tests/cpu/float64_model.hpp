// float64_model.hpp -- an independent, plain float64 model of every K4 stage, and the
// comparisons that guard the bit-exact reference against being exactly wrong.
//
// Each check takes the inputs a stage gets (the model's own upstream outputs, so errors do not
// compound), computes the stage in double from values decoded here by value (not with
// reference/numerics), and compares the model's outputs with an error bound that the
// quantization and f32 arithmetic explain. u = 2^-24 (f32 unit roundoff). The bounds, stage by
// stage (derivations next to each check in float64_model.cpp):
//   index      exact: blocks ranked by value (pinned 1e30 / 1e29, NaN last, -0 == +0, ties to
//              the higher id), the tail last, n_ctx; long rows equal ranking.
//   q8         exact: the nearest E4M3 of q (ties to even; beyond 464 the NaN code).
//   split m    |s32 - s64| <= 2.01u|s| + 4.01u|sm ks| sum|q k| per key (4 block roundings +
//              3 adds, then 2 products); max is 1-Lipschitz.
//   split l    p within e^eps - 1 of exp(s - m), eps = ds + dm + |s - m|(2u + e_log2e) + 2u
//              (exp2 within 1 ulp); 12 adds of positives: 12.01u l.
//   split o    sharp: the f64 model quantizes P itself (nearest E4M3 of p vs 448/(vmax+1e-8));
//              a key whose f32 p could round to the neighbouring code (x within its f32
//              error of a midpoint) adds that code step times |V|; plus 8.01u sum|P V| (8
//              wave blocks), the l error, 4u + e_1/448 (pscale, 1/l, 2 products), and bf16's
//              half ulp 2^-8 |o|. loose: against exact softmax attention sum p vs V / l, each
//              P8 within max(2^-4 x, 2^-10) (E4M3's half ulp, normal / subnormal), plus the
//              1e-8 / vmax bias of fscale and the terms above.
//              split.kv_scale = static448 (V4.2): x = 448 p, pscale = v_scale / 448, no
//              bias; atom_vllm (V4.3) is not covered by this check.
//   merge a    sl_i within |m_i - gm|(2u + e_log2e) + 4u; gs 7 adds; w 1 division; 9 rounded
//              products / adds; bf16 half ulp.
//   attn8      the nearest E4M3 of a / x_scale up to the 2u of rcp and the product (exact
//              unless within 2u of a tie); x_scale = amax / 448 within 2.01u.
//   o_proj     exact double dot (E4M3 x E4M3 products sum exactly in 53 bits); the model's
//              (16 + 5) roundings of u over sum|w x|, 2 products, bf16 half ulp.
//   all-reduce W adds of u over sum|p|, bf16 half ulp; W = 1 without the 0 start: identity.
//              Where sum|p| reaches f32's range an Inf (or Inf - Inf) result is IEEE's and
//              counted as skipped, not compared.
//   h_mid      one add, bf16 half ulp.
//   rstd       0.5 (re + 13 + 4)u relative (fma chain, 6-level tree, 7 wave adds, v, /, +eps),
//              rsq 2u.
//   xn         rstd's error + 4u, bf16 half ulp.
//   xn8 / mid8 exact: E8M0 = clamp(ceil(log2(f32(amax * f32(1/448)))) + 127, 1, 254) and the
//              nearest E4M3 of f32(v * 2^(127 - e)) clamped to +-448.
//   logit      (2 hidden/512 + 8) roundings of u over sum|g x| (fdot2 = 2 fma, 2 + 6 levels).
//   sig        sigmoid' <= s(1-s) times (logit error + bf16(logit)'s 2^-8 + the f32 steps).
//   route      exact: top 4 by score bucket (the top 25 bits of the orderable int), lower id
//              first; weights 6u relative.
//   gate / up  exact double from decoded MXFP4 x MXFP8 (E2M1 x E4M3 x 2^k is exact); the
//              model's (1 + blocks a wave + 8) roundings of u over sum|w x|.
//   mid        swiglu in double from the model's g, u: the f32 steps' (1 - s)(|x|(2u +
//              e_1.702 + e_log2e) + 2u) + 5u relative, |g'(u' + 1)| 2^-126 absolute where the
//              sigmoid underflows (e^-x past f32's range), bf16 half ulp.
//   down       exact double of sum_slot w sum mid8 x w2; (4 + 1 + chain + 8) roundings of u
//              over sum|terms|, bf16 half ulp.
//   ar_out     as all-reduce.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/model.hpp"
#include "reference/weights.hpp"

namespace k4::f64 {

constexpr double kU = 0x1p-24;  // f32 unit roundoff

// ---- formats by value (independent of reference/numerics) ---------------------------------
double bf16(uint16_t bits);
double e4m3(uint8_t code);     // NaN for S.1111.111
double e2m1(uint8_t nibble);   // low nibble
double e8m0(uint8_t code);     // NaN for 0xFF
// The E4M3 code nearest to x by value, ties to the even code. |x| beyond 464: 448 with
// saturate, else the NaN code of x's sign; NaN -> 0x7F.
uint8_t e4m3_nearest(double x, bool saturate);
// The bf16 nearest to x by value, ties to even; overflow to +-Inf; NaN -> 0x7FC0.
uint16_t bf16_nearest(double x);
// f32 rounding of a double (for the few places the model's f32 values are reproduced).
inline double f32(double x) { return double(float(x)); }

// ---- comparisons ---------------------------------------------------------------------------
// One compared tensor: counts, worst error / bound ratio, the first violations as text.
struct Cmp {
  std::string name;
  size_t n = 0, bad = 0, nonzero = 0, nan = 0, skipped = 0;  // skipped: not comparable, reported
  double max_err = 0, max_ratio = 0, worst_bound = 0, worst_want = 0, worst_got = 0;
  double sum_bound = 0, sum_want = 0;  // over the bounded compares: how tight the bound is
  size_t worst = 0;
  std::vector<std::string> first_bad;
  explicit Cmp(std::string nm = "") : name(std::move(nm)) {}
  // |got - want| <= bound (NaN must meet NaN, Inf the same Inf).
  void near(size_t i, double got, double want, double bound);
  void exact(size_t i, double got, double want) { near(i, got, want, 0.0); }
  bool ok() const { return bad == 0; }
  double mean_rel_bound() const { return sum_want > 0 ? sum_bound / sum_want : 0.0; }
  std::string summary() const;
  void merge(const Cmp& o);
};
using Report = std::vector<Cmp>;
// Merges reports tensor by tensor (by name).
void merge_into(Report& into, const Report& r);
bool all_ok(const Report& r);
std::string describe(const Report& r);
const Cmp* find(const Report& r, const std::string& name);

// First few mismatching elements of two bit tensors, as text ("" when equal).
std::string first_mismatches(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int max_report = 4);
std::string diff_step(const StepResult& a, const StepResult& b);  // "" when every output bit agrees

// ---- the stages ----------------------------------------------------------------------------
// Stage 0: selection by value (long rows too), the sparse table, n_ctx, long_row.
// scores: the rank's (S, score_width) index scores.
Report check_index(const Config& cfg, const StepShared& sh, const std::vector<float>& scores, const IndexOut& idx);
// Stage 1: q8, m, l, o (sharp and loose bounds), from the model's sparse table and q8.
Report check_split(const Config& cfg, const StepShared& sh, const StepRank& rk, const IndexOut& idx, const SplitOut& sp);
// Stage 2: attn (bf16), x_scale, attn8.
Report check_merge(const Config& cfg, const SplitOut& sp, const MergeOut& mg, int tokens);
// Stage 3: the partial rows.
Report check_oproj(const Config& cfg, const MergeOut& mg, const RankWeights& w, const OprojOut& op, int tokens);
// A rank-ordered all-reduce: out[dst] against the double sum of the bf16 partials.
Report check_all_reduce(const std::string& name, const std::vector<const std::vector<uint16_t>*>& partials,
                        const std::vector<const std::vector<uint16_t>*>& out, bool zero_start);
Report check_residual(const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in, const std::vector<uint16_t>& h_mid);
// Stage 4: rstd, xn, xn8 / xsc, logit, sig.
Report check_router(const Config& cfg, const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in,
                    const RankWeights& w, const RouterOut& r, int tokens);
// Stage 5: routing picks and weights.
Report check_route(const Config& cfg, const RouterOut& r, const RankWeights& w, const RouteOut& ro, int tokens);
// Stage 5: gate / up GEMVs of every slot.
Report check_up_gate(const Config& cfg, const RouteOut& ro, const RouterOut& r, const ExpertSource& src, int rank,
                     const MoeOut& moe, int tokens);
// Stage 5: swiglu (from the model's gate / up) and the mid MXFP8.
Report check_mid(const Config& cfg, const MoeOut& moe, int tokens);
// Stage 5: the down partial rows (narrow or wide by cfg.wide(tokens)).
Report check_down(const Config& cfg, const RouteOut& ro, const ExpertSource& src, int rank, const MoeOut& moe, int tokens);
// Shared MXFP8 rule: blocks of 32 of `vals` (bf16) against codes / scale bytes.
Report check_mxfp8(const std::string& name, const std::vector<uint16_t>& vals, const std::vector<uint8_t>& codes,
                   const std::vector<uint8_t>& scales);
// Swiglu in double (NaN / Inf as the seed's formula gives them).
double swiglu(double g, double u, double limit);

// Every stage of every rank of a run (ranks checked in parallel, reports merged in rank order).
Report check_step(const LayerWeights& w, const StepInputs& in, const StepResult& res);

// ---- test support shared by the stage / property / float64 / model tests -----------------
// Seeded random layers are slow to make (tens of millions of draws at full size): one per
// (preset, tp, seed), kept for the binary's lifetime.
const LayerWeights& cached_layer(const std::string& preset, int tp, uint64_t seed);

}  // namespace k4::f64
