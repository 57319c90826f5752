// k4_device.cpp -- the device runner's command line: benchmark and quick checks on the GPU.
//
//   k4_device bench [--preset minimax-m3-tp4] [--tp 4] [--tokens 1,4,16] [--seq 20000]
//                   [--warmup 3] [--repeats 20] [--md FILE]
//       each stage's kernels of one synthetic step (seeded fixtures) timed with events,
//       median of --repeats after --warmup, against the stage's HBM byte floor: the bytes it
//       must move over the device-to-device copy bandwidth measured in the same run.
//   k4_device check [--preset tiny] [--tp 2] [--tokens 5] [--seq 20000] [--seed 1]
//       one step on the device and in the reference; exit 1 on any mismatching field.
//
// Exit status: 0 ok, 1 a mismatch, 2 a usage or runtime error.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "device/runner.hpp"
#include "reference/model.hpp"
#include "tests/cpu/fixtures.hpp"

namespace {

using namespace k4;

std::vector<int> seq_for(int S, int seq) {
  std::vector<int> v(S);
  for (int k = 0; k < S; ++k) v[k] = seq + k;  // one request's consecutive positions
  return v;
}

int bench(const std::string& pname, int tp, const std::vector<int>& tokens, int seq, int warmup, int repeats,
          const std::string& md_path) {
  const Config cfg = preset(pname, tp);
  std::printf("k4_device bench: %s, preset %s, tp %d (all ranks on this GPU), seq %d\n", gpu::device_name().c_str(),
              pname.c_str(), tp, seq);
  const double bw = gpu::Runner::copy_bandwidth(size_t(1) << 30, 10);
  std::printf("device-to-device copy: %.0f GB/s (bytes read + written, 1 GiB, median of 10)\n", bw / 1e9);
  std::ostringstream md;
  md << "Device: " << gpu::device_name() << ". Preset " << pname << ", TP " << tp
     << " (every rank on the one GPU: the byte floors count every rank's weights), context " << seq
     << " keys a row (one request of S consecutive rows). Copy bandwidth " << int(bw / 1e9)
     << " GB/s (device-to-device memcpy, read + write). Times: median of " << repeats << " after " << warmup
     << " warm-up runs, CUDA events around each stage's launches.\n\n";
  md << "| S | stage | median us | min us | floor bytes | floor us | x floor |\n|---|---|---|---|---|---|---|\n";
  const LayerWeights lw = test::random_layer(cfg, 2024);
  gpu::Runner runner(lw);
  for (int S : tokens) {
    const StepInputs in = test::random_step(cfg, {S, seq_for(S, seq), S, uint64_t(S)});
    const std::vector<gpu::StageTime> times = runner.time_stages(in, warmup, repeats);
    double total = 0, total_floor = 0;
    for (const gpu::StageTime& t : times) {
      const double floor_us = t.bytes / bw * 1e6;
      total += t.median_us, total_floor += floor_us;
      std::printf("S=%2d %-15s %10.1f us (min %8.1f)  floor %10.0f B = %8.2f us  x%.1f\n", S, t.stage.c_str(), t.median_us,
                  t.min_us, t.bytes, floor_us, floor_us > 0 ? t.median_us / floor_us : 0.0);
      char row[256];
      std::snprintf(row, sizeof row, "| %d | %s | %.1f | %.1f | %.0f | %.2f | %.1f |\n", S, t.stage.c_str(), t.median_us,
                    t.min_us, t.bytes, floor_us, floor_us > 0 ? t.median_us / floor_us : 0.0);
      md << row;
    }
    char row[256];
    std::snprintf(row, sizeof row, "| %d | **all** | %.1f | | | %.2f | %.1f |\n", S, total, total_floor, total / total_floor);
    md << row;
    std::printf("S=%2d total %.1f us, floor %.2f us\n", S, total, total_floor);
  }
  if (!md_path.empty()) {
    std::ofstream f(md_path);
    f << md.str();
  }
  return 0;
}

int check(const std::string& pname, int tp, int S, int seq, uint64_t seed) {
  const Config cfg = preset(pname, tp);
  const LayerWeights lw = test::random_layer(cfg, seed);
  const StepInputs in = test::random_step(cfg, {S, seq_for(S, seq), 1, seed});
  const StepResult ref = run_step(lw, in);
  const StepResult dev = gpu::run_step(lw, in);
  // a compact field-by-field count (the suite prints the elements)
  int bad = 0;
  auto cmp = [&](const char* name, const auto& d, const auto& h) {
    size_t n = 0;
    for (size_t i = 0; i < std::min(d.size(), h.size()); ++i) n += d[i] != h[i];
    if (d.size() != h.size() || n) ++bad, std::printf("  %s: %zu of %zu differ\n", name, n, h.size());
  };
  for (int r = 0; r < tp; ++r) {
    const RankResult &d = dev.ranks[r], &h = ref.ranks[r];
    cmp("index.sparse_table", d.index.sparse_table, h.index.sparse_table);
    cmp("split.o", d.split.o, h.split.o);
    cmp("merge.attn8", d.merge.attn8, h.merge.attn8);
    cmp("oproj.partial", d.oproj.partial, h.oproj.partial);
    cmp("h_mid", d.h_mid, h.h_mid);
    cmp("router.key", d.router.key, h.router.key);
    cmp("moe.mid8", d.moe.mid8, h.moe.mid8);
    cmp("ar_out", d.ar_out, h.ar_out);
  }
  std::printf("k4_device check: %s tp %d S %d seq %d seed %llu: %s\n", pname.c_str(), tp, S, seq,
              (unsigned long long)seed, bad ? "MISMATCH" : "bit-exact");
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"k4_device: K4's stage kernels on the GPU"};
  app.require_subcommand(1);
  std::string bench_preset = "minimax-m3-tp4", check_preset = "tiny", md;
  int bench_tp = 4, check_tp = 2, bench_seq = 20000, check_seq = 20000, warmup = 3, repeats = 20, S = 5;
  uint64_t seed = 1;
  std::vector<int> tokens = {1, 4, 16};
  CLI::App* b = app.add_subcommand("bench", "time each stage against its HBM byte floor");
  b->add_option("--preset", bench_preset);
  b->add_option("--tp", bench_tp);
  b->add_option("--tokens", tokens)->delimiter(',');
  b->add_option("--seq", bench_seq);
  b->add_option("--warmup", warmup);
  b->add_option("--repeats", repeats);
  b->add_option("--md", md, "also write the table as markdown");
  CLI::App* c = app.add_subcommand("check", "one step on the device against the reference");
  c->add_option("--preset", check_preset);
  c->add_option("--tp", check_tp);
  c->add_option("--tokens", S);
  c->add_option("--seq", check_seq);
  c->add_option("--seed", seed);
  CLI11_PARSE(app, argc, argv);
  try {
    if (b->parsed()) return bench(bench_preset, bench_tp, tokens, bench_seq, warmup, repeats, md);
    if (c->parsed()) return check(check_preset, check_tp, S, check_seq, seed);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k4_device: %s\n", e.what());
    return 2;
  }
  return 2;
}
