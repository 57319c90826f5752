// fixtures.hpp -- seeded random layers and decode steps for the CPU suite (test support only;
// the product's synthetic checkpoint and scenarios live in golden/).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/weights.hpp"

namespace k4::test {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1p-53; }  // [0, 1)
  double normal();                                             // N(0, 1)
  int below(int n) { return int(next() % uint64_t(n)); }
};

LayerWeights random_layer(const Config& cfg, uint64_t seed);

struct StepSpec {
  int tokens = 1;
  std::vector<int> seq_lens;  // one a token, or one for all
  int q_len = 1;
  uint64_t seed = 1;
};
StepInputs random_step(const Config& cfg, const StepSpec& spec);

}  // namespace k4::test
