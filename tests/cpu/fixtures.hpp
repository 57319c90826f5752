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

// One decode token of seq_len keys for the split stage's hand-worked cases: block b's table
// entry is b (its pages 16b + j: kv_page_stride 16), every index score 0 (a short context selects blocks in
// id order), q = +0, and both caches all NaN bytes (E4M3 0x7F), so a key the contract masks
// and the model reads anyway shows up as a NaN. The scales are the caller's (per key or one a
// cache, by the KV-scale mode under test).
void one_token_split_step(const Config& cfg, int seq_len, StepShared& sh, StepRank& rk);

}  // namespace k4::test
