// golden_run.cpp -- see golden_run.hpp.
#include "device/tools/golden_run.hpp"

#include <chrono>
#include <string>
#include <vector>

#include "golden/io/atomic_file.hpp"
#include "golden/diff/compare.hpp"
#include "golden/format/schema.hpp"

namespace k4::gpu {

GoldenRunResult run_golden(const GoldenRunOptions& opt) {
  { AtomicOutput probe(opt.dump, opt.overwrite); }  // a bad output path fails before the device runs
  const golden::GoldenReader g(opt.golden);
  GoldenRunResult res;
  res.cfg = g.config();
  res.tokens = g.tokens();
  const StepInputs in = g.inputs();
  const LayerWeights lw = g.weights();
  const auto t0 = std::chrono::steady_clock::now();
  Runner runner(lw);
  StepResult out;
  RunOptions ro = opt.run;
  try {
    out = runner.run_step(in, ro);
  } catch (const ExpertUnavailable& e) {
    res.moe_skipped = e.what();
    ro.last_stage = 4;
    out = runner.run_step(in, ro);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.last_stage = ro.last_stage;
  golden::DumpSelection sel;
  for (int s = 0; s <= ro.last_stage; ++s) sel.stages.push_back(golden::stage_names()[size_t(s)]);
  golden::write_dump(opt.dump, res.cfg, res.tokens, out, sel, opt.overwrite);
  return res;
}

}  // namespace k4::gpu
