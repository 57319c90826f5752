// cmd_synth.cpp -- k4 synth: a deterministic synthetic checkpoint (MXFP4 experts, FP8 o_proj).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "golden/io/atomic_file.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/config.hpp"
#include "tools/commands.hpp"
#include "tools/progress.hpp"

namespace k4::tools {

Run add_synth(CLI::App& app) {
  struct Opt {
    std::string preset, out;
    int tp = -1, layer = 0;
    uint64_t seed = 1;
    bool force = false, progress = false;
  };
  auto o = std::make_shared<Opt>();
  app.add_option("--preset", o->preset, "config preset (minimax-m3-tp4, small, tiny)")->required();
  app.add_option("--tp", o->tp, "tensor-parallel ranks (1, 2, 4, 8; default: the preset's)");
  app.add_option("--seed", o->seed, "weight seed (default 1)")->check(non_negative_integer());
  app.add_option("--layer", o->layer, "layer index in the tensor names (default 0)")->check(CLI::NonNegativeNumber);
  app.add_option("--out", o->out, "output .safetensors file")->required();
  app.add_flag("--force", o->force, "overwrite an existing output");
  app.add_flag("--progress", o->progress, "show progress even when stderr is not a terminal");
  app.footer(
      "Streams the file in 16 MiB chunks (never whole in memory). The full-size preset at TP 4 is\n"
      "about 3.9 GB. The same seed gives the same bytes; `k4 golden --checkpoint FILE` and the\n"
      "embedded synthetic default (no --checkpoint, same --weight-seed) give the same golden.");
  return [o]() {
    const Config cfg = preset(o->preset, o->tp);
    check_output(o->out, o->force);
    const auto t0 = std::chrono::steady_clock::now();
    Progress bar("synth", o->progress);
    synth::write_checkpoint(o->out, cfg, o->seed, o->layer, o->force,
                            [&](uint64_t d, uint64_t t) { bar.update(d, t); });
    bar.finish();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t bytes = std::filesystem::file_size(o->out);
    std::printf("wrote %s: %s tp %d seed %llu, %llu bytes (%.2f GB) in %.1f s\n", o->out.c_str(), cfg.name.c_str(),
                cfg.tp, (unsigned long long)o->seed, (unsigned long long)bytes, double(bytes) / 1e9, s);
    return 0;
  };
}

}  // namespace k4::tools
