// bench_model -- how long the reference model takes for one decode step, and its peak memory.
//
// Method (docs/performance.md): the full-size preset (or --preset), TP ranks all in this
// process, contexts of --context keys for every row, seeded random inputs and weights
// (tests/cpu/fixtures: experts are made on first use, so unrouted experts never exist).
// For each S: one cold run (experts made on demand, counted) then --reps warm runs; wall time
// by steady_clock, CPU time (all threads) and peak RSS by getrusage. One line a configuration.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "reference/model.hpp"
#include "tests/cpu/fixtures.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
// CPU seconds of the process (all threads): on a shared machine the wall time includes waiting
// for the cores, the CPU time does not.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
long peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "minimax-m3-tp4";
  int context = 65536, reps = 2, tp = 4;
  std::vector<int> tokens = {1, 4, 16};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--preset") preset = argv[i + 1];
    else if (a == "--context") context = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--tp") tp = std::atoi(argv[i + 1]);
    else if (a == "--tokens") tokens = {std::atoi(argv[i + 1])};
    else { std::fprintf(stderr, "bench_model: unknown option %s\n", a.c_str()); return 2; }
  }
  const k4::Config cfg = k4::preset(preset, tp);
  std::printf("preset %s tp %d context %d threads %s\n", preset.c_str(), cfg.tp, context,
              std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "(default)");
  for (int S : tokens) {
    const k4::LayerWeights w = k4::test::random_layer(cfg, 1);  // experts made on demand
    k4::test::StepSpec spec;
    spec.tokens = S;
    spec.seq_lens = {context};
    spec.seed = 7;
    const k4::StepInputs in = k4::test::random_step(cfg, spec);
    auto t = std::chrono::steady_clock::now();
    k4::StepResult r = k4::run_step(w, in);
    const double cold = seconds_since(t);
    double best = 1e30, best_cpu = 1e30;
    for (int i = 0; i < reps; ++i) {
      t = std::chrono::steady_clock::now();
      const double c0 = cpu_seconds();
      r = k4::run_step(w, in);
      best = std::min(best, seconds_since(t));
      best_cpu = std::min(best_cpu, cpu_seconds() - c0);
    }
    std::printf("S=%2d  cold %.3f s (incl. making routed experts)  warm best of %d: wall %.3f s, cpu %.3f s  peak RSS %ld MB\n",
                S, cold, reps, best, best_cpu, peak_rss_mb());
    std::fflush(stdout);
  }
  return 0;
}
