// main.cpp -- the installed k4 from another project: a tiny step of the synthetic layer.
#include <cstdio>

#include "golden/format/schema.hpp"
#include "golden/inputs/scenario.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/model.hpp"
#include "reference/numerics/bf16.hpp"

int main() {
  const k4::Config cfg = k4::preset("tiny");
  const k4::LayerWeights w = k4::synth::synthetic_layer(cfg, 1);
  k4::Scenario s;
  s.tokens = 2;
  s.context = {"300"};
  const k4::StepInputs in = k4::make_inputs(cfg, s, 1, &w);
  const k4::StepResult r = k4::run_step(w, in);
  const float v = k4::bf16_to_f32(r.ranks[0].ar_out[0]);
  std::printf("k4 consumer: %s, tp %d, ar_out[0] = %g (%s)\n", cfg.name.c_str(), cfg.tp, double(v), k4::golden::tool_version().c_str());
  return r.ranks.size() == size_t(cfg.tp) ? 0 : 1;
}
