// fuzz_scenario.cpp -- libFuzzer target: the scenario JSON parser (golden/inputs/scenario.hpp) and
// the config JSON parser (config_from_json, golden/format/schema.hpp), then the step inputs built
// from what they accept.
//
// Feeds: the input is SCENARIO_JSON, optionally followed by a NUL byte and CONFIG_JSON.
//  1. scenario_from_json(SCENARIO_JSON); when it parses, scenario_to_json must give JSON
//     that parses back to the same scenario.
//  2. config_from_json(CONFIG_JSON) when given; when it parses, config_to_json round-trips.
//  3. The config: the parsed one, else the tiny preset at TP 1. apply_scenario,
//     validate_scenario; when they accept, scenario_seq_lens and make_inputs (with the
//     synthetic tiny layer for repeated_expert), whose inputs validate_inputs (the model's
//     own check) must accept, with the same seq_lens.
//  Speed: cache_blocks is capped at 64 before make_inputs (the parser's own cap bounds the
//  memory; allocating it on every input would only slow the fuzzer down).
// Not a finding: std::invalid_argument from the parsers and validate_scenario /
// apply_scenario (bad input, exit 2).
// Findings: crashes, ASan / UBSan reports (a float-to-int overflow, a division by zero),
// any other exception (std::out_of_range, a JSON library exception, bad_alloc), a scenario
// validate_scenario accepts but make_inputs or validate_inputs refuses, a round trip that
// changes the value, hangs (-timeout), huge allocations (-rss_limit_mb / -malloc_limit_mb).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "golden/inputs/scenario.hpp"
#include "golden/format/schema.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/model.hpp"
#include "tests/fuzz/fuzz_common.hpp"

using namespace k4;

namespace {

const Config& tiny1() {
  static const Config c = preset("tiny", 1);
  return c;
}
const LayerWeights& tiny1_weights() {
  static const LayerWeights w = synth::synthetic_layer(tiny1(), 1);
  return w;
}

void run_scenario(const Scenario& s0, const Config& base, bool with_weights) {
  Scenario s = s0;
  Config cfg = base;
  if (!fuzz::expect_clean("apply_scenario", fuzz::kInvalidArgument, [&] { apply_scenario(s, cfg); })) return;
  if (!fuzz::expect_clean("validate_scenario", fuzz::kInvalidArgument, [&] { validate_scenario(s, cfg); })) return;
  // Accepted: everything below must work.
  fuzz::expect_clean("make_inputs", 0, [&] {
    const std::vector<int32_t> seq = scenario_seq_lens(cfg, s, 1);
    s.cache_blocks = std::min(s.cache_blocks, 64);
    const StepInputs in = make_inputs(cfg, s, 1, with_weights ? &tiny1_weights() : nullptr);
    validate_inputs(in, cfg);
    if (in.shared.seq_lens != seq) fuzz::finding("make_inputs", "seq_lens differ from scenario_seq_lens");
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string scn_text = all.substr(0, nul);
  const bool has_cfg = nul != std::string::npos;
  const std::string cfg_text = has_cfg ? all.substr(nul + 1) : std::string();

  Config cfg = tiny1();
  bool custom = false;
  if (has_cfg) {
    custom = fuzz::expect_clean("config_from_json", fuzz::kInvalidArgument,
                                [&] { cfg = golden::config_from_json(cfg_text, "fuzz config"); });
    if (custom) {
      fuzz::expect_clean("config round trip", 0, [&] {
        const std::string j = golden::config_to_json(cfg);
        if (golden::config_to_json(golden::config_from_json(j, "round trip")) != j)
          fuzz::finding("config round trip", "config_to_json / config_from_json change " + j);
      });
    } else {
      cfg = tiny1();
    }
  }

  Scenario s;
  if (!fuzz::expect_clean("scenario_from_json", fuzz::kInvalidArgument,
                          [&] { s = scenario_from_json(scn_text, "fuzz scenario"); }))
    return 0;
  fuzz::expect_clean("scenario round trip", 0, [&] {
    const std::string j = scenario_to_json(s);
    if (scenario_to_json(scenario_from_json(j, "round trip")) != j)
      fuzz::finding("scenario round trip", "scenario_to_json / scenario_from_json change " + j);
  });
  run_scenario(s, cfg, !custom);
  return 0;
}
