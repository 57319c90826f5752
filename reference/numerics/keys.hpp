// keys.hpp -- the seed's integer sort keys and its swiglu, shared by the model and the kernels.
//
//  - index_key (seed index_key): a block's score as a signed-orderable int; blocks below
//    init_blocks pinned to 1e30, the last local_blocks to 1e29; -0 as +0; NaN below -Inf.
//  - route_key (seed route_key): the score's orderable bits with the low 7 replaced by
//    127 - e (a tie goes to the lower expert); a NaN as the canonical NaN of its sign.
//    route_key_of(sig, bias, e): the NaN the seed's key sees (a NaN sig keys as -NaN, last).
//  - swiglu (seed swiglu_mul_batch(g, u, -limit)): g' = min(g, L), u' = clamp(u, -L, L),
//    (g' * sigmoid(f32(1.702) * g')) * (u' + 1), min/max NaN-propagating.
#pragma once
#include "reference/numerics/hd.hpp"
#include "reference/numerics/policy.hpp"

namespace k4 {

K4_HD int32_t index_key_bits(int b, float score, int n_blk, int init_blocks, int local_blocks) {
  float sc = score;
  if (b < init_blocks) sc = 1e30f;
  if (b >= n_blk - local_blocks) sc = 1e29f;
  int32_t bits = int32_t(f32_bits(sc));
  if (bits == INT32_MIN) bits = 0;  // -0 as +0
  const int32_t key = bits < 0 ? (bits ^ 0x7FFFFFFF) : bits;
  return (bits & 0x7FFFFFFF) > 0x7F800000 ? INT32_MIN : key;  // NaN below -Inf
}

K4_HD int32_t route_key(float v, int e) {
  // a NaN enters as the canonical NaN of its sign: its payload differs between CPUs and GPUs,
  // its sign is what the seed's bits keep (+NaN above +Inf, -NaN below -Inf)
  int32_t b = int32_t(is_nan(v) ? ((f32_bits(v) & 0x80000000u) | 0x7FC00000u) : f32_bits(v));
  b = b < 0 ? (b ^ 0x7FFFFFFF) : b;
  return int32_t(uint32_t(b) & 0xFFFFFF80u) | (127 - e);
}

// The key of expert e as the seed's route_key (seed:L1465-L1466) takes sc + bias, with
// the NaN that reaches it: sc = rcp(1 + exp2(-bf16(logit) * LOG2E)) is NaN only for a NaN
// logit, which the model holds as the canonical +NaN; the seed negates it before exp2, and
// mul, exp2, add, rcp and the bias add carry the NaN operand's sign (docs/numerics.md P7), so
// the key is that of -NaN, below -Inf: the expert is picked last. A NaN bias with a number
// sc reaches the key as the bias's own NaN (a checkpoint's +NaN: picked first).
K4_HD int32_t route_key_of(float sig, float bias, int e) {
  if (is_nan(sig)) return route_key(f32_from_bits(0xFFC00000u), e);
  if (is_nan(bias)) return route_key(bias, e);
  return route_key(sig + bias, e);
}

K4_HD float swiglu(float g, float u, float limit) {
  const float gp = -fmax_ieee(-g, -limit);                  // min(g, L), NaN-propagating
  const float up = fmin_ieee(fmax_ieee(u, -limit), limit);  // clamp(u, -L, L)
  const float sg = sigmoid_approx(1.702f * gp);             // 1.702 * g' rounded to f32 first
  return (gp * sg) * (up + 1.0f);
}

}  // namespace k4
