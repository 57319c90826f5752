// test_stages_gpu.cpp -- the GPU suite of the stage kernels: every stage of the device step
// bit for bit against the reference model (k4::run_step) in the same process.
//
//   k4_gpu_tests -ts=gpu_stages                     everything below (~3 minutes on an H200)
//   k4_gpu_tests -ts=gpu_stages -tc="plant probe"   one case through every stage (the planted
//                                                   builds must fail it, naming their stage)
//   K4_GPU_BUDGET_S=60 k4_gpu_tests -ts=gpu_stages  the sweep's time budget (default 150 s)
//   K4_GPU_SEEDS=20                                 sweep rounds / "seeds" test seeds (default 20)
//
// Every field of every rank's RankResult is compared; a mismatch prints the case (preset, tp,
// tokens, seq_lens, q_len, seed), then per field the first elements that differ: flat and
// multi-dimensional index, hex bits on both sides, decoded values, ULPs; and "first
// mismatching stage: N". A sweep configuration that ran no seed within the budget is
// reported as skipped, never as passed.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <omp.h>
#include <thread>
#include <sstream>
#include <string>
#include <vector>

#include "device/runner.hpp"
#include "reference/model.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/e8m0.hpp"
#include "tests/cpu/fixtures.hpp"

namespace {

using namespace k4;

// ------------------------------------------------------------------------------ comparing
enum class Kind { Bf16, E4m3, E8m0, F32, I32, U8 };

struct Report {
  int first_stage = -1;     // the lowest stage with a mismatching field
  int fields = 0;           // mismatching fields
  std::ostringstream text;  // what to print
  int printed_fields = 0;
};

uint32_t bits_of(float v) { return f32_bits(v); }
uint32_t bits_of(uint16_t v) { return v; }
uint32_t bits_of(uint8_t v) { return v; }
uint32_t bits_of(int32_t v) { return uint32_t(v); }

double decode(Kind k, uint32_t b) {
  switch (k) {
    case Kind::Bf16: return bf16_to_f32(uint16_t(b));
    case Kind::E4m3: return e4m3_to_f32(uint8_t(b));
    case Kind::E8m0: return e8m0_to_f32(uint8_t(b));
    case Kind::F32: return f32_from_bits(b);
    case Kind::I32: return double(int32_t(b));
    case Kind::U8: return double(b);
  }
  return 0;
}

// ULPs between two codes of a sign-magnitude float format with `sign_bit`.
uint64_t ulps(uint32_t a, uint32_t b, int sign_bit) {
  auto ord = [&](uint32_t x) -> int64_t {
    const uint32_t s = 1u << sign_bit;
    return (x & s) ? -int64_t(x & (s - 1)) - 1 : int64_t(x);
  };
  const int64_t d = ord(a) - ord(b);
  return uint64_t(d < 0 ? -d : d);
}

std::string index_str(size_t flat, const std::vector<size_t>& shape) {
  std::vector<size_t> idx(shape.size());
  size_t rest = flat;
  for (size_t i = shape.size(); i-- > 0;) idx[i] = rest % shape[i], rest /= shape[i];
  std::string s = "[";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? "," : "") + std::to_string(idx[i]);
  return s + "]";
}

template <class T>
void compare_field(Report& rep, int stage, int rank, const std::string& name, Kind kind, const std::vector<T>& dev,
                   const std::vector<T>& ref, const std::vector<size_t>& shape) {
  size_t n_shape = 1;
  for (size_t d : shape) n_shape *= d;
  size_t bad = 0;
  std::ostringstream lines;
  if (dev.size() != ref.size() || ref.size() != n_shape) {
    bad = 1;
    lines << "    size: device " << dev.size() << ", reference " << ref.size() << ", shape " << n_shape << "\n";
  } else {
    for (size_t i = 0; i < ref.size(); ++i) {
      const uint32_t d = bits_of(dev[i]), h = bits_of(ref[i]);
      if (d == h) continue;
      if (++bad > 6) continue;
      char buf[256];
      const int width = kind == Kind::F32 || kind == Kind::I32 ? 8 : (kind == Kind::Bf16 ? 4 : 2);
      std::snprintf(buf, sizeof buf, "    %-10zu %-16s device 0x%0*" PRIx32 " (%.9g)  reference 0x%0*" PRIx32 " (%.9g)", i,
                    index_str(i, shape).c_str(), width, d, decode(kind, d), width, h, decode(kind, h));
      lines << buf;
      if (kind == Kind::F32) lines << "  " << ulps(d, h, 31) << " ulp";
      if (kind == Kind::Bf16) lines << "  " << ulps(d, h, 15) << " ulp";
      if (kind == Kind::E4m3) lines << "  " << ulps(d, h, 7) << " ulp";
      lines << "\n";
    }
  }
  if (bad == 0) return;
  ++rep.fields;
  if (rep.first_stage < 0 || stage < rep.first_stage) rep.first_stage = stage;
  if (rep.printed_fields++ < 6)
    rep.text << "  stage " << stage << " rank " << rank << " " << name << ": " << bad << " of " << ref.size()
             << " elements differ\n"
             << lines.str();
}

Report compare_results(const StepResult& dev, const StepResult& ref, const Config& cfg, int S) {
  Report rep;
  if (dev.ranks.size() != ref.ranks.size()) {
    rep.first_stage = 0, rep.fields = 1;
    rep.text << "  ranks: device " << dev.ranks.size() << ", reference " << ref.ranks.size() << "\n";
    return rep;
  }
  const size_t s = S, OK = cfg.o_k(), NS = cfg.n_split, H = cfg.heads, HID = cfg.hidden, E = cfg.n_routed;
  const size_t SL = cfg.moe_slots(), I = cfg.inter, TW = cfg.sparse_table_words(), T = cfg.topk_blocks;
  for (size_t r = 0; r < ref.ranks.size(); ++r) {
    const RankResult &d = dev.ranks[r], &h = ref.ranks[r];
    const int rk = int(r);
    compare_field(rep, 0, rk, "index.sparse_table", Kind::I32, d.index.sparse_table, h.index.sparse_table, {s, TW});
    compare_field(rep, 0, rk, "index.blocks", Kind::I32, d.index.blocks, h.index.blocks, {s, T});
    compare_field(rep, 0, rk, "index.n_ctx", Kind::I32, d.index.n_ctx, h.index.n_ctx, {s});
    compare_field(rep, 0, rk, "index.long_row", Kind::U8, d.index.long_row, h.index.long_row, {s});
    compare_field(rep, 1, rk, "split.q8", Kind::E4m3, d.split.q8, h.split.q8, {s, OK});
    compare_field(rep, 1, rk, "split.o", Kind::Bf16, d.split.o, h.split.o, {s, NS, OK});
    compare_field(rep, 1, rk, "split.m", Kind::F32, d.split.m, h.split.m, {s, NS, H});
    compare_field(rep, 1, rk, "split.l", Kind::F32, d.split.l, h.split.l, {s, NS, H});
    compare_field(rep, 2, rk, "merge.attn", Kind::Bf16, d.merge.attn, h.merge.attn, {s, OK});
    compare_field(rep, 2, rk, "merge.attn8", Kind::E4m3, d.merge.attn8, h.merge.attn8, {s, OK});
    compare_field(rep, 2, rk, "merge.x_scale", Kind::F32, d.merge.x_scale, h.merge.x_scale, {s});
    compare_field(rep, 3, rk, "oproj.partial", Kind::Bf16, d.oproj.partial, h.oproj.partial, {s, HID});
    compare_field(rep, 3, rk, "a", Kind::Bf16, d.a, h.a, {s, HID});
    compare_field(rep, 3, rk, "h_mid", Kind::Bf16, d.h_mid, h.h_mid, {s, HID});
    compare_field(rep, 4, rk, "router.xn", Kind::Bf16, d.router.xn, h.router.xn, {s, HID});
    compare_field(rep, 4, rk, "router.xn8", Kind::E4m3, d.router.xn8, h.router.xn8, {s, HID});
    compare_field(rep, 4, rk, "router.xsc", Kind::E8m0, d.router.xsc, h.router.xsc, {s, HID / 32});
    compare_field(rep, 4, rk, "router.rstd", Kind::F32, d.router.rstd, h.router.rstd, {s});
    compare_field(rep, 4, rk, "router.logit", Kind::F32, d.router.logit, h.router.logit, {s, E});
    compare_field(rep, 4, rk, "router.sig", Kind::F32, d.router.sig, h.router.sig, {s, E});
    compare_field(rep, 4, rk, "router.key", Kind::I32, d.router.key, h.router.key, {s, E});
    compare_field(rep, 5, rk, "route.ids", Kind::I32, d.route.ids, h.route.ids, {s, SL});
    compare_field(rep, 5, rk, "route.weights", Kind::F32, d.route.weights, h.route.weights, {s, SL});
    compare_field(rep, 5, rk, "moe.gate", Kind::F32, d.moe.gate, h.moe.gate, {s, SL, I});
    compare_field(rep, 5, rk, "moe.up", Kind::F32, d.moe.up, h.moe.up, {s, SL, I});
    compare_field(rep, 5, rk, "moe.mid", Kind::Bf16, d.moe.mid, h.moe.mid, {s, SL, I});
    compare_field(rep, 5, rk, "moe.mid8", Kind::E4m3, d.moe.mid8, h.moe.mid8, {s, SL, I});
    compare_field(rep, 5, rk, "moe.midsc", Kind::E8m0, d.moe.midsc, h.moe.midsc, {s, SL, I / 32});
    compare_field(rep, 5, rk, "moe.partial", Kind::Bf16, d.moe.partial, h.moe.partial, {s, HID});
    compare_field(rep, 5, rk, "ar_out", Kind::Bf16, d.ar_out, h.ar_out, {s, HID});
  }
  return rep;
}

// "Cannot pass on nothing": the reference's outputs of a case are not all zero.
template <class T>
bool any_nonzero(const std::vector<T>& v) {
  for (const T& x : v)
    if (bits_of(x) != 0) return true;
  return false;
}

// ------------------------------------------------------------------------------ cases
struct Case {
  std::string preset = "tiny";
  int tp = 1;
  test::StepSpec spec;
  std::string tag;
  std::string describe() const {
    std::ostringstream o;
    o << preset << " tp" << tp << " S=" << spec.tokens << " q_len=" << spec.q_len << " seed=" << spec.seed
      << " seq_lens={";
    for (size_t i = 0; i < spec.seq_lens.size(); ++i) o << (i ? "," : "") << spec.seq_lens[i];
    o << "}" << (tag.empty() ? "" : " [" + tag + "]");
    return o.str();
  }
};

struct Tally {
  int cases = 0, failed = 0;
};

// Runs one step on the device and the reference; true when every field matches.
bool check_step(gpu::Runner& runner, const LayerWeights& lw, const StepInputs& in, const std::string& what,
                const gpu::RunOptions& opt = {}, bool require_nonzero = true, const StepResult* ref_in = nullptr) {
  StepResult ref_own;
  if (ref_in == nullptr) ref_own = run_step(lw, in), ref_in = &ref_own;
  const StepResult& ref = *ref_in;
  const StepResult dev = runner.run_step(in, opt);
  const Report rep = compare_results(dev, ref, lw.cfg, in.shared.tokens);
  bool ok = rep.fields == 0;
  if (!ok) {
    std::printf("MISMATCH %s%s\n%s  first mismatching stage: %d\n", what.c_str(),
                opt.ar_form >= 0 ? (opt.ar_form ? " (ar_form reduce-scatter)" : " (ar_form plain)") : "",
                rep.text.str().c_str(), rep.first_stage);
    std::fflush(stdout);
  }
  if (require_nonzero) {
    const RankResult& h = ref.ranks[0];
    const bool live = any_nonzero(h.split.o) && any_nonzero(h.merge.attn8) && any_nonzero(h.oproj.partial) &&
                      any_nonzero(h.router.xn8) && any_nonzero(h.moe.mid8) && any_nonzero(h.ar_out);
    if (!live) std::printf("ALL-ZERO reference outputs in %s: the case proves nothing\n", what.c_str());
    ok = ok && live;
  }
  return ok;
}

bool run_case(const Case& c, gpu::Runner* runner = nullptr, const LayerWeights* layer = nullptr,
              const gpu::RunOptions& opt = {}) {
  const Config cfg = preset(c.preset, c.tp);
  LayerWeights own;
  if (layer == nullptr) own = test::random_layer(cfg, c.spec.seed * 31 + 7), layer = &own;
  std::unique_ptr<gpu::Runner> own_runner;
  if (runner == nullptr) own_runner = std::make_unique<gpu::Runner>(*layer), runner = own_runner.get();
  const StepInputs in = test::random_step(cfg, c.spec);
  return check_step(*runner, *layer, in, c.describe(), opt);
}

double budget_s() {
  const char* e = std::getenv("K4_GPU_BUDGET_S");
  return e ? std::atof(e) : 150.0;
}
int seeds_wanted() {
  const char* e = std::getenv("K4_GPU_SEEDS");
  return e ? std::max(1, std::atoi(e)) : 20;
}

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Cases run on a few host threads at once (the reference dominates a case's time and small
// steps use few cores): each worker makes its inputs and runs the reference with its share of
// the cores as its OpenMP team, the device step under its runner's mutex. Results come back
// in case order; doctest's CHECKs stay on the calling thread. Workers start no case past
// `deadline` (now_s() time): those come back not run.
struct Slot {
  const LayerWeights* layer;
  gpu::Runner* runner;
  std::mutex* mu;
};
struct Outcome {
  bool run = false, ok = false;
};
std::vector<Outcome> run_cases(const std::vector<Case>& cases, const std::vector<Slot>& slot_of, double deadline) {
  std::vector<Outcome> out(cases.size());
  // one worker a core, each a one-thread reference: a case's reference parallelizes poorly
  // (few tokens), its inputs not at all
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  const int workers = std::min(cores, 32);
  std::mutex take_mu;
  size_t next = 0;
  auto work = [&] {
    omp_set_num_threads(std::max(1, cores / workers));
    for (;;) {
      size_t i;
      {
        std::lock_guard<std::mutex> lock(take_mu);
        if (next >= cases.size() || now_s() > deadline) return;
        i = next++;
      }
      const Case& c = cases[i];
      const Slot& sl = slot_of[i];
      const StepInputs in = test::random_step(sl.layer->cfg, c.spec);
      const StepResult ref = run_step(*sl.layer, in);
      std::lock_guard<std::mutex> lock(*sl.mu);
      out[i].ok = check_step(*sl.runner, *sl.layer, in, c.describe(), {}, true, &ref);
      out[i].run = true;
    }
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
  return out;
}

// Context classes of a sweep: seq_lens of S tokens from a seed.
std::vector<int> contexts(const std::string& cls, int S, uint64_t seed) {
  test::Rng r(seed * 977 + 13);
  std::vector<int> v(S);
  for (int k = 0; k < S; ++k) {
    if (cls == "short") v[k] = 1 + r.below(2400);           // 1 .. 19 blocks: id order and scored
    else if (cls == "medium") v[k] = 2500 + r.below(40000);  // scored, short path
    else if (cls == "long") v[k] = 65537 + r.below(150000);  // the long path (> 512 blocks)
    else if (cls == "mixed") {
      const int pick = r.below(5);
      v[k] = pick == 0 ? 0 : pick == 1 ? 1 + r.below(300) : pick == 2 ? 2000 + r.below(200)
                                                          : pick == 3 ? 20000 : 70000 + r.below(130000);
    }
  }
  return v;
}

const char* const kClasses[] = {"short", "medium", "long", "mixed"};

}  // namespace

TEST_SUITE("gpu_stages") {

// One step through every stage: long, short, scored, pad rows, wide MoE, TP 2. The planted
// builds (K4_PLANT_STAGE=N) must fail here, naming stage N.
TEST_CASE("plant probe") {
  std::printf("gpu_stages: device %s, planted stage %d\n", gpu::device_name().c_str(), gpu::planted_stage());
  Case c;
  c.preset = "tiny", c.tp = 2, c.spec = {5, {70000, 300, 0, 20000, 2000}, 1, 11}, c.tag = "plant probe";
  CHECK_MESSAGE(run_case(c), c.describe());
}

// The sanitizer case (scripts/gpu-suite.sh runs it under compute-sanitizer memcheck and
// racecheck): narrow MoE with the plain all-reduce (S = 3), wide MoE with reduce-scatter +
// all-gather (S = 6); the long path, a pad row, short and scored contexts.
TEST_CASE("sanitizer case") {
  const Config cfg = preset("tiny", 2);
  const LayerWeights lw = test::random_layer(cfg, 5);
  gpu::Runner runner(lw);
  for (int S : {3, 6}) {
    test::StepSpec spec{S, {70000, 0, 300, 20000, 2100, 5}, 1, uint64_t(S)};
    spec.seq_lens.resize(S);
    const StepInputs in = test::random_step(cfg, spec);
    gpu::RunOptions opt;
    opt.ar_form = S == 3 ? 0 : 1;
    CHECK(check_step(runner, lw, in, "sanitizer case S=" + std::to_string(S), opt));
  }
}

// The sweep: presets tiny and small, TP 1 / 2 / 4, and tiny TP 2 with kv_page_stride 8 and
// with one static K / V scale a cache; S = 1..16; four context classes. A cell is (config,
// S, class); one layer a config for the whole sweep; seeds vary the steps (and so the
// routing: the experts used). Seed round n runs every cell once; rounds continue until
// K4_GPU_SEEDS rounds (20) or the budget (K4_GPU_BUDGET_S). The summary line gives the
// seeds every cell got; a cell no round reached is reported SKIPPED and fails the test.
TEST_CASE("sweep tiny small") {
  const double t0 = now_s(), deadline = t0 + budget_s();
  const int rounds = seeds_wanted();
  struct Cfg {
    std::string preset;
    int tp;
    int kv_page_stride = 0;  // 0: the preset's (16)
    bool static_kv = false;
    std::string variant = "";  // a variant spec (reference/variant.hpp); empty: the seed's
    std::string name() const {
      return preset + " tp" + std::to_string(tp) + (kv_page_stride ? " stride" + std::to_string(kv_page_stride) : "") +
             (static_kv ? " static-kv" : "") + (variant.empty() ? "" : " " + variant);
    }
  };
  const std::vector<Cfg> cfgs = {{"tiny", 1},  {"tiny", 2},  {"tiny", 4},        {"small", 1},
                                 {"small", 2}, {"small", 4}, {"tiny", 2, 8},     {"tiny", 2, 0, true},
                                 {"tiny", 2, 0, false, "split.kv_scale=static448"},
                                 {"tiny", 2, 0, false, "split.kv_scale=atom_vllm"},
                                 {"tiny", 2, 0, false, "moe.experts=mxfp8"}};
  std::vector<std::unique_ptr<LayerWeights>> layers;
  std::vector<std::unique_ptr<gpu::Runner>> runners;
  std::vector<std::unique_ptr<std::mutex>> mus;
  for (size_t ci = 0; ci < cfgs.size(); ++ci) {
    Config cfg = preset(cfgs[ci].preset, cfgs[ci].tp);
    if (cfgs[ci].kv_page_stride) cfg.kv_page_stride = cfgs[ci].kv_page_stride;
    if (cfgs[ci].static_kv) cfg.variant.kv_scale = KvScale::scalar;
    if (!cfgs[ci].variant.empty()) cfg.variant = parse_variant(cfgs[ci].variant);
    cfg.validate();
    layers.push_back(std::make_unique<LayerWeights>(test::random_layer(cfg, 1000 + ci)));
    runners.push_back(std::make_unique<gpu::Runner>(*layers.back()));
    mus.push_back(std::make_unique<std::mutex>());
  }
  std::vector<std::vector<int>> done(cfgs.size(), std::vector<int>(17 * 4, 0));
  int cases = 0, failed = 0, rounds_done = 0;
  for (int seed = 1; seed <= rounds && now_s() < deadline; ++seed) {
    std::vector<Case> batch;
    std::vector<Slot> slots;
    std::vector<std::pair<size_t, int>> cell;  // (config, S * 4 + class)
    for (size_t ci = 0; ci < cfgs.size(); ++ci)
      for (int S = 1; S <= 16; ++S)
        for (int cl = 0; cl < 4; ++cl) {
          Case c;
          c.preset = cfgs[ci].preset, c.tp = cfgs[ci].tp;
          const uint64_t sd = uint64_t(seed) * 100003 + ci * 1009 + S * 17 + cl;
          // S a multiple of 4 (not medium), odd seeds: requests of q_len 2 or 4, consecutive positions
          const int q_len = (S % 4 == 0 && cl != 1 && seed % 2 == 1) ? (S % 8 == 0 ? 4 : 2) : 1;
          std::vector<int> seq = contexts(kClasses[cl], S, sd);
          for (int k = 0; k + 1 < S && q_len > 1; ++k)
            if ((k + 1) % q_len != 0) seq[k + 1] = std::max(seq[k], 0) + 1;  // row k+1 follows row k
          c.spec = {S, seq, q_len, sd};
          c.tag = kClasses[cl] + (cfgs[ci].kv_page_stride || cfgs[ci].static_kv || !cfgs[ci].variant.empty() ? ", " + cfgs[ci].name() : "");
          batch.push_back(c);
          slots.push_back({layers[ci].get(), runners[ci].get(), mus[ci].get()});
          cell.push_back({ci, S * 4 + cl});
        }
    const std::vector<Outcome> res = run_cases(batch, slots, deadline);
    bool all_run = true;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!res[i].run) {
        all_run = false;
        continue;
      }
      ++cases;
      failed += !res[i].ok;
      ++done[cell[i].first][cell[i].second];
      CHECK_MESSAGE(res[i].ok, batch[i].describe());
    }
    if (all_run) rounds_done = seed;
    std::printf("gpu_stages sweep: round %d: %d cases so far, %d failed, %.1f s\n", seed, cases, failed, now_s() - t0);
    std::fflush(stdout);
  }
  int skipped = 0, min_seeds = 1 << 30;
  for (size_t ci = 0; ci < cfgs.size(); ++ci) {
    int cfg_min = 1 << 30;
    for (int S = 1; S <= 16; ++S)
      for (int cl = 0; cl < 4; ++cl) {
        const int n = done[ci][S * 4 + cl];
        min_seeds = std::min(min_seeds, n), cfg_min = std::min(cfg_min, n);
        if (n == 0) {
          ++skipped;
          std::printf("SKIPPED (no time left): %s S=%d %s\n", cfgs[ci].name().c_str(), S, kClasses[cl]);
        }
      }
    std::printf("gpu_stages sweep: %-22s every (S, class) cell at least %d seed(s)\n", cfgs[ci].name().c_str(), cfg_min);
  }
  std::printf("gpu_stages sweep: %d cases in %d full rounds of %d wanted, %d failed, %d of %d cells skipped, "
              "every cell at least %d seed(s), %.1f s\n",
              cases, rounds_done, rounds, failed, skipped, int(cfgs.size()) * 16 * 4, min_seeds, now_s() - t0);
  CHECK(failed == 0);
  CHECK_MESSAGE(skipped == 0, "sweep cells skipped for time: see SKIPPED lines");
}

// 20 seeds (K4_GPU_SEEDS) of a few configurations: tiny TP4 S = 16 and tiny TP2 S = 5 (wide MoE,
// plain all-reduce) over mixed contexts with pad rows, small TP2 S = 1.
TEST_CASE("seeds") {
  const int seeds = seeds_wanted();
  const struct {
    const char* preset;
    int tp, S;
  } cfgs[] = {{"tiny", 4, 16}, {"tiny", 2, 5}, {"small", 2, 1}};
  for (const auto& fc : cfgs) {
    const Config cfg = preset(fc.preset, fc.tp);
    const LayerWeights lw = test::random_layer(cfg, 4242 + fc.S);
    gpu::Runner runner(lw);
    std::mutex mu;
    std::vector<Case> batch;
    for (int seed = 1; seed <= seeds; ++seed) {
      Case c;
      c.preset = fc.preset, c.tp = fc.tp;
      c.spec = {fc.S, contexts("mixed", fc.S, uint64_t(seed) * 31 + fc.S), 1, uint64_t(seed)};
      c.tag = "seeds";
      batch.push_back(c);
    }
    const std::vector<Outcome> res = run_cases(batch, std::vector<Slot>(batch.size(), Slot{&lw, &runner, &mu}), 1e300);
    int failed = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      failed += !res[i].ok;
      CHECK_MESSAGE(res[i].ok, batch[i].describe());
    }
    std::printf("gpu_stages seeds: %s tp%d S=%d: %d seeds, %d failed\n", fc.preset, fc.tp, fc.S, seeds, failed);
  }
}

// The full-size preset (MiniMax-M3 TP4 shapes) on a few steps: narrow and wide MoE, both
// all-reduce forms, long and short contexts.
TEST_CASE("full preset") {
  const struct {
    int tp, S;
    std::vector<int> seq;
    int q_len;
  } cases[] = {{4, 1, {20000}, 1},
               {4, 4, {70000, 300, 0, 5000}, 1},
               {4, 16, {70000}, 4},
               {2, 5, {2000, 200000, 1, 130, 9000}, 1}};
  std::unique_ptr<LayerWeights> lw;
  std::unique_ptr<gpu::Runner> runner;
  for (const auto& fc : cases) {
    const Config cfg = preset("minimax-m3-tp4", fc.tp);
    if (!lw || lw->cfg.tp != fc.tp) {
      runner.reset();
      lw = std::make_unique<LayerWeights>(test::random_layer(cfg, 600 + fc.tp));
      runner = std::make_unique<gpu::Runner>(*lw);
    }
    Case c;
    c.preset = "minimax-m3-tp4", c.tp = fc.tp;
    std::vector<int> seq = fc.seq;
    if (fc.seq.size() == 1)  // one request of S consecutive rows
      for (int k = 1; k < fc.S; ++k) seq.push_back(fc.seq[0] + k);
    c.spec = {fc.S, seq, fc.q_len, uint64_t(fc.S) * 7 + fc.tp};
    const double t0 = now_s();
    CHECK_MESSAGE(run_case(c, runner.get(), lw.get()), c.describe());
    std::printf("gpu_stages full preset: %s: %.1f s\n", c.describe().c_str(), now_s() - t0);
  }
}

// The two all-reduce forms give the same bits (and the reference's) on both sides of the
// threshold.
TEST_CASE("all-reduce forms") {
  for (int tp : {2, 4}) {
    const Config cfg = preset("small", tp);
    const LayerWeights lw = test::random_layer(cfg, 77 + tp);
    gpu::Runner runner(lw);
    for (int S : {4, 11, 12, 16}) {
      const StepInputs in = test::random_step(cfg, {S, contexts("mixed", S, S * 3 + tp), 1, uint64_t(S)});
      const StepResult ref = run_step(lw, in);
      for (int form : {0, 1}) {
        gpu::RunOptions opt;
        opt.ar_form = form;
        CHECK(check_step(runner, lw, in, "all-reduce forms small tp" + std::to_string(tp) + " S=" + std::to_string(S), opt,
                         true, &ref));
      }
    }
  }
}

// Adversarial values: NaN / -0 / Inf / huge in q, scores and the residual; tied index scores;
// zero V (an all-zero attention row); every token routed to the same experts.
TEST_CASE("adversarial") {
  const uint16_t specials[] = {0x7FC0, 0xFFC1, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x7F7F, 0x0001, 0x43E8, 0xC3E9};
  for (int tp : {1, 2}) {
    const Config cfg = preset("tiny", tp);
    const LayerWeights base = test::random_layer(cfg, 900 + tp);
    for (int variant = 0; variant < 7; ++variant) {
      LayerWeights lw = base;
      for (int S : {2, 7, 16}) {
        test::StepSpec spec{S, contexts("mixed", S, 50 + S + variant), 1, uint64_t(S * 10 + variant)};
        StepInputs in = test::random_step(cfg, spec);
        test::Rng r(uint64_t(variant * 100 + S));
        std::string what = "adversarial tp" + std::to_string(tp) + " S=" + std::to_string(S) + " ";
        if (variant == 0) {  // specials sprinkled over q, incl. whole NaN / -0 heads
          what += "q specials";
          for (StepRank& R : in.ranks) {
            for (int i = 0; i < 200; ++i) R.q[r.below(int(R.q.size()))] = specials[r.below(10)];
            for (int d = 0; d < cfg.head_dim; ++d) R.q[3 * cfg.head_dim + d] = 0x8000;  // token 0 head 3: -0
            for (int d = 0; d < cfg.head_dim; ++d) R.q[5 * cfg.head_dim + d] = 0x7FC0;  // token 0 head 5: NaN
          }
        } else if (variant == 1) {  // score specials and ties
          what += "score specials and ties";
          const float fs[] = {NAN, -NAN, -0.0f, 0.0f, INFINITY, -INFINITY, 1e30f, -3.4e38f, 1.0f, 1.0f};
          for (StepRank& R : in.ranks)  // each rank's own specials
            for (float& s : R.index_scores) s = r.below(3) == 0 ? fs[r.below(10)] : float(r.below(4));
        } else if (variant == 2) {  // all scores equal: ties everywhere, resolved by id
          what += "all scores tied";
          for (StepRank& R : in.ranks)
            for (float& s : R.index_scores) s = 0.5f;
        } else if (variant == 3) {  // residual specials: NaN, Inf, -0 into the norm and routing
          what += "residual specials";
          for (int i = 0; i < 50; ++i) in.shared.h_in[r.below(int(in.shared.h_in.size()))] = specials[r.below(10)];
          for (int i = 0; i < cfg.hidden; ++i) in.shared.h_in[i] = 0x8000;  // token 0: -0 residual
        } else if (variant == 4) {  // zero V: all-zero attention rows, zero merge scale
          what += "zero V";
          for (StepRank& R : in.ranks) std::fill(R.v_cache.begin(), R.v_cache.end(), uint8_t(0));
        } else if (variant == 5) {  // every token routed to experts 3, 7, 11, 12 (bias)
          what += "same experts";
          for (RankWeights& w : lw.ranks)
            for (int e : {3, 7, 11, 12}) w.bias[e] = 10.0f;
        } else {  // huge KV scales and NaN K bytes
          what += "kv extremes";
          for (StepRank& R : in.ranks) {
            for (float& s : R.v_scale) s = r.below(4) == 0 ? 3e38f : s;
            for (int i = 0; i < 100; ++i) R.k_cache[r.below(int(R.k_cache.size()))] = 0x7F;
          }
        }
        gpu::Runner runner(lw);
        CHECK(check_step(runner, lw, in, what, {}, /*require_nonzero=*/variant != 4));
      }
    }
  }
}

// Per-rank index scores (seed:L487): each rank's kernel reads its own scores. Rank r's blocks
// b = r (mod tp) lifted, so every rank selects a different set; a kernel that read another
// rank's scores (or rank 0's everywhere) would select another rank's set and fail here.
TEST_CASE("per-rank index scores") {
  for (int tp : {2, 4}) {
    const Config cfg = preset("tiny", tp);
    const LayerWeights lw = test::random_layer(cfg, 1400 + tp);
    gpu::Runner runner(lw);
    for (int S : {3, 9}) {
      std::vector<int> seq = contexts("mixed", S, 70 + S + tp);
      seq[0] = 5000;  // a scored row (40 blocks): every rank's selection differs there
      StepInputs in = test::random_step(cfg, {S, seq, 1, uint64_t(S * 13 + tp)});
      for (int r = 0; r < tp; ++r)
        for (int k = 0; k < S; ++k)
          for (int b = r; b < in.shared.score_width; b += tp) in.ranks[r].index_scores[size_t(k) * in.shared.score_width + b] += 32.0f;
      const StepResult ref = run_step(lw, in);
      int differing = 0;  // rows whose selections differ between every pair of ranks
      for (int k = 0; k < S; ++k) {
        bool all_differ = true;
        for (int a = 0; a < tp; ++a)
          for (int b = a + 1; b < tp; ++b)
            all_differ = all_differ && !std::equal(ref.ranks[a].index.blocks.begin() + k * cfg.topk_blocks,
                                                   ref.ranks[a].index.blocks.begin() + (k + 1) * cfg.topk_blocks,
                                                   ref.ranks[b].index.blocks.begin() + k * cfg.topk_blocks);
        differing += all_differ;
      }
      CHECK_MESSAGE(differing > 0, "no row where every rank selects a different set: the case proves nothing");
      CHECK(check_step(runner, lw, in, "per-rank scores tiny tp" + std::to_string(tp) + " S=" + std::to_string(S), {},
                       true, &ref));
    }
  }
}

// The variants of docs/numerics.md §13 that change the kernels' arithmetic beyond the seed's
// (V4 KV-scale modes, V7 MXFP8 experts, V6.1 the MXFP8 shared expert): narrow and wide steps,
// short, scored and long contexts, against the model bit for bit.
TEST_CASE("paths variants") {
  for (const char* spec : {"split.kv_scale=static448", "split.kv_scale=atom_vllm", "moe.experts=mxfp8", "moe.shared_fp8=on"}) {
    Config cfg = preset("tiny", 2);
    cfg.variant = parse_variant(spec);
    cfg.validate();
    const LayerWeights lw = test::random_layer(cfg, 4242);
    gpu::Runner runner(lw);
    for (int S : {1, 4, 7, 16}) {
      const StepInputs in = test::random_step(cfg, {S, contexts("mixed", S, 7 * S + 1), 1, uint64_t(S + 300)});
      CHECK(check_step(runner, lw, in, std::string(spec) + " S=" + std::to_string(S), {}));
    }
  }
}

// The router's gate variants (docs/numerics.md §13, V1): the F32 gate with fma pairs, and the
// unrounded logit, on the device bit for bit; the fixture's F32 gate has low bits below its
// bf16 copy, so a kernel that read the bf16 gate (or rounded the logit) fails here.
TEST_CASE("router variants") {
  for (const char* spec : {"router.gate=f32,router.round_logit=false", "router.round_logit=false"}) {
    for (int tp : {1, 2}) {
      Config cfg = preset("tiny", tp);
      cfg.variant = parse_variant(spec);
      const LayerWeights lw = test::random_layer(cfg, 1500 + tp);
      gpu::Runner runner(lw);
      for (int S : {3, 6}) {
        const StepInputs in = test::random_step(cfg, {S, contexts("mixed", S, 90 + S + tp), 1, uint64_t(S * 17 + tp)});
        CHECK(check_step(runner, lw, in, std::string("router variant ") + spec + " tiny tp" + std::to_string(tp) + " S=" + std::to_string(S)));
      }
      // the stage twin on the reference's inputs
      const StepInputs in = test::random_step(cfg, {4, contexts("medium", 4, 7), 1, 11});
      const StepResult ref = run_step(lw, in);
      RouterOut d;
      gpu::route_scores(d, ref.ranks[0].a, in.shared.h_in, lw.ranks[0], 4, cfg);
      CHECK(d.logit == ref.ranks[0].router.logit);
      CHECK(d.sig == ref.ranks[0].router.sig);
      CHECK(d.key == ref.ranks[0].router.key);
    }
  }
}

// Pad rows out of the wide MoE (V2, moe.wide_live_rows = exclude_pad), aiter's whole set
// (V1 + V2) and ATOM's (V2 + V3's per-expert wide down + V5.1's narrow final sum): wide steps
// with pad rows, whose routed slots are no expert's use, and narrow ones.
TEST_CASE("pad rows out of the wide MoE") {
  for (const char* spec : {"moe.wide_live_rows=exclude_pad", "aiter", "atom", "moe.wide_down_order=per_expert"}) {
    for (int tp : {1, 2}) {
      Config cfg = preset("tiny", tp);
      cfg.variant = parse_variant(spec);
      const LayerWeights lw = test::random_layer(cfg, 1600 + tp);
      gpu::Runner runner(lw);
      for (int S : {4, 7, 12}) {
        std::vector<int> seq = contexts("mixed", S, 110 + S + tp);
        seq[1] = 0, seq[size_t(S) - 1] = 0;  // two pad rows
        const StepInputs in = test::random_step(cfg, {S, seq, 1, uint64_t(S * 19 + tp)});
        CHECK(check_step(runner, lw, in, std::string(spec) + " tiny tp" + std::to_string(tp) + " S=" + std::to_string(S)));
      }
      // the stage twins on the reference's inputs (the route's live rows)
      std::vector<int> seq = contexts("medium", 6, 3);
      seq[2] = 0;
      const StepInputs in = test::random_step(cfg, {6, seq, 1, 12});
      const StepResult ref = run_step(lw, in);
      const RankResult& h = ref.ranks[0];
      MoeOut d;
      gpu::experts_up_gate(d, h.route, h.router, *lw.experts, 0, 6, cfg);
      CHECK(d.mid8 == h.moe.mid8);
      CHECK(d.midsc == h.moe.midsc);
      CHECK(d.gate == h.moe.gate);
      MoeOut down_in = h.moe;
      gpu::experts_down(down_in, h.route, *lw.experts, 0, 6, cfg);
      CHECK(down_in.partial == h.moe.partial);
    }
  }
}

// Indexer context parallelism (index.cp = on, docs/numerics.md V6.2), TP 4: rows of 287, 288
// (short: the threshold is n_blk > 288), 289, 290, 300, 513 and 4096 blocks, q_len 2 requests
// whose last row crosses 288, a pad row; init_blocks 0 (the selection equals the one-head
// path's, long_row differs), 2 and 3 (ranks below init_blocks: own0 by the never-negative mod;
// blocks below init_blocks no candidate, where the one-head path pins them), every rank's own
// scores (each selects its own set). Whole steps and the index stage twin, bit for bit.
TEST_CASE("indexer context parallelism") {
  const int B = 128;  // tiny's sparse_block
  const std::vector<int> rows1 = {287 * B, 288 * B, 288 * B + 1, 289 * B + 5, 300 * B, 513 * B, 4096 * B - 3, 0};
  const std::vector<int> rows2 = {288 * B, 288 * B + 1, 287 * B, 288 * B, 299 * B, 300 * B, 1000 * B, 1000 * B + 1};
  for (int init : {0, 2, 3}) {
    Config cfg = preset("tiny", 4);
    cfg.variant = parse_variant("index.cp=on");
    cfg.init_blocks = init;
    cfg.validate();
    REQUIRE(cfg.sparse_block == B);
    Config one_head = cfg;
    one_head.variant.index_cp = false;
    const LayerWeights lw = test::random_layer(cfg, 1700 + init);
    gpu::Runner runner(lw);
    for (int q_len : {1, 2}) {
      const std::vector<int>& seq = q_len == 1 ? rows1 : rows2;
      const int S = int(seq.size());
      const StepInputs in = test::random_step(cfg, {S, seq, q_len, uint64_t(1700 + 10 * init + q_len)});
      const StepResult ref = run_step(lw, in);
      const std::string what = "index.cp tiny tp4 init " + std::to_string(init) + " q_len " + std::to_string(q_len);
      // the case proves something: the CP rows' long_row flags, and (init > 0) blocks below
      // init_blocks never selected on the CP path while the one-head path selects them
      int cp_rows = 0, init_selected = 0;
      for (int r = 0; r < cfg.tp; ++r) {
        const RankResult& h = ref.ranks[size_t(r)];
        IndexOut oh;
        select_blocks(oh, in.shared, in.ranks[size_t(r)].index_scores, one_head);
        for (int k = 0; k < S; ++k) {
          const int last = (k / q_len) * q_len + q_len - 1;
          const int n_last = (std::max(seq[size_t(last)], 1) + B - 1) / B;
          CHECK(int(h.index.long_row[size_t(k)]) == (n_last > 288 ? 1 : 0));
          if (!h.index.long_row[size_t(k)]) continue;
          cp_rows += r == 0;
          for (int i = 0; i < cfg.topk_blocks; ++i) {
            CHECK(h.index.blocks[size_t(k) * cfg.topk_blocks + i] >= init);
            init_selected += oh.blocks[size_t(k) * cfg.topk_blocks + i] >= 0 && oh.blocks[size_t(k) * cfg.topk_blocks + i] < init;
          }
        }
      }
      CHECK(cp_rows >= 4);
      if (init > 0) CHECK_MESSAGE(init_selected > 0, what << ": the one-head path selects no block below init_blocks");
      CHECK(check_step(runner, lw, in, what, {}, true, &ref));
      for (int r = 0; r < cfg.tp; ++r) {  // the stage twin (one rank a call, head r's scores)
        IndexOut d;
        gpu::select_blocks(d, in.shared, in.ranks[size_t(r)].index_scores, cfg);
        const IndexOut& h = ref.ranks[size_t(r)].index;
        CHECK_MESSAGE(d.sparse_table == h.sparse_table, what << " twin rank " << r);
        CHECK(d.blocks == h.blocks);
        CHECK(d.n_ctx == h.n_ctx);
        CHECK(d.long_row == h.long_row);
      }
    }
  }
}

// The stage twins (k4::gpu::select_blocks, ...: the replay entry points) on the reference's
// own inputs reproduce each reference stage's outputs.
TEST_CASE("stage twins") {
  for (const char* pname : {"tiny", "small"}) {
    for (int S : {3, 9}) {
      const Config cfg = preset(pname, 2);
      const LayerWeights lw = test::random_layer(cfg, 300 + S);
      const StepInputs in = test::random_step(cfg, {S, contexts("mixed", S, S), 1, uint64_t(S) + 40});
      const StepResult ref = run_step(lw, in);
      StepResult dev;
      dev.ranks.resize(cfg.tp);
      for (int r = 0; r < cfg.tp; ++r) {
        const RankResult& h = ref.ranks[r];
        RankResult& d = dev.ranks[r];
        gpu::select_blocks(d.index, in.shared, in.ranks[r].index_scores, cfg);
        gpu::split_attention(d.split, in.shared, in.ranks[r], h.index, cfg);
        gpu::merge_partitions(d.merge, h.split, S, cfg);
        gpu::o_proj_partials(d.oproj, h.merge, lw.ranks[r], S, cfg);
        gpu::residual_add(d.h_mid, h.a, in.shared.h_in);
        gpu::route_scores(d.router, h.a, in.shared.h_in, lw.ranks[r], S, cfg);
        gpu::route_top4(d.route, h.router, S, cfg);
        gpu::experts_up_gate(d.moe, h.route, h.router, *lw.experts, r, S, cfg);
        MoeOut down_in = h.moe;
        gpu::experts_down(down_in, h.route, *lw.experts, r, S, cfg);
        d.moe.partial = down_in.partial;
      }
      std::vector<const std::vector<uint16_t>*> parts, ffn;
      for (int r = 0; r < cfg.tp; ++r) parts.push_back(&ref.ranks[r].oproj.partial), ffn.push_back(&ref.ranks[r].moe.partial);
      std::vector<std::vector<uint16_t>> a, ar;
      gpu::all_reduce_rows(a, parts, S, cfg.hidden, true, cfg.ag_rs(S), cfg.o_rows);
      gpu::all_reduce_rows(ar, ffn, S, cfg.hidden, cfg.tp > 1, cfg.ag_rs(S), cfg.dn_rows);
      for (int r = 0; r < cfg.tp; ++r) dev.ranks[r].a = a[r], dev.ranks[r].ar_out = ar[r];
      const Report rep = compare_results(dev, ref, cfg, S);
      if (rep.fields) std::printf("MISMATCH stage twins %s S=%d\n%s  first mismatching stage: %d\n", pname, S,
                                  rep.text.str().c_str(), rep.first_stage);
      CHECK(rep.fields == 0);
    }
  }
}

}  // TEST_SUITE
