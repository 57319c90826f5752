// model_mutants.hpp -- mutants of the reference model: the semantic mistakes a model can make
// (routing, the swiglu form, the norm form, the LSE merge, the selection order) and a few that
// change only bits, each at one K4_MODEL_MUTANT_ON site in reference/stages/*.cpp.
//
// The bit-exact suites cannot judge the model (it is their reference); the independent float64
// guard (tests/cpu/float64_model.cpp, suite float64) and the property tests (properties,
// properties_index) must kill every mutant that changes meaning. A mutant that only changes
// bits (an order, a rounding) stays within the guard's error bounds and must survive them:
// `survives` says why. ctest runs each (k4_model_mutants/N: killed ones must fail the suites,
// the others pass); docs/gpu-verification.md "Mutants" has the table.
//
//   production builds        K4_MODEL_MUTANT_ON(N) is `false`: compiled out
//   -DK4_MODEL_MUTANTS       the executable k4_model_mutants: the mutant K4_MODEL_MUTANT (env)
#pragma once

#include <cstdint>
#include <cstdlib>

#include "reference/numerics/hd.hpp"
#include "reference/numerics/policy.hpp"

namespace k4 {

#if defined(K4_MODEL_MUTANTS)
inline int model_mutant() {
  static const int id = [] {
    const char* e = std::getenv("K4_MODEL_MUTANT");
    return e != nullptr ? std::atoi(e) : 0;
  }();
  return id;
}
#define K4_MODEL_MUTANT_ON(n) (::k4::model_mutant() == (n))
#else
#define K4_MODEL_MUTANT_ON(n) false
#endif

struct ModelMutantInfo {
  int id;
  const char* area;      // routing, swiglu, norm, merge, selection
  const char* what;      // the mistake
  const char* survives;  // "" (the float64 guard or a property test must kill it) or why it changes only bits
};

// clang-format off
inline constexpr ModelMutantInfo kModelMutants[] = {
  {1, "routing", "route weights from the biased score (the key's value) instead of sig", ""},
  {2, "routing", "route weights not renormalised: sig * route_scale", ""},
  {3, "routing", "route_scale applied to the shared expert's weight too", ""},
  {4, "routing", "top 4 by the unbiased sigmoid (keys without the bias)", ""},
  {5, "swiglu", "SiLU form: sigmoid(g') instead of sigmoid(1.702 g')", ""},
  {6, "swiglu", "u clamped one-sided: min(u, L) instead of clamp(u, -L, L)", ""},
  {7, "swiglu", "1.702 g' in double, rounded once with the sigmoid's argument", "one rounding of 1.702 g' less: within the guard's e_1.702 term"},
  {8, "norm", "RMSNorm x * rstd * g instead of Gemma's x * rstd * (1 + g)", ""},
  {9, "norm", "rstd = rsq((ss + eps) / HIDDEN) instead of rsq(ss / HIDDEN + eps)", ""},
  {10, "norm", "sum of squares: waves summed from the last", "an order of 8 f32 adds: within the guard's 7-add term of rstd"},
  {11, "merge", "LSE weights exp2(m_i - gm) without log2(e)", ""},
  {12, "merge", "partition weights sl_i not divided by gs", ""},
  {13, "merge", "partitions merged from the last to the first", "an order of 8 products' adds: within the guard's 9-rounding term of the merge"},
  {14, "selection", "score ties go to the lower block id", ""},
  {15, "selection", "the tail block keeps its rank slot instead of the last one", ""},
};
// clang-format on

// The value a route key was made from (its bucket's lowest code): the biased score.
K4_HD float model_route_key_value(int32_t key) {
  int32_t b = int32_t(uint32_t(key) & 0xFFFFFF80u);
  b = b < 0 ? (b ^ 0x7FFFFFFF) : b;
  return f32_from_bits(uint32_t(b));
}

// swiglu with mutant 5, 6 or 7's mistake (which = the mutant id).
K4_HD float model_swiglu_wrong(int which, float g, float u, float limit) {
  const float gp = -fmax_ieee(-g, -limit);
  const float up = which == 6 ? fmin_ieee(u, limit) : fmin_ieee(fmax_ieee(u, -limit), limit);
  const float x = which == 5 ? gp : which == 7 ? float(1.702 * double(gp)) : 1.702f * gp;
  return (gp * sigmoid_approx(x)) * (up + 1.0f);
}

}  // namespace k4
