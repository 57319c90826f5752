// golden_run.hpp -- a golden's inputs through the device kernels into a dump (k4_device run).
//
// The golden's shared inputs, every rank's q and KV pages, and its stored weights (o_proj,
// router, and the experts it stores: those of its own routing) go to the device; every stage
// runs on the GPU (gpu::Runner, every TP rank on the one device); every intermediate is
// written to a dump in the golden schema (golden::write_dump), which `k4 diff GOLDEN DUMP`
// compares bit for bit, stage by stage.
//
// When the device's routing picks an expert the golden does not store (the router or the
// route differs from the golden's), the MoE stage cannot run: the step is re-run through the
// router, the dump holds stages index .. router, and the result says why (moe_skipped).
#pragma once
#include <string>

#include "device/runner.hpp"

namespace k4::gpu {

struct GoldenRunOptions {
  std::string golden;     // the golden file (its inputs and weights)
  std::string dump;       // the dump to write (atomically)
  bool overwrite = false; // replace an existing dump
  RunOptions run;         // the all-reduce form; last_stage
};

struct GoldenRunResult {
  Config cfg;
  int tokens = 0;
  int last_stage = 5;       // the last stage the dump holds
  std::string moe_skipped;  // why the MoE stage did not run (empty: it ran)
  double seconds = 0;       // the device step, uploads and downloads included
};

// Throws golden::FormatError / std::invalid_argument for an unusable golden or output path
// (checked before the device runs), std::runtime_error from the device runtime.
GoldenRunResult run_golden(const GoldenRunOptions& opt);

}  // namespace k4::gpu
