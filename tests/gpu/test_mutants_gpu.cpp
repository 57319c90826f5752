// test_mutants_gpu.cpp -- the kill table: every kernel mutant of device/mutants.hpp run against
// the suite's kill cases, each mutant stopped at the first case whose device step differs from
// the reference in any bit (that case, stage, rank, field and element killed it).
//
//   k4_emu_mutants -ts=gpu_mutants                      host emulation, every mutant (ctest
//                                                       k4_emu_mutants/kill-table; scripts/mutants.sh)
//   k4_gpu_tests_mutants -ts=gpu_mutants                the same on the GPU (scripts/gpu-suite.sh mutants)
//   K4_MUTANT_IDS=60,67 ...                             only these mutants
//   K4_MUTANT_TABLE=FILE ...                            also write the table (markdown) to FILE
// The kernels must be a K4_MUTANTS build (every mutant compiled in, chosen at run time); in
// any other build the test only says so. Every case is first checked clean (mutant 0: bit for
// bit the reference, outputs not all zero); the reference runs once a case. A mutant survives
// when no case kills it: the test fails for a survivor that the registry does not argue
// equivalent, and for an "equivalent" one that a case kills (the argument was wrong).
// The cases, cheapest first: the suite's plant probe and sanitizer steps, TP 4 steps on both
// sides of the all-reduce and wide thresholds, boundary contexts (16 and 512 blocks, a request
// crossing 512), the special-value goldens' scenarios (gpu_golden), and the cases written to
// kill what those left alive (each names the mutants it is for).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "device/mutants.hpp"
#include "device/runner.hpp"
#include "golden/inputs/scenario.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/numerics/bf16.hpp"
#include "reference/numerics/keys.hpp"
#include "reference/stages/merge.hpp"
#include "reference/stages/moe.hpp"
#include "reference/stages/oproj.hpp"
#include "reference/model.hpp"
#include "tests/cpu/fixtures.hpp"

namespace {

using namespace k4;

// ------------------------------------------------------------------ first differing bit
struct FirstDiff {
  bool found = false;
  int stage = -1, rank = -1;
  std::string field;
  size_t index = 0;
  uint32_t device = 0, reference = 0;
  std::string text() const {
    if (!found) return "";
    char buf[160];
    std::snprintf(buf, sizeof buf, "stage %d rank %d %s[%zu]: device 0x%08" PRIx32 " reference 0x%08" PRIx32, stage, rank,
                  field.c_str(), index, device, reference);
    return buf;
  }
};

uint32_t word(float v) { return f32_bits(v); }
uint32_t word(uint16_t v) { return v; }
uint32_t word(uint8_t v) { return v; }
uint32_t word(int32_t v) { return uint32_t(v); }

template <class T>
bool diff_field(FirstDiff& fd, int stage, int rank, const char* name, const std::vector<T>& d, const std::vector<T>& h) {
  const size_t n = d.size() < h.size() ? d.size() : h.size();
  for (size_t i = 0; i < n; ++i)
    if (word(d[i]) != word(h[i])) {
      fd = FirstDiff{true, stage, rank, name, i, word(d[i]), word(h[i])};
      return true;
    }
  if (d.size() != h.size()) {
    fd = FirstDiff{true, stage, rank, std::string(name) + " (size)", n, uint32_t(d.size()), uint32_t(h.size())};
    return true;
  }
  return false;
}

// Stage by stage, rank by rank: the lowest stage that differs, its lowest rank, first field.
FirstDiff first_diff(const StepResult& dev, const StepResult& ref) {
  FirstDiff fd;
  if (dev.ranks.size() != ref.ranks.size()) {
    fd.found = true, fd.stage = 0, fd.field = "ranks";
    return fd;
  }
  for (int stage = 0; stage <= 5; ++stage)
    for (size_t r = 0; r < ref.ranks.size(); ++r) {
      const RankResult &d = dev.ranks[r], &h = ref.ranks[r];
      const int rk = int(r);
#define K4_F(st, f) \
  if (stage == st && diff_field(fd, st, rk, #f, d.f, h.f)) return fd;
      K4_F(0, index.sparse_table) K4_F(0, index.blocks) K4_F(0, index.n_ctx) K4_F(0, index.long_row)
      K4_F(1, split.q8) K4_F(1, split.o) K4_F(1, split.m) K4_F(1, split.l)
      K4_F(2, merge.attn) K4_F(2, merge.attn8) K4_F(2, merge.x_scale)
      K4_F(3, oproj.partial) K4_F(3, a) K4_F(3, h_mid)
      K4_F(4, router.xn) K4_F(4, router.xn8) K4_F(4, router.xsc) K4_F(4, router.rstd) K4_F(4, router.logit)
      K4_F(4, router.sig) K4_F(4, router.key)
      K4_F(5, route.ids) K4_F(5, route.weights) K4_F(5, moe.gate) K4_F(5, moe.up) K4_F(5, moe.mid) K4_F(5, moe.mid8)
      K4_F(5, moe.midsc) K4_F(5, moe.partial) K4_F(5, ar_out)
#undef K4_F
    }
  return fd;
}

template <class T>
bool any_nonzero(const std::vector<T>& v) {
  for (const T& x : v)
    if (word(x) != 0) return true;
  return false;
}

// ------------------------------------------------------------------------ the cases
struct Layer {
  std::shared_ptr<LayerWeights> w;
  std::shared_ptr<gpu::Runner> runner;
};

// A stage twin's check: the device stage (k4::gpu::<stage>) on crafted inputs against the
// reference stage; `live` says the reference's outputs are not all zero.
struct TwinResult {
  FirstDiff diff;
  bool live = false;
};

// A kill case: one device step against its reference (layer, in, opt), or a stage twin.
struct KillCase {
  std::string name;
  Layer layer;
  StepInputs in;
  gpu::RunOptions opt;
  StepResult ref;
  std::function<TwinResult()> twin;
};

Layer make_layer(LayerWeights w) {
  Layer l;
  l.w = std::make_shared<LayerWeights>(std::move(w));
  l.runner = std::make_shared<gpu::Runner>(*l.w);
  return l;
}

// Experts of a base source with edits (rank, e, weights) applied: crafted weights for a case.
class EditedExperts : public ExpertSource {
 public:
  using Edit = std::function<void(int rank, int e, ExpertWeights& w)>;
  EditedExperts(std::shared_ptr<const ExpertSource> base, Edit edit) : base_(std::move(base)), edit_(std::move(edit)) {}
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    auto w = std::make_shared<ExpertWeights>(*base_->expert(rank, e));
    edit_(rank, e, *w);
    return w;
  }

 private:
  std::shared_ptr<const ExpertSource> base_;
  Edit edit_;
};

struct CaseList {
  std::vector<KillCase> cases;
  void twin(const std::string& name, std::function<TwinResult()> f) {
    KillCase c;
    c.name = name, c.twin = std::move(f);
    cases.push_back(std::move(c));
  }
  void add(const std::string& name, const Layer& l, StepInputs in, int ar_form = -1) {
    KillCase c;
    c.name = name, c.layer = l, c.in = std::move(in), c.opt.ar_form = ar_form;
    cases.push_back(std::move(c));
  }
  // a golden scenario of gpu_golden, its weights synthetic and injected as k4 golden makes them
  void scenario(const std::string& name, const char* preset_name, int tp, Scenario s, uint64_t seed) {
    Config cfg = preset(preset_name, tp);
    apply_scenario(s, cfg);
    validate_scenario(s, cfg);
    LayerWeights w = synth::synthetic_layer(cfg, seed);
    apply_weight_injections(w, s);
    StepInputs in = make_inputs(cfg, s, seed, &w);
    add(name, make_layer(std::move(w)), std::move(in));
  }
};

Scenario scn(int S, std::vector<std::string> ctx) {
  Scenario s;
  s.tokens = S;
  s.context.clear();
  for (int k = 0; ctx.size() > 1 && k < S; ++k) s.context.push_back(ctx[size_t(k) % ctx.size()]);
  if (ctx.size() == 1) s.context = ctx;
  return s;
}

// ----------------------------------------------------------- the cases for the survivors
// Each closes mutants the suite's cases above left alive (named in its comment).

// Mutant 6: a scored short row and a long row whose scores are all +0 (even blocks) and -0
// (odd): the seed orders -0 == +0, ties to the higher id.
void add_signed_zero_ties(CaseList& L) {
  const Config cfg = preset("tiny", 1);
  StepInputs in = test::random_step(cfg, {2, {2560, 70000}, 1, 41});
  const StepShared& sh = in.shared;
  for (StepRank& R : in.ranks)
    for (int k = 0; k < sh.tokens; ++k)
      for (int b = 0; b < sh.score_width; ++b) R.index_scores[size_t(k) * sh.score_width + b] = b % 2 ? -0.0f : 0.0f;
  L.add("index: +0 / -0 score ties", make_layer(test::random_layer(cfg, 41)), std::move(in));
}

// Mutant 16: a NaN V code (every dim) at the first key past each row's context, in its last
// (partly valid) page: the seed masks those bytes.
void add_nan_v_past_context(CaseList& L) {
  const Config cfg = preset("tiny", 1);
  StepInputs in = test::random_step(cfg, {2, {300, 1000}, 1, 42});
  const StepShared& sh = in.shared;
  StepRank& R = in.ranks[0];
  const size_t page_bytes = size_t(cfg.page) * cfg.head_dim;
  for (int k = 0; k < sh.tokens; ++k) {
    const int key = sh.seq_lens[size_t(k)], b = key / cfg.sparse_block, kb = key % cfg.sparse_block;
    const size_t page = size_t(sh.block_table[size_t(k) * sh.bt_width + b]) * cfg.kv_page_stride + kb / cfg.page;
    for (int d = 0; d < cfg.head_dim; ++d) R.v_cache[page * page_bytes + size_t(d) * cfg.page + kb % cfg.page] = 0x7F;
  }
  L.add("split: NaN V codes past n_ctx", make_layer(test::random_layer(cfg, 42)), std::move(in));
}

// Mutants 48, 51: a g_post of +Inf (xn +-Inf: MXFP8 clamps it to 448) and a -NaN bias (keyed
// by its own sign, R4.10: below all, never picked; mutant 51's canonical +NaN is every
// token's first pick).
void add_router_specials(CaseList& L) {
  const Config cfg = preset("tiny", 2);
  LayerWeights w = test::random_layer(cfg, 43);
  for (RankWeights& r : w.ranks) {
    r.g_post[5] = 0x7F80;
    r.bias[7] = f32_from_bits(0xFFC00000u);
  }
  StepInputs in = test::random_step(cfg, {3, {300, 1000, 2000}, 1, 43});
  L.add("router: g_post +Inf, a -NaN bias", make_layer(std::move(w)), std::move(in));
}

// Mutants 59, 76: the shared expert's gate row 0 with E8M0 scales 0 (2^-127: subnormal block
// results) and gate row 1 with a NaN scale (a NaN mid element, finite route weights).
void add_shared_expert_scales(CaseList& L) {
  const Config cfg = preset("tiny", 1);
  LayerWeights w = test::random_layer(cfg, 44);
  const int KB = cfg.hidden / 32, shared = cfg.n_routed;
  w.experts = std::make_shared<EditedExperts>(w.experts, [=](int, int e, ExpertWeights& x) {
    if (e != shared) return;
    for (int b = 0; b < KB; ++b) x.s13[size_t(b)] = 0x00;
    x.s13[size_t(KB)] = 0xFF;
  });
  StepInputs in = test::random_step(cfg, {3, {300, 1000, 2000}, 1, 44});
  L.add("experts: shared expert s13 scales 0 and NaN", make_layer(std::move(w)), std::move(in));
}

// Mutant 68: inter 384 (3 chunks a slot, so the narrow shared chain pads quarter 3 with chunk
// 2 times 0) and the shared expert's chunk-2 s2 scales 2^127: that unit overflows to +-Inf,
// Inf * 0 = NaN in the seed.
void add_narrow_shared_padding(CaseList& L) {
  Config cfg = preset("tiny", 1);
  cfg.inter = 384;
  cfg.validate();
  LayerWeights w = test::random_layer(cfg, 45);
  const int IB = cfg.inter / 32, shared = cfg.n_routed;
  w.experts = std::make_shared<EditedExperts>(w.experts, [=](int, int e, ExpertWeights& x) {
    if (e != shared) return;
    for (int row = 0; row < cfg.hidden; ++row)
      for (int b = 8; b < 12; ++b) x.s2[size_t(row) * IB + b] = 254;
  });
  StepInputs in = test::random_step(cfg, {3, {300, 1000, 2000}, 1, 45});
  L.add("experts: inter 384, narrow shared padding meets an Inf unit", make_layer(std::move(w)), std::move(in));
}

// Mutant 27: the merge twin on a row whose attention is tiny: partition 0 dominates (m = 0)
// with o = 0, partition 1 (m = -88, o ~ 1) weighs e^-88, so amax ~ 1e-38, x_scale's rcp is
// +Inf and a * inv = +-Inf, which the seed's convert makes NaN.
void add_merge_tiny_row(CaseList& L) {
  const Config cfg = preset("tiny", 1);
  L.twin("merge twin: a tiny attention row", [cfg] {
    const int NS = cfg.n_split, H = cfg.heads, OK = cfg.o_k();
    SplitOut sp;
    sp.q8.assign(size_t(OK), 0);
    sp.o.assign(size_t(NS) * OK, 0);
    sp.m.assign(size_t(NS) * H, -3.4e38f);
    sp.l.assign(size_t(NS) * H, 256.0f);
    test::Rng rng(46);
    for (int d = 0; d < OK; ++d) sp.o[size_t(OK) + d] = bf16_bits_rne(float(rng.uniform() * 2.0 - 1.0));
    for (int h = 0; h < H; ++h) {
      sp.m[size_t(h)] = 0.0f, sp.l[size_t(h)] = 1.0f;
      sp.m[size_t(H) + h] = -88.0f, sp.l[size_t(H) + h] = 1.0f;
    }
    MergeOut ref, dev;
    merge_partitions(ref, sp, 1, cfg);
    gpu::merge_partitions(dev, sp, 1, cfg);
    TwinResult t;
    t.live = any_nonzero(ref.attn) && any_nonzero(ref.attn8);
    diff_field(t.diff, 2, 0, "merge.attn", dev.attn, ref.attn) || diff_field(t.diff, 2, 0, "merge.attn8", dev.attn8, ref.attn8) ||
        diff_field(t.diff, 2, 0, "merge.x_scale", dev.x_scale, ref.x_scale);
    return t;
  });
}

// Mutant 56: the route twin with every sigmoid 0 (the keys from the biases alone): the seed's
// weights are 0 * (2 / max(0, 1e-20)) = 0.
void add_route_zero_sigmoids(CaseList& L) {
  const Config cfg = preset("tiny", 1);
  L.twin("route twin: four zero sigmoids", [cfg] {
    const int S = 2, E = cfg.n_routed;
    RouterOut r;
    r.sig.assign(size_t(S) * E, 0.0f);
    r.key.resize(size_t(S) * E);
    test::Rng rng(47);
    for (int e = 0; e < E; ++e) r.sig[size_t(E) + e] = float(rng.uniform());  // token 1: ordinary
    for (int k = 0; k < S; ++k)
      for (int e = 0; e < E; ++e) r.key[size_t(k) * E + e] = route_key(r.sig[size_t(k) * E + e] + 0.01f * float((e * 7) % E), e);
    RouteOut ref, dev;
    route_top4(ref, r, S, cfg);
    gpu::route_top4(dev, r, S, cfg);
    TwinResult t;
    t.live = any_nonzero(ref.weights);
    diff_field(t.diff, 5, 0, "route.ids", dev.ids, ref.ids) || diff_field(t.diff, 5, 0, "route.weights", dev.weights, ref.weights);
    return t;
  });
}

// Mutant 35: the all-reduce twin, TP 4, whose rank 1 and 2 partials cancel (P2 = -P1, both
// 2^10 times rank 0's): the sum's order shows in its bf16.
void add_allreduce_cancel(CaseList& L) {
  L.twin("all-reduce twin: cancelling ranks, TP 4", [] {
    const int S = 2, HID = 2048, W = 4;
    std::vector<std::vector<uint16_t>> p(W, std::vector<uint16_t>(size_t(S) * HID));
    test::Rng rng(48);
    for (size_t i = 0; i < p[0].size(); ++i) {
      p[0][i] = bf16_bits_rne(float(rng.uniform() * 2.0 - 1.0));
      p[1][i] = bf16_bits_rne(float((rng.uniform() * 2.0 - 1.0) * 1024.0));
      p[2][i] = uint16_t(p[1][i] ^ 0x8000u);
      p[3][i] = bf16_bits_rne(float(rng.uniform() * 2.0 - 1.0));
    }
    std::vector<const std::vector<uint16_t>*> parts;
    for (const auto& v : p) parts.push_back(&v);
    std::vector<std::vector<uint16_t>> ref, dev;
    all_reduce_rows(ref, parts, S, HID, true, false, 32);
    gpu::all_reduce_rows(dev, parts, S, HID, true, false, 32);
    TwinResult t;
    t.live = any_nonzero(ref[0]);
    for (int r = 0; r < W && !t.diff.found; ++r) diff_field(t.diff, 3, r, "a", dev[size_t(r)], ref[size_t(r)]);
    return t;
  });
}

// Mutants 71, 74: the down twin, S = 5 (wide), every token routed to experts 1 and 2 with
// equal weights and equal mid rows, expert 2's w2 the negation of expert 1's, both 2^20
// larger than the rest: their units cancel exactly only when adjacent in one chain (narrow).
// Expert 3's units cancel inside: block 2 is block 0 negated (same mid block and scale,
// 2^20 larger than blocks 1 and 3), so the block order shows.
void add_down_cancel(CaseList& L) {
  const Config cfg = preset("tiny", 1);
  auto base = test::random_layer(cfg, 49).experts;
  const int IB = cfg.inter / 32, I2 = cfg.inter / 2;
  auto src = std::make_shared<EditedExperts>(base, [=](int rank, int e, ExpertWeights& x) {
    if (e == 2) x = *base->expert(rank, 1);
    if (e == 1 || e == 2)
      for (size_t i = 0; i < x.s2.size(); ++i) x.s2[i] = uint8_t(std::min(int(x.s2[i]) + 20, 254));
    if (e == 2)
      for (uint8_t& b : x.w2) b ^= 0x88;  // every E2M1 nibble negated
    if (e == 3)
      for (int row = 0; row < cfg.hidden; ++row) {
        for (int j = 0; j < 16; ++j) x.w2[size_t(row) * I2 + 32 + j] = uint8_t(x.w2[size_t(row) * I2 + j] ^ 0x88);
        x.s2[size_t(row) * IB + 2] = x.s2[size_t(row) * IB + 0] = uint8_t(std::min(int(x.s2[size_t(row) * IB + 0]) + 20, 254));
      }
  });
  L.twin("down twin: cancelling units and blocks, S = 5", [cfg, src] {
    const int S = 5, SL = cfg.moe_slots(), I = cfg.inter, IB = I / 32;
    test::Rng rng(50);
    RouteOut route;
    route.ids.resize(size_t(S) * SL), route.weights.resize(size_t(S) * SL);
    MoeOut mo;
    mo.mid8.resize(size_t(S) * SL * I), mo.midsc.resize(size_t(S) * SL * IB);
    for (int k = 0; k < S; ++k) {
      const int ids[5] = {1, 2, 3, 4 + k, cfg.n_routed};
      const float w[5] = {0.5f, 0.5f, 0.25f, float(rng.uniform()), 1.0f};
      for (int s = 0; s < SL; ++s) route.ids[size_t(k) * SL + s] = ids[s], route.weights[size_t(k) * SL + s] = w[s];
      for (int s = 0; s < SL; ++s)
        for (int i = 0; i < I; ++i) {
          uint8_t c = uint8_t(rng.below(256));
          if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN code
          mo.mid8[(size_t(k) * SL + s) * I + i] = c;
        }
      for (int s = 0; s < SL; ++s)
        for (int b = 0; b < IB; ++b) mo.midsc[(size_t(k) * SL + s) * IB + b] = uint8_t(118 + rng.below(6));
      for (int i = 0; i < I; ++i) mo.mid8[(size_t(k) * SL + 1) * I + i] = mo.mid8[(size_t(k) * SL + 0) * I + i];
      for (int b = 0; b < IB; ++b) mo.midsc[(size_t(k) * SL + 1) * IB + b] = mo.midsc[(size_t(k) * SL + 0) * IB + b];
      for (int i = 0; i < 32; ++i) mo.mid8[(size_t(k) * SL + 2) * I + 64 + i] = mo.mid8[(size_t(k) * SL + 2) * I + i];
      mo.midsc[(size_t(k) * SL + 2) * IB + 2] = mo.midsc[(size_t(k) * SL + 2) * IB + 0];
    }
    MoeOut ref = mo, dev = mo;
    experts_down(ref, route, *src, 0, S, cfg);
    gpu::experts_down(dev, route, *src, 0, S, cfg);
    TwinResult t;
    t.live = any_nonzero(ref.partial);
    diff_field(t.diff, 5, 0, "moe.partial", dev.partial, ref.partial);
    return t;
  });
}

// Mutants 77-82 (index.cp = on, docs/numerics.md V6.2): the index stage twin at TP 4 on rows of
// 287 .. 4096 blocks (288: short, 289: long; 300: long only under CP), init_blocks 2 (rank 0 and
// 1 below it: own0 by the never-negative mod, blocks 0 and 1 no candidate) and 0.
void add_index_cp(CaseList& L) {
  for (int init : {2, 0}) {
    Config cfg = preset("tiny", 4);
    cfg.variant.index_cp = true;
    cfg.init_blocks = init;
    cfg.validate();
    const int B = cfg.sparse_block;
    const StepInputs in =
        test::random_step(cfg, {6, {287 * B, 288 * B, 288 * B + 1, 300 * B + 7, 1000 * B, 4096 * B - 1}, 1, uint64_t(51 + init)});
    L.twin("index.cp twin: 287 .. 4096 blocks, init_blocks " + std::to_string(init), [cfg, in] {
      TwinResult t;
      for (int r = 0; r < cfg.tp && !t.diff.found; ++r) {
        IndexOut ref, dev;
        select_blocks(ref, in.shared, in.ranks[size_t(r)].index_scores, cfg);
        gpu::select_blocks(dev, in.shared, in.ranks[size_t(r)].index_scores, cfg);
        t.live = t.live || any_nonzero(ref.sparse_table);
        diff_field(t.diff, 0, r, "index.sparse_table", dev.sparse_table, ref.sparse_table) ||
            diff_field(t.diff, 0, r, "index.blocks", dev.blocks, ref.blocks) ||
            diff_field(t.diff, 0, r, "index.n_ctx", dev.n_ctx, ref.n_ctx) ||
            diff_field(t.diff, 0, r, "index.long_row", dev.long_row, ref.long_row);
      }
      return t;
    });
  }
}

void add_closers(CaseList& L) {
  add_index_cp(L);
  add_signed_zero_ties(L);
  add_nan_v_past_context(L);
  add_router_specials(L);
  add_shared_expert_scales(L);
  add_narrow_shared_padding(L);
  add_merge_tiny_row(L);
  add_route_zero_sigmoids(L);
  add_allreduce_cancel(L);
  add_down_cancel(L);
}

std::vector<KillCase> kill_cases() {
  CaseList L;
  {  // the suite's plant probe (gpu_stages): long, short, pad, scored; wide MoE, TP 2
    const Config cfg = preset("tiny", 2);
    const Layer l = make_layer(test::random_layer(cfg, 11 * 31 + 7));
    L.add("plant probe", l, test::random_step(cfg, {5, {70000, 300, 0, 20000, 2000}, 1, 11}));
  }
  {  // the sanitizer case: narrow + plain, wide + reduce-scatter
    const Config cfg = preset("tiny", 2);
    const Layer l = make_layer(test::random_layer(cfg, 5));
    L.add("sanitizer S=3 plain", l, test::random_step(cfg, {3, {70000, 0, 300}, 1, 3}), 0);
    L.add("sanitizer S=6 reduce-scatter", l, test::random_step(cfg, {6, {70000, 0, 300, 20000, 2100, 5}, 1, 6}), 1);
  }
  {  // TP 4: rank order; S = 4 narrow (wide from 4?), S = 12 reduce-scatter
    const Config cfg = preset("tiny", 4);
    const Layer l = make_layer(test::random_layer(cfg, 77));
    L.add("tp4 S=4", l, test::random_step(cfg, {4, {20000, 1, 2100, 300}, 1, 4}));
    L.add("tp4 S=12", l, test::random_step(cfg, {12, {70000, 0, 300, 20000, 2100, 5, 900, 40000, 1, 2047, 2049, 128}, 1, 12}));
  }
  {  // boundaries: 16 blocks (id order) and 17 (scored); a q_len 4 request whose last row has
     // 513 blocks (all rows long, the first two own only 512) and one whose last has 512 (short)
    const Config cfg = preset("tiny", 1);
    const Layer l = make_layer(test::random_layer(cfg, 31));
    L.add("boundary: 16 / 17 blocks", l, test::random_step(cfg, {4, {2048, 2049, 1920, 1}, 1, 21}));
    L.add("boundary: 512 / 513 blocks, q_len 4", l,
          test::random_step(cfg, {8, {65535, 65536, 65537, 65538, 65533, 65534, 65535, 65536}, 4, 22}));
  }
  // the gpu_golden scenarios with special values
  {
    Scenario s = scn(7, {"long", "medium", "short"});
    s.inject.score_ties = true, s.inject.nan_scores = 3, s.inject.neg_zero_scores = 2, s.inject.inf_scores = 2;
    L.scenario("golden: special scores", "tiny", 2, s, 104);
  }
  {
    Scenario s = scn(6, {"long", "short", "medium"});
    s.inject.special_q = true, s.inject.special_h_in = true, s.inject.special_kv = true, s.inject.zero_attn_rows = {4};
    L.scenario("golden: special q, h_in, kv; zero attention row", "tiny", 2, s, 107);
  }
  {
    Scenario s = scn(4, {"short", "medium"});
    s.inject.special_weights = true;
    L.scenario("golden: special weights", "tiny", 2, s, 108);
  }
  {
    Scenario s = scn(3, {"short"});
    s.inject.nan_weight = "w_o";
    L.scenario("golden: a NaN in w_o", "tiny", 2, s, 109);
  }
  {
    Scenario s = scn(3, {"medium"});
    s.inject.nan_weight = "w_gate";
    L.scenario("golden: a NaN in w_gate", "tiny", 1, s, 110);
  }
  {
    Scenario s = scn(9, {"long", "short"});
    s.inject.extreme_q = true, s.inject.extreme_kv = true, s.inject.huge_residual = true, s.inject.zero_rows = {2, 5};
    L.scenario("golden: extreme q, kv, residual; zero rows", "tiny", 1, s, 105);
  }
  {  // R5.14 (mutant 67): a wide step whose distinct experts' NaN s2 scales meet the zero
     // mid rows of the tokens not routed to them
    Scenario s = scn(6, {"long", "short", "medium"});
    s.inject.nan_weight = "s2";
    L.scenario("golden: wide step, NaN s2 scales meet zero rows", "tiny", 2, s, 114);
  }
  add_closers(L);
  std::vector<KillCase> v = std::move(L.cases);
  return v;
}

std::vector<int> selected_ids() {
  std::vector<int> ids;
  const char* e = std::getenv("K4_MUTANT_IDS");
  if (e != nullptr && *e != '\0') {
    std::stringstream ss(e);
    std::string item;
    while (std::getline(ss, item, ',')) ids.push_back(std::atoi(item.c_str()));
    return ids;
  }
  // a mutant of a tensor-core kernel (*_fast.cu) is live only on that path (K4_FAST=1), the
  // others only on the reference kernels' (stage 5's down assembly in moe.cu runs on both)
  const char* fast_env = std::getenv("K4_FAST");
  const bool fast = fast_env != nullptr && fast_env[0] == '1';
  for (const gpu::MutantInfo& m : gpu::kMutants)
    if ((std::string(m.file).find("_fast.cu") != std::string::npos) == fast) ids.push_back(m.id);
  return ids;
}

// Argued equivalent here: always, or on an NVIDIA GPU (device_name names the CUDA platform).
bool is_equivalent(const gpu::MutantInfo& m) {
  static const bool cuda = gpu::device_name().find("cuda") != std::string::npos;
  return *m.equivalent != '\0' || (cuda && *m.cuda_equivalent != '\0');
}
const char* equivalence_reason(const gpu::MutantInfo& m) { return *m.equivalent ? m.equivalent : m.cuda_equivalent; }

const gpu::MutantInfo* find_mutant(int id) {
  for (const gpu::MutantInfo& m : gpu::kMutants)
    if (m.id == id) return &m;
  return nullptr;
}

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct Row {
  const gpu::MutantInfo* m;
  std::string killer;  // the case, or "" (survived)
  FirstDiff diff;
  std::string error;   // the device step threw
  double seconds = 0;
};

std::string md_escape(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '|' ? std::string("\\|") : std::string(1, c);
  return o;
}

std::string table_markdown(const std::vector<Row>& rows, int n_cases, const std::string& device) {
  std::ostringstream o;
  int killed = 0, equiv = 0, survived = 0;
  for (const Row& r : rows) {
    if (!r.killer.empty()) ++killed;
    else if (is_equivalent(*r.m)) ++equiv;
    else ++survived;
  }
  o << "Kill table on " << device << ": " << rows.size() << " mutants, " << killed << " killed, " << equiv
    << " equivalent (argued, not killed), " << survived << " survived; " << n_cases << " kill cases.\n\n";
  o << "| id | stage | kind | mutant | rule | killed by | first differing bit |\n";
  o << "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (const Row& r : rows) {
    o << "| " << r.m->id << " | " << r.m->stage << " | " << r.m->kind << " | " << md_escape(r.m->what) << " | "
      << md_escape(r.m->rule) << " | ";
    if (!r.killer.empty()) o << md_escape(r.killer) << " | " << md_escape(r.error.empty() ? r.diff.text() : "threw: " + r.error);
    else if (is_equivalent(*r.m)) o << "equivalent | " << md_escape(equivalence_reason(*r.m));
    else o << "**SURVIVED** | ";
    o << " |\n";
  }
  return o.str();
}

}  // namespace

TEST_SUITE("gpu_mutants") {

TEST_CASE("mutant registry: ids distinct and positive, every field written") {
  std::set<int> ids;
  for (const gpu::MutantInfo& m : gpu::kMutants) {
    CAPTURE(m.id);
    CHECK(m.id > 0);
    CHECK(ids.insert(m.id).second);
    CHECK(*m.stage != '\0');
    CHECK(*m.file != '\0');
    CHECK(*m.kind != '\0');
    CHECK(*m.what != '\0');
    CHECK(std::string(m.rule).find("seed:L") != std::string::npos);
  }
  CHECK(gpu::kMutantCount >= 40);
}

TEST_CASE("mutant kill table") {
  if (!gpu::mutants_switchable()) {
    MESSAGE("not a K4_MUTANTS build (k4_emu_mutants, k4_gpu_tests_mutants): no kill table here");
    return;
  }
  const double t0 = now_s();
  gpu::set_mutant(0);
  std::vector<KillCase> cases = kill_cases();
  // every case clean first: the reference once, then the unmutated kernels bit for bit
  for (KillCase& c : cases) {
    FirstDiff fd;
    bool live = false;
    if (c.twin) {
      const TwinResult t = c.twin();
      fd = t.diff, live = t.live;
    } else {
      c.ref = run_step(*c.layer.w, c.in);
      fd = first_diff(c.layer.runner->run_step(c.in, c.opt), c.ref);
      const RankResult& h = c.ref.ranks[0];
      live = any_nonzero(h.split.o) && any_nonzero(h.merge.attn8) && any_nonzero(h.oproj.partial) &&
             any_nonzero(h.router.xn8) && any_nonzero(h.moe.mid8) && any_nonzero(h.ar_out);
    }
    const std::string clean_msg = c.name + ": the unmutated kernels differ: " + fd.text();
    CHECK_MESSAGE(!fd.found, clean_msg);
    const std::string live_msg = c.name + ": all-zero reference outputs prove nothing";
    CHECK_MESSAGE(live, live_msg);
  }
  std::printf("gpu_mutants: %zu kill cases clean (%.1f s)\n", cases.size(), now_s() - t0);
  std::vector<Row> rows;
  for (int id : selected_ids()) {
    const gpu::MutantInfo* m = find_mutant(id);
    REQUIRE_MESSAGE(m != nullptr, "no mutant " << id << " in device/mutants.hpp");
    Row row{m, "", {}, "", 0};
    const double t1 = now_s();
    gpu::set_mutant(id);
    for (KillCase& c : cases) {
      try {
        row.diff = c.twin ? c.twin().diff : first_diff(c.layer.runner->run_step(c.in, c.opt), c.ref);
      } catch (const std::exception& e) {
        row.error = e.what();
      }
      if (row.diff.found || !row.error.empty()) {
        row.killer = c.name;
        break;
      }
    }
    gpu::set_mutant(0);
    row.seconds = now_s() - t1;
    std::printf("gpu_mutants: mutant %2d %-9s %s: %s%s%s (%.1f s)\n", id, m->stage, m->what,
                row.killer.empty() ? (is_equivalent(*m) ? "not killed (argued equivalent)" : "SURVIVED") : "killed by ",
                row.killer.c_str(), row.killer.empty() ? "" : (": " + (row.error.empty() ? row.diff.text() : row.error)).c_str(),
                row.seconds);
    std::fflush(stdout);
    const bool equivalent = is_equivalent(*m);
    CHECK_MESSAGE(row.killer.empty() == equivalent,
                  "mutant " << id << " (" << m->what << "): "
                            << (equivalent ? "argued equivalent but killed by " + row.killer : std::string("survived every case")));
    rows.push_back(row);
  }
  const std::string md = table_markdown(rows, int(cases.size()), gpu::device_name());
  std::printf("%s", md.c_str());
  if (const char* f = std::getenv("K4_MUTANT_TABLE")) {
    std::ofstream out(f);
    out << md;
    CHECK_MESSAGE(bool(out), "cannot write " << f);
  }
  std::printf("gpu_mutants: %zu mutants in %.1f s\n", rows.size(), now_s() - t0);
}

}  // TEST_SUITE
