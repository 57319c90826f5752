// keys.hpp -- the seed's integer sort keys and its swiglu, shared by the model and the kernels.
//
//  - index_key (seed index_key): a block's score as a signed-orderable int; blocks below
//    init_blocks pinned to 1e30, the last local_blocks to 1e29; -0 as +0; NaN below -Inf.
//  - route_key (seed route_key): the score's orderable bits with the low 7 replaced by
//    127 - e (a tie goes to the lower expert); a NaN score keys as the canonical +NaN.
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
  // NaN enters as the canonical NaN: its payload differs between CPUs and GPUs
  int32_t b = int32_t(f32_bits(canon_nan(v)));
  b = b < 0 ? (b ^ 0x7FFFFFFF) : b;
  return int32_t(uint32_t(b) & 0xFFFFFF80u) | (127 - e);
}

K4_HD float swiglu(float g, float u, float limit) {
  const float gp = -fmax_ieee(-g, -limit);                  // min(g, L), NaN-propagating
  const float up = fmin_ieee(fmax_ieee(u, -limit), limit);  // clamp(u, -L, L)
  const float sg = sigmoid_approx(1.702f * gp);             // 1.702 * g' rounded to f32 first
  return (gp * sg) * (up + 1.0f);
}

}  // namespace k4
