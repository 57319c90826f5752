// cmd_synth.cpp -- k4 synth: a deterministic synthetic checkpoint (MXFP4 experts, FP8 o_proj).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "golden/io/atomic_file.hpp"
#include "golden/inputs/synth.hpp"
#include "golden/inputs/synth_release.hpp"
#include "reference/config.hpp"
#include "tools/commands.hpp"
#include "tools/progress.hpp"

namespace k4::tools {

namespace {
struct SynthOpt {
  std::string preset, out, layout, size = "small";
  int tp = -1, layer = 0;
  uint64_t seed = 1;
  bool force = false, progress = false;
};

int write_layout(const SynthOpt& o) {
  if (!o.preset.empty()) throw std::invalid_argument("--layout excludes --preset (the layout's --size gives the shapes)");
  synth::ReleaseOptions r;
  r.layout = synth::layout_from(o.layout);
  r.full = o.size == "full";
  r.tp = o.tp;
  r.seed = o.seed;
  const Config cfg = synth::release_config(r);
  const auto t0 = std::chrono::steady_clock::now();
  Progress bar("synth", o.progress);
  synth::write_release(o.out, r, o.force, [&](uint64_t d, uint64_t t) { bar.update(d, t); });
  bar.finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(o.out)) bytes += e.file_size();
  std::printf("wrote %s: %s layout, %s (hidden %d, %d experts, tp %d), seed %llu, %llu bytes (%.2f GB) in %.1f s\n",
              o.out.c_str(), o.layout.c_str(), o.size.c_str(), cfg.hidden, cfg.n_routed, cfg.tp,
              (unsigned long long)o.seed, (unsigned long long)bytes, double(bytes) / 1e9, s);
  return 0;
}

}  // namespace

Run add_synth(CLI::App& app) {
  auto o = std::make_shared<SynthOpt>();
  app.add_option("--preset", o->preset, "config preset (minimax-m3-tp4, small, tiny): the single-file k4 form");
  app.add_option("--layout", o->layout,
                 "a directory in a release's layout instead: bf16 (MiniMax-M3), mxfp8 (MiniMax-M3-MXFP8), mxfp4 "
                 "(amd/MiniMax-M3-MXFP4)")
      ->check(CLI::IsMember({"bf16", "mxfp8", "mxfp4"}));
  app.add_option("--size", o->size, "with --layout: small (hidden 2048, 8 experts, tp 2) or full (minimax-m3-tp4)")
      ->check(CLI::IsMember({"small", "full"}));
  app.add_option("--tp", o->tp, "tensor-parallel ranks (1, 2, 4, 8; default: the preset's)");
  app.add_option("--seed", o->seed, "weight seed (default 1)")->check(non_negative_integer());
  app.add_option("--layer", o->layer, "layer index in the tensor names (default 0; not with --layout: layers 0..4)")->check(CLI::NonNegativeNumber);
  app.add_option("--out", o->out, "output .safetensors file (with --layout: the directory)")->required();
  app.add_flag("--force", o->force, "overwrite an existing output");
  app.add_flag("--progress", o->progress, "show progress even when stderr is not a terminal");
  app.footer(
      "Streams the file in 16 MiB chunks (never whole in memory). The full-size preset at TP 4 is\n"
      "about 3.9 GB. The same seed gives the same bytes; `k4 golden --checkpoint FILE` and the\n"
      "embedded synthetic default (no --checkpoint, same --weight-seed) give the same golden.");
  return [o]() {
    if (!o->layout.empty()) return write_layout(*o);
    if (o->preset.empty()) throw std::invalid_argument("--preset or --layout is required");
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
