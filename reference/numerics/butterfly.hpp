// butterfly.hpp -- the seed's xor-butterfly reductions, lane by lane.
//
// butterfly(v, offsets, op): for each offset in the order given, lane i becomes
// op(v[i], v[i ^ off]). With the seed's ops (IEEE add, fmax_ieee) every lane ends with the
// same value, but which values meet which is the tree the offsets spell: the model must use
// the same tree as the kernel. wave_sum / wave_max use (32, 16, 8, 4, 2, 1) over 64 lanes.
#pragma once
#include "reference/numerics/hd.hpp"
#include "reference/numerics/policy.hpp"

namespace k4 {

constexpr int kWaveLanes = 64;  // an AMD wave; the kernel emulates it on 32-lane warps

// v: `lanes` values; offsets: `n_off` xor distances, each < lanes.
template <class T, class Op>
K4_HD void butterfly(T* v, int lanes, const int* offsets, int n_off, Op op) {
  T tmp[kWaveLanes];
  for (int o = 0; o < n_off; ++o) {
    const int off = offsets[o];
    for (int i = 0; i < lanes; ++i) tmp[i] = op(v[i], v[i ^ off]);
    for (int i = 0; i < lanes; ++i) v[i] = tmp[i];
  }
}

struct AddF32 { K4_HD float operator()(float a, float b) const { return a + b; } };
struct MaxF32 { K4_HD float operator()(float a, float b) const { return fmax_ieee(a, b); } };
struct AddI32 { K4_HD int32_t operator()(int32_t a, int32_t b) const { return int32_t(uint32_t(a) + uint32_t(b)); } };
struct MaxI32 { K4_HD int32_t operator()(int32_t a, int32_t b) const { return a > b ? a : b; } };

// The butterfly's value at lane 0 over `n` = 2^k consecutive lanes with offsets n/2 .. 1
// (the tree of butterfly(v, (n/2, ..., 1)) restricted to one group): the reduction used for
// the 16-lane head maxima and sums of the split stage.
template <class Op>
K4_HD float group_reduce(const float* vals, int n, Op op) {
  float v[kWaveLanes];
  for (int i = 0; i < n; ++i) v[i] = vals[i];
  for (int off = n / 2; off >= 1; off /= 2)
    for (int i = 0; i < off; ++i) v[i] = op(v[i], v[i + off]);
  return v[0];
}

// The seed's wave_sum / wave_max over 64 lanes (offsets 32 .. 1): the common value.
K4_HD float wave_sum(const float* lanes64) { return group_reduce(lanes64, kWaveLanes, AddF32{}); }
K4_HD float wave_max(const float* lanes64) { return group_reduce(lanes64, kWaveLanes, MaxF32{}); }

}  // namespace k4
