// k4_device.cpp -- the device runner's command line: benchmark and quick checks on the GPU.
//
//   k4_device bench [--preset minimax-m3-tp4] [--tp 4] [--tokens 1,4,16] [--seq 20000]
//                   [--warmup 3] [--repeats 20] [--step-repeats 50] [--moe-path both] [--md FILE]
//       the whole step end to end (median of --step-repeats, L2 flushed before each) against
//       the weights-only floor (one launch streaming the step's bytes, measured in the same
//       run); then each stage's kernels of that step (seeded fixtures) timed with events,
//       median of --repeats after --warmup, against the stage's HBM byte floor: the bytes it
//       must move over the streaming read bandwidth measured in the same run.
//   k4_device check [--preset tiny] [--tp 2] [--tokens 5] [--seq 20000] [--seed 1]
//       one step on the device and in the reference; exit 1 on any mismatching field.
//   k4_device run GOLDEN -o DUMP [--force] [--ar-form config|plain|rs] [--diff [--replay]]
//       GOLDEN's inputs and stored weights through every stage on the GPU; every intermediate
//       into DUMP in the golden schema (for `k4 diff GOLDEN DUMP`). --diff compares at once
//       and prints what `k4 diff` prints. When the device's routing picks an expert GOLDEN
//       does not store, DUMP holds stages index .. router and the run exits 1.
//   k4_device run --kut LIB GOLDEN... [--stages merge,oproj]
//       a kernel-under-test library (device/kut/k4_kut.h) over the goldens, as k4_kut run
//       does, with the tensors in device memory of this GPU for a K4_KUT_DEVICE library
//       (host memory for a K4_KUT_HOST one): one line a case, the first divergence named by
//       case, rank, stage, tensor and element; exit 0 all bit-exact, 1 a divergence.
//
// Exit status: 0 ok, 1 a mismatch (or MoE not run), 2 a usage, input or runtime error (a
// corrupt golden that crashes libhdf5 included: the command runs in a child process watched
// by golden/io/crash_guard.hpp; no CUDA call is made before it forks), 70 a crash in k4 itself.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "device/kut/device_memory.hpp"
#include "device/kut/harness.hpp"
#include "device/runner.hpp"
#include "device/tools/golden_run.hpp"
#include "golden/diff/compare.hpp"
#include "golden/io/crash_guard.hpp"
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
          int step_repeats, const std::vector<int>& paths, const std::string& md_path) {
  const Config cfg = preset(pname, tp);
  std::printf("k4_device bench: %s, preset %s, tp %d (all ranks on this GPU), seq %d\n", gpu::device_name().c_str(),
              pname.c_str(), tp, seq);
  const double copy_bw = gpu::Runner::copy_bandwidth(size_t(1) << 30, 10);
  const double bw = double(size_t(1) << 30) / gpu::Runner::read_floor_s(size_t(1) << 30, 10);
  std::printf("device-to-device copy: %.0f GB/s (bytes read + written, 1 GiB, median of 10)\n", copy_bw / 1e9);
  std::printf("streaming read: %.0f GB/s (one launch over 1 GiB, 16-byte loads, L2 flushed, median of 10)\n",
              bw / 1e9);
  std::ostringstream md;
  md << "Device: " << gpu::device_name() << ". Preset " << pname << ", TP " << tp
     << " (every rank on the one GPU: the byte floors count every rank's weights), context " << seq
     << " keys a row (one request of S consecutive rows). Streaming read bandwidth " << int(bw / 1e9)
     << " GB/s (one launch over 1 GiB, L2 flushed; the stage floors are bytes over it), copy " << int(copy_bw / 1e9)
     << " GB/s (read + write). Stage times: median of " << repeats << " after " << warmup
     << " warm-up runs, CUDA events around each stage's launches, L2 flushed before each.\n\n";
  md << "| S | stage | median us | min us | floor bytes | floor us | x floor |\n|---|---|---|---|---|---|---|\n";
  const LayerWeights lw = test::random_layer(cfg, 2024);
  gpu::Runner runner(lw);
  std::ostringstream steps;
  steps << "\nThe whole step end to end (Runner::time_step: every launch of run_step -- the reference path reads the "
           "routing back to the host, the fast path's step is device work only, also replayed as a graph; L2 flushed "
           "before each; median of "
        << step_repeats << ") against the weights-only floor: one launch streaming the step's bytes, L2 flushed, "
           "measured in the same run.\n\n"
        << "| S | stage 5 path | experts (all ranks) | step median us | step min us | graph replay median us "
           "(nodes) | bytes | floor us | x floor (best) | floor GB/s |\n"
        << "|---|---|---|---|---|---|---|---|---|---|\n";
  for (int S : tokens)
   for (int path : paths) {
    gpu::RunOptions opt;
    opt.moe_path = path;
    const StepInputs in = test::random_step(cfg, {S, seq_for(S, seq), S, uint64_t(S)});
    const gpu::StepTime st = runner.time_step(in, warmup, step_repeats, opt);
    const double best = st.graph_median_us > 0 ? std::min(st.median_us, st.graph_median_us) : st.median_us;
    std::printf("S=%2d %s: step %.1f us (min %.1f, median of %d, L2 flushed), graph %.1f us (%d nodes), floor %.1f us "
                "(%.0f B at %.0f GB/s), x%.2f, %d experts\n",
                S, st.fast ? "fast" : "reference", st.median_us, st.min_us, st.repeats, st.graph_median_us,
                st.graph_nodes, st.floor_us, st.bytes, st.read_bw / 1e9, st.floor_us > 0 ? best / st.floor_us : 0.0,
                st.experts);
    char srow[320];
    std::snprintf(srow, sizeof srow, "| %d | %s | %d | %.1f | %.1f | %.1f (%d) | %.0f | %.1f | %.2f | %.0f |\n", S,
                  st.fast ? "fast" : "reference", st.experts, st.median_us, st.min_us, st.graph_median_us,
                  st.graph_nodes, st.bytes, st.floor_us, st.floor_us > 0 ? best / st.floor_us : 0.0, st.read_bw / 1e9);
    steps << srow;
    const std::vector<gpu::StageTime> times = runner.time_stages(in, warmup, repeats, opt);
    double total = 0, total_floor = 0;
    for (const gpu::StageTime& t : times) {
      const double floor_us = t.bytes / bw * 1e6;
      total += t.median_us, total_floor += floor_us;
      std::printf("S=%2d %-9s %-15s %10.1f us (min %8.1f)  floor %10.0f B = %8.2f us  x%.1f\n", S,
                  st.fast ? "fast" : "reference", t.stage.c_str(), t.median_us, t.min_us, t.bytes, floor_us,
                  floor_us > 0 ? t.median_us / floor_us : 0.0);
      char row[256];
      std::snprintf(row, sizeof row, "| %d | %s%s | %.1f | %.1f | %.0f | %.2f | %.1f |\n", S, t.stage.c_str(),
                    st.fast && (t.stage == "up_gate" || t.stage == "down") ? " (fast)" : "", t.median_us, t.min_us,
                    t.bytes, floor_us, floor_us > 0 ? t.median_us / floor_us : 0.0);
      md << row;
    }
    char row[256];
    std::snprintf(row, sizeof row, "| %d | **all** (%s) | %.1f | | | %.2f | %.1f |\n", S, st.fast ? "fast" : "reference",
                  total, total_floor, total / total_floor);
    md << row;
    std::printf("S=%2d %s total %.1f us, floor %.2f us\n", S, st.fast ? "fast" : "reference", total, total_floor);
  }
  md << steps.str();
  std::fputs(steps.str().c_str(), stdout);
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

int run(const gpu::GoldenRunOptions& opt, bool diff, bool replay) {
  std::printf("k4_device run: %s on %s\n", opt.golden.c_str(), gpu::device_name().c_str());
  const gpu::GoldenRunResult r = gpu::run_golden(opt);
  std::printf("k4_device run: config %s, tp %d, tokens %d: stages index..%s on the device in %.3f s; wrote %s\n",
              r.cfg.name.c_str(), r.cfg.tp, r.tokens, golden::stage_names()[size_t(r.last_stage)].c_str(), r.seconds,
              opt.dump.c_str());
  if (!r.moe_skipped.empty())
    std::printf("k4_device run: the MoE stage did not run: %s\n  (the router or the route differs from the golden's: "
                "k4 diff %s %s)\n",
                r.moe_skipped.c_str(), opt.golden.c_str(), opt.dump.c_str());
  int rc = r.moe_skipped.empty() ? 0 : 1;
  if (diff) {
    golden::DiffOptions d;
    d.replay = replay;
    const golden::DiffReport rep = golden::diff_files(opt.golden, opt.dump, d);
    std::fputs(golden::report_text(rep).c_str(), stdout);
    rc = std::max(rc, rep.exit_code());
  }
  return rc;
}

// k4_device run --kut: the library's tensors in the memory it asks for (k4_kut.h).
int run_kut(const std::string& lib, const std::vector<std::string>& goldens, const std::string& stages) {
  const kut::Library L(lib);
  const bool dev = L.impl().memory == K4_KUT_DEVICE;
  auto mem = dev ? kut::device_memory() : kut::host_memory();
  return kut::run_cases("k4_device run --kut", L, *mem, dev ? "device memory of " + gpu::device_name() : "host memory", goldens, stages);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"k4_device: K4's stage kernels on the GPU"};
  app.require_subcommand(1);
  std::string bench_preset = "minimax-m3-tp4", check_preset = "tiny", md;
  int bench_tp = 4, check_tp = 2, bench_seq = 20000, check_seq = 20000, warmup = 3, repeats = 20, S = 5;
  int step_repeats = 50;
  std::string moe_paths = "both";
  uint64_t seed = 1;
  std::vector<int> tokens = {1, 4, 16};
  CLI::App* b = app.add_subcommand("bench", "time each stage against its HBM byte floor");
  b->add_option("--preset", bench_preset);
  b->add_option("--tp", bench_tp);
  b->add_option("--tokens", tokens)->delimiter(',');
  b->add_option("--seq", bench_seq);
  b->add_option("--warmup", warmup);
  b->add_option("--repeats", repeats);
  b->add_option("--step-repeats", step_repeats, "timed repeats of the whole step (median)");
  b->add_option("--moe-path", moe_paths, "the split, o_proj and MoE kernels: reference, fast (tensor cores) or both")
      ->check(CLI::IsMember({"reference", "fast", "both"}));
  b->add_option("--md", md, "also write the table as markdown");
  CLI::App* c = app.add_subcommand("check", "one step on the device against the reference");
  c->add_option("--preset", check_preset);
  c->add_option("--tp", check_tp);
  c->add_option("--tokens", S);
  c->add_option("--seq", check_seq);
  c->add_option("--seed", seed);
  gpu::GoldenRunOptions ropt;
  std::string ar_form = "config";
  bool diff = false, replay = false;
  CLI::App* g = app.add_subcommand("run", "a golden's inputs through every stage on the GPU, into a dump");
  std::vector<std::string> goldens;
  std::string kut_lib, kut_stages;
  g->add_option("golden", goldens, "the golden file (inputs and weights); with --kut, one or more")->required()->check(CLI::ExistingFile);
  g->add_option("-o,--out", ropt.dump, "the dump to write (golden schema)");
  g->add_option("--kut", kut_lib, "run this kernel-under-test library (k4_kut.h) over the goldens instead")->check(CLI::ExistingFile);
  g->add_option("--stages", kut_stages, "with --kut: comma-separated stages (default: every stage the library supports)");
  g->add_flag("--force", ropt.overwrite, "overwrite an existing dump");
  g->add_option("--ar-form", ar_form, "the all-reduces' form: config (the config's threshold), plain or rs")
      ->check(CLI::IsMember({"config", "plain", "rs"}));
  g->add_flag("--diff", diff, "compare the dump with the golden at once (k4 diff)");
  g->add_flag("--replay", replay, "with --diff: replay each stage on the dump's inputs (k4 diff --replay)");
  CLI11_PARSE(app, argc, argv);
  if (g->parsed()) {
    const char* bad = nullptr;
    if (kut_lib.empty() && goldens.size() != 1) bad = "run: one golden (several only with --kut)";
    else if (kut_lib.empty() && ropt.dump.empty()) bad = "run: --out is required (without --kut)";
    else if (kut_lib.empty() && !kut_stages.empty()) bad = "run: --stages is for --kut";
    else if (!kut_lib.empty() && (!ropt.dump.empty() || diff || replay)) bad = "run --kut: writes no dump (no --out, --diff, --replay)";
    if (bad) {
      std::fprintf(stderr, "k4_device: %s\n", bad);
      return 2;
    }
    ropt.golden = goldens[0];
  }
  ropt.run.ar_form = ar_form == "config" ? -1 : ar_form == "plain" ? 0 : 1;
  const std::string tool = std::string("k4_device ") + (b->parsed() ? "bench" : c->parsed() ? "check" : "run");
  return k4::guard::run(tool, [&] {
    try {
      if (b->parsed()) return bench(bench_preset, bench_tp, tokens, bench_seq, warmup, repeats, step_repeats,
                                   moe_paths == "both" ? std::vector<int>{0, 1}
                                                       : std::vector<int>{moe_paths == "fast" ? 1 : 0},
                                   md);
      if (c->parsed()) return check(check_preset, check_tp, S, check_seq, seed);
      if (g->parsed()) return kut_lib.empty() ? run(ropt, diff, replay) : run_kut(kut_lib, goldens, kut_stages);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "k4_device: %s\n", e.what());
      return 2;
    }
    return 2;
  });
}
