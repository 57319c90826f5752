// test_float64.cpp -- the float64 guard: every stage of every rank against the independent
// float64 model (float64_model.hpp states each bound and why), on tiny / small presets over
// seeds, token counts and contexts, and once at full size; then planted errors: one flipped
// output bit, or one perturbed input, per stage, each caught by that stage's comparison
// (a check that cannot fail is a defect).
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "reference/config.hpp"
#include "reference/model.hpp"
#include "tests/cpu/fixtures.hpp"
#include "tests/cpu/float64_model.hpp"

namespace {

namespace f64 = k4::f64;
using k4::LayerWeights;
using k4::StepInputs;
using k4::StepResult;

struct Case {
  std::string preset;
  int tp;
  uint64_t layer_seed;
  std::vector<int> lens;  // one a token
  int q_len;
  uint64_t seed;
};

struct Run {
  const LayerWeights* w;
  StepInputs in;
  StepResult res;
};

Run run_case(const Case& c) {
  Run r;
  r.w = &f64::cached_layer(c.preset, c.tp, c.layer_seed);
  r.in = k4::test::random_step(r.w->cfg, {int(c.lens.size()), c.lens, c.q_len, c.seed});
  r.res = k4::run_step(*r.w, r.in);
  return r;
}

// The shared run the planted errors perturb: tiny, TP 2, S = 3, contexts a scored 3000, a pad
// row (one key) and a scored 5000 (partial tail, 8 live partitions).
const Run& planted_run() {
  static const Run r = run_case({"tiny", 2, 1, {3000, 0, 5000}, 1, 17});
  return r;
}

// Non-trivial outputs: the share of compared values that are nonzero.
void require_nontrivial(const f64::Report& rep, const std::string& name, double share) {
  const f64::Cmp* c = f64::find(rep, name);
  REQUIRE_MESSAGE(c != nullptr, name);
  REQUIRE_MESSAGE(c->n > 0, name);
  CHECK_MESSAGE(double(c->nonzero) / double(c->n) >= share, name, ": only ", c->nonzero, " of ", c->n, " nonzero");
  CHECK_MESSAGE(c->nan == 0, name, ": ", c->nan, " NaN");
}

void check_report(const f64::Report& rep) {
  MESSAGE("\n", f64::describe(rep));
  CHECK_MESSAGE(f64::all_ok(rep), f64::describe(rep));
  require_nontrivial(rep, "split.q8", 0.95);
  require_nontrivial(rep, "split.o", 0.05);
  require_nontrivial(rep, "merge.attn", 0.9);
  require_nontrivial(rep, "merge.attn8", 0.9);
  require_nontrivial(rep, "oproj.partial", 0.9);
  require_nontrivial(rep, "a", 0.9);
  require_nontrivial(rep, "h_mid", 0.9);
  require_nontrivial(rep, "router.xn", 0.9);
  require_nontrivial(rep, "router.logit", 0.9);
  require_nontrivial(rep, "moe.gate", 0.9);
  require_nontrivial(rep, "moe.mid", 0.9);
  require_nontrivial(rep, "moe.partial", 0.9);
  require_nontrivial(rep, "ar_out", 0.9);
}

// ---- planted errors --------------------------------------------------------------------
// The element of largest finite magnitude of a bf16 (uint16_t) or f32 tensor.
template <class T>
size_t largest(const std::vector<T>& v) {
  static_assert(std::is_same_v<T, uint16_t> || std::is_same_v<T, float>, "bf16 bits or f32");
  size_t best = 0;
  double bv = -1;
  for (size_t i = 0; i < v.size(); ++i) {
    double x;
    if constexpr (std::is_same_v<T, uint16_t>) x = std::fabs(f64::bf16(v[i]));
    else x = std::fabs(double(v[i]));
    if (std::isfinite(x) && x > bv) bv = x, best = i;
  }
  return best;
}

template <class T>
void flip(std::vector<T>& v, size_t i, int bit) {
  uint32_t u = 0;
  std::memcpy(&u, &v[i], sizeof(T));
  u ^= 1u << bit;
  std::memcpy(&v[i], &u, sizeof(T));
}

// Flips each bit of element i in turn (restoring it after), runs the stage's check: returns the
// lowest bit whose flip the check catches, requiring every bit from `must_from` up caught, and
// the unflipped tensor to pass.
template <class T>
int sweep_bits(const std::string& what, std::vector<T>& v, size_t i, int must_from, const std::function<f64::Report()>& check) {
  REQUIRE(i < v.size());
  REQUIRE_MESSAGE(f64::all_ok(check()), what, ": the unplanted tensor fails");
  int lowest = -1;
  for (int bit = int(8 * sizeof(T)) - 1; bit >= 0; --bit) {
    flip(v, i, bit);
    const bool caught = !f64::all_ok(check());
    flip(v, i, bit);
    if (caught) lowest = bit;
    if (bit >= must_from) CHECK_MESSAGE(caught, what, ": a flip of bit ", bit, " of element ", i, " is not caught");
  }
  REQUIRE(f64::all_ok(check()));
  return lowest;
}

std::map<std::string, int>& sweep_table() {
  static std::map<std::string, int> t;
  return t;
}

}  // namespace

TEST_SUITE("float64") {

TEST_CASE("the float64 guard: tiny and small presets, token counts 1..13, contexts 1..65538") {
  const std::vector<Case> cases = {
      {"tiny", 4, 1, {3000}, 1, 1},
      {"tiny", 4, 1, {129, 0, 2049, 70}, 1, 2},            // a pad row, a partial block
      {"tiny", 2, 1, {9000, 1, 4000, 333, 2048, 7}, 1, 3},  // wide MoE, scored rows
      {"tiny", 2, 1, {600, 601, 40, 41, 5000, 5001, 800, 801, 90, 91, 3000, 3001, 12}, 1, 4},  // AG_RS form
      {"small", 2, 1, {1500, 7000, 256}, 1, 5},
      {"tiny", 1, 2, {512 * 128 + 1, 512 * 128 + 2}, 2, 6},  // a long request (513 blocks, q_len 2)
  };
  f64::Report total;
  for (const Case& c : cases) {
    const Run r = run_case(c);
    const f64::Report rep = f64::check_step(*r.w, r.in, r.res);
    CAPTURE(c.preset);
    CAPTURE(c.lens.size());
    CHECK_MESSAGE(f64::all_ok(rep), f64::describe(rep));
    f64::merge_into(total, rep);
  }
  check_report(total);
}

TEST_CASE("adversarial inputs: a NaN q8 poisons its token only; NaN bytes past the context never leak") {
  const LayerWeights& w = f64::cached_layer("tiny", 2, 1);
  StepInputs clean = k4::test::random_step(w.cfg, {3, {1000, 300, 2500}, 1, 8});
  // token 1 (300 keys, blocks 0..2): its tail block gets a block entry of its own (a copy of
  // entry 0's pages), so that nothing else reads those pages
  const int stride = w.cfg.kv_page_stride, fresh = clean.ranks[0].n_pages / stride;
  for (k4::StepRank& R : clean.ranks) {
    R.n_pages += stride;
    R.k_cache.insert(R.k_cache.end(), R.k_cache.begin(), R.k_cache.begin() + size_t(stride) * 2048);
    R.v_cache.insert(R.v_cache.end(), R.v_cache.begin(), R.v_cache.begin() + size_t(stride) * 2048);
    R.k_scale.insert(R.k_scale.end(), R.k_scale.begin(), R.k_scale.begin() + size_t(stride) * 16);
    R.v_scale.insert(R.v_scale.end(), R.v_scale.begin(), R.v_scale.begin() + size_t(stride) * 16);
  }
  clean.shared.block_table[size_t(1) * clean.shared.bt_width + 2] = fresh;
  StepInputs bad = clean;
  // token 0: q = 1000 in rank 0's head 3 -> E4M3 NaN (no saturation): head 3's scores NaN,
  // its merged row's amax NaN, so every attn8 code of the token NaN, then the whole token
  bad.ranks[0].q[3 * 128 + 7] = f64::bf16_nearest(1000.0);
  // token 1: every K / V byte and scale of its tail block past key 299 NaN, on both ranks
  for (k4::StepRank& R : bad.ranks)
    for (int j = 0; j < 8; ++j)
      for (int t = 0; t < 16; ++t) {
        if (256 + j * 16 + t < 300) continue;
        const size_t page = size_t(fresh) * stride + j;
        for (int d = 0; d < 128; ++d) R.k_cache[page * 2048 + k4::k_byte(t, d)] = R.v_cache[page * 2048 + k4::v_byte(t, d)] = 0x7F;
        R.k_scale[page * 16 + t] = R.v_scale[page * 16 + t] = std::numeric_limits<float>::quiet_NaN();
      }
  const StepResult r = k4::run_step(w, bad), rc = k4::run_step(w, clean);
  const f64::Report rep = f64::check_step(w, bad, r);
  CHECK_MESSAGE(f64::all_ok(rep), f64::describe(rep));
  const int H = w.cfg.hidden;
  for (const k4::RankResult& R : r.ranks) {
    for (int i = 0; i < H; ++i) REQUIRE(R.ar_out[i] == 0x7FC0);  // token 0: canonical NaN
    // tokens 1 and 2: the bits of the clean run (S = 3: narrow MoE, tokens independent)
    for (size_t i = H; i < R.ar_out.size(); ++i) REQUIRE(R.ar_out[i] == rc.ranks[0].ar_out[i]);
  }
  CHECK(r.ranks[0].merge.attn8[0] == 0x7F);
  CHECK(std::isnan(r.ranks[0].merge.x_scale[0]));
  CHECK(!std::isnan(r.ranks[1].merge.x_scale[0]));  // rank 1's heads are clean until the all-reduce
}

const Run& full_run() {
  static const Run r = run_case({"minimax-m3-tp4", 4, 1, {5000}, 1, 6});  // scored: 40 blocks, a partial tail
  return r;
}

TEST_CASE("the float64 guard at full size (minimax-m3-tp4, TP 4)") {
  const Run& r = full_run();
  check_report(f64::check_step(*r.w, r.in, r.res));
}

TEST_CASE("full size: the reduce-scatter form and one OpenMP thread give the same bits") {
  const Run& r = full_run();
  LayerWeights rs = *r.w;
  rs.cfg.ag_rs_from = 1;
  const std::string d1 = f64::diff_step(r.res, k4::run_step(rs, r.in));
  CHECK_MESSAGE(d1.empty(), d1);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const StepResult one = k4::run_step(*r.w, r.in);
  omp_set_num_threads(saved);
  const std::string d2 = f64::diff_step(r.res, one);
  CHECK_MESSAGE(d2.empty(), d2);
}

TEST_CASE("planted output errors: one flipped bit in any stage's output is caught") {
  const Run& base = planted_run();
  const k4::Config& cfg = base.w->cfg;
  const int S = base.in.shared.tokens, W = cfg.tp;
  StepResult res = base.res;  // perturbed in place, restored by sweep_bits
  k4::RankResult& R = res.ranks[1];
  const k4::RankWeights& rw = base.w->ranks[1];
  const k4::StepRank& rin = base.in.ranks[1];
  const k4::StepShared& sh = base.in.shared;
  auto& tab = sweep_table();
  auto idx = [&] { return f64::check_index(cfg, sh, rin.index_scores, R.index); };
  auto split = [&] { return f64::check_split(cfg, sh, rin, R.index, R.split); };
  auto merge = [&] { return f64::check_merge(cfg, R.split, R.merge, S); };
  auto oproj = [&] { return f64::check_oproj(cfg, R.merge, rw, R.oproj, S); };
  auto router = [&] { return f64::check_router(cfg, R.a, sh.h_in, rw, R.router, S); };
  auto route = [&] { return f64::check_route(cfg, R.router, rw, R.route, S); };
  auto ug = [&] { return f64::check_up_gate(cfg, R.route, R.router, *base.w->experts, 1, R.moe, S); };
  auto mid = [&] { return f64::check_mid(cfg, R.moe, S); };
  auto down = [&] { return f64::check_down(cfg, R.route, *base.w->experts, 1, R.moe, S); };
  auto resid = [&] { return f64::check_residual(R.a, sh.h_in, R.h_mid); };
  auto ptrs = [&](auto member) {
    std::vector<const std::vector<uint16_t>*> p;
    for (int r = 0; r < W; ++r) p.push_back(&member(res.ranks[r]));
    return p;
  };
  auto allreduce_a = [&] {
    return f64::check_all_reduce("a", ptrs([](k4::RankResult& x) -> auto& { return x.oproj.partial; }),
                                 ptrs([](k4::RankResult& x) -> auto& { return x.a; }), true);
  };
  auto allreduce_ffn = [&] {
    return f64::check_all_reduce("ar_out", ptrs([](k4::RankResult& x) -> auto& { return x.moe.partial; }),
                                 ptrs([](k4::RankResult& x) -> auto& { return x.ar_out; }), W > 1);
  };
  // discrete outputs: the lowest bit of an element is enough (exact comparisons)
  tab["index.sparse_table"] = sweep_bits("index.sparse_table", R.index.sparse_table, 3, 0, idx);
  tab["index.blocks"] = sweep_bits("index.blocks", R.index.blocks, 0, 0, idx);
  tab["index.n_ctx"] = sweep_bits("index.n_ctx", R.index.n_ctx, 2, 0, idx);
  tab["split.q8"] = sweep_bits("split.q8", R.split.q8, 77, 0, split);
  tab["merge.attn8"] = sweep_bits("merge.attn8", R.merge.attn8, 1000, 0, merge);
  tab["router.xn8"] = sweep_bits("router.xn8", R.router.xn8, 500, 0, router);
  tab["router.xsc"] = sweep_bits("router.xsc", R.router.xsc, 9, 0, router);
  tab["route.ids"] = sweep_bits("route.ids", R.route.ids, 6, 0, route);
  tab["moe.mid8"] = sweep_bits("moe.mid8", R.moe.mid8, 300, 0, mid);
  tab["moe.midsc"] = sweep_bits("moe.midsc", R.moe.midsc, 5, 0, mid);
  // values: at the element of largest magnitude, every bit from the top mantissa bit up
  // (bf16: 6, f32: 22) must be caught; the lowest caught bit is reported
  tab["split.o"] = sweep_bits("split.o", R.split.o, largest(R.split.o), 6, split);
  tab["split.m"] = sweep_bits("split.m", R.split.m, 17, 22, split);
  tab["split.l"] = sweep_bits("split.l", R.split.l, 17, 22, split);
  tab["merge.attn"] = sweep_bits("merge.attn", R.merge.attn, largest(R.merge.attn), 6, merge);
  tab["merge.x_scale"] = sweep_bits("merge.x_scale", R.merge.x_scale, 2, 22, merge);
  tab["oproj.partial"] = sweep_bits("oproj.partial", R.oproj.partial, largest(R.oproj.partial), 6, oproj);
  tab["a"] = sweep_bits("a", R.a, largest(R.a), 6, allreduce_a);
  tab["h_mid"] = sweep_bits("h_mid", R.h_mid, largest(R.h_mid), 6, resid);
  tab["router.rstd"] = sweep_bits("router.rstd", R.router.rstd, 2, 22, router);
  tab["router.xn"] = sweep_bits("router.xn", R.router.xn, largest(R.router.xn), 6, router);
  tab["router.logit"] = sweep_bits("router.logit", R.router.logit, largest(R.router.logit), 22, router);
  tab["router.sig"] = sweep_bits("router.sig", R.router.sig, largest(R.router.sig), 22, router);
  tab["route.weights"] = sweep_bits("route.weights", R.route.weights, 1, 22, route);
  tab["moe.gate"] = sweep_bits("moe.gate", R.moe.gate, largest(R.moe.gate), 22, ug);
  tab["moe.up"] = sweep_bits("moe.up", R.moe.up, largest(R.moe.up), 22, ug);
  tab["moe.mid"] = sweep_bits("moe.mid", R.moe.mid, largest(R.moe.mid), 6, mid);
  tab["moe.partial"] = sweep_bits("moe.partial", R.moe.partial, largest(R.moe.partial), 6, down);
  tab["ar_out"] = sweep_bits("ar_out", R.ar_out, largest(R.ar_out), 6, allreduce_ffn);
  std::string t = "lowest flipped bit caught (at the largest element; bf16 bit 0..15, f32 0..31, codes 0..7):\n";
  for (const auto& [name, bit] : tab) t += "  " + name + ": " + std::to_string(bit) + "\n";
  MESSAGE(t);
}

// A split.kv_scale mode's step (tiny TP 2, S = 6, one scale a cache) within the float64 guard,
// and rank 1's split with its v scale doubled, then its k scale (the scores), refused.
struct KvModeRun {
  LayerWeights w;
  StepInputs in;
  StepResult res;
};
KvModeRun kv_mode_guard(k4::KvScale mode, std::vector<int> lens, uint64_t seed) {
  KvModeRun r{f64::cached_layer("tiny", 2, 1), {}, {}};
  r.w.cfg.variant.kv_scale = mode;
  r.in = k4::test::random_step(r.w.cfg, {6, lens, 1, seed});
  REQUIRE(r.in.ranks[0].v_scale.size() == 1);
  r.res = k4::run_step(r.w, r.in);
  const f64::Report rep = f64::check_step(r.w, r.in, r.res);
  CHECK_MESSAGE(f64::all_ok(rep), f64::describe(rep));
  require_nontrivial(rep, "split.o", 0.05);
  const k4::RankResult& R = r.res.ranks[1];
  k4::StepRank rin = r.in.ranks[1];
  rin.v_scale[0] *= 2.0f;
  CHECK_FALSE(f64::all_ok(f64::check_split(r.w.cfg, r.in.shared, rin, R.index, R.split)));
  rin = r.in.ranks[1];
  rin.k_scale[0] *= 2.0f;
  CHECK_FALSE(f64::all_ok(f64::check_split(r.w.cfg, r.in.shared, rin, R.index, R.split)));
  return r;
}

TEST_CASE("split.kv_scale = static448 (VARIANTS.md V4.2): the float64 guard of P8 = E4M3(448 p), pscale = v_scale / 448") {
  // a scored 3000, a pad row, a scored 5000 (8 live partitions) and short ones; v_scale
  // 0.05 .. 0.15 (not a power of two: scalar's fold is not 448 there, N8)
  kv_mode_guard(k4::KvScale::static448, {3000, 0, 5000, 700, 129, 2000}, 23);
}

TEST_CASE("split.kv_scale = atom_vllm (VARIANTS.md V4.3): the float64 guard of the key ranges, one or two tiles, P8 = E4M3(p)") {
  // n_ctx 1976 / 2000 (span 247 / 250: splits meeting two 256-key tiles), a pad row (split 0
  // one key, 1..7 no key), 700 and 129 (every split inside tile 0..2, some empty)
  const KvModeRun run = kv_mode_guard(k4::KvScale::atom_vllm, {3000, 0, 2000, 700, 129, 5000}, 29);
  const LayerWeights& w = run.w;
  const StepInputs& in = run.in;
  const StepResult& res = run.res;
  int two_tiles = 0;  // the case meets the factor
  for (int k = 0; k < 6; ++k) {
    const int n_ctx = res.ranks[0].index.n_ctx[size_t(k)], span = (n_ctx + 7) / 8;
    for (int t = 0; t < 8; ++t) {
      const int b = t * span, e = std::min(b + span, n_ctx);
      two_tiles += b < e && b / 256 != (e - 1) / 256;
    }
  }
  CHECK(two_tiles >= 4);
  const k4::RankResult& R = res.ranks[1];
  // and the seed's per-partition formula's bits (another mode's split) are refused
  k4::Config seed_cfg = w.cfg;
  seed_cfg.variant.kv_scale = k4::KvScale::scalar;
  k4::SplitOut other;
  k4::split_attention(other, in.shared, in.ranks[1], R.index, seed_cfg);
  CHECK_FALSE(f64::all_ok(f64::check_split(w.cfg, in.shared, in.ranks[1], R.index, other)));
}

TEST_CASE("split.kv_scale = atom_vllm: a NaN score makes its head's m and l NaN, and the guard checks them") {
  LayerWeights w = f64::cached_layer("tiny", 2, 1);
  w.cfg.variant.kv_scale = k4::KvScale::atom_vllm;
  StepInputs in = k4::test::random_step(w.cfg, {3, {2000, 3000, 700}, 1, 31});
  const int H = w.cfg.heads, NS = w.cfg.n_split, head = 5;
  in.ranks[0].q[size_t(head) * w.cfg.head_dim + 3] = 0x7FC0;  // token 0, head 5: a NaN q -> NaN scores
  const StepResult res = k4::run_step(w, in);
  const k4::RankResult& R = res.ranks[0];
  int nan_heads = 0;  // token 0's splits with a key (n_ctx 2000: all 8)
  for (int t = 0; t < NS; ++t) nan_heads += std::isnan(R.split.m[size_t(t) * H + head]) && std::isnan(R.split.l[size_t(t) * H + head]);
  CHECK(nan_heads == NS);
  const f64::Report rep = f64::check_split(w.cfg, in.shared, in.ranks[0], R.index, R.split);
  CHECK_MESSAGE(f64::all_ok(rep), f64::describe(rep));
  // planted: the head's m, then its l, finite in split 3
  k4::SplitOut bad = R.split;
  bad.m[size_t(3) * H + head] = 1.0f;
  CHECK_FALSE(f64::all_ok(f64::check_split(w.cfg, in.shared, in.ranks[0], R.index, bad)));
  bad = R.split;
  bad.l[size_t(3) * H + head] = 1.0f;
  CHECK_FALSE(f64::all_ok(f64::check_split(w.cfg, in.shared, in.ranks[0], R.index, bad)));
}

TEST_CASE("index.cp = on (VARIANTS.md V6.2): the float64 index guard of the 288-block threshold and the blocks below init_blocks") {
  for (int init : {0, 2}) {
    k4::Config cfg = k4::preset("tiny", 4);
    cfg.variant.index_cp = true;
    cfg.init_blocks = init;
    cfg.validate();
    const int B = cfg.sparse_block;
    const StepInputs in = k4::test::random_step(cfg, {6, {287 * B, 288 * B, 288 * B + 1, 300 * B, 700 * B, 2000 * B}, 1, uint64_t(31 + init)});
    k4::Config one_head = cfg;
    one_head.variant.index_cp = false;
    for (int r = 0; r < cfg.tp; ++r) {
      CAPTURE(init);
      CAPTURE(r);
      const std::vector<float>& sc = in.ranks[size_t(r)].index_scores;
      k4::IndexOut cp, oh;
      k4::select_blocks(cp, in.shared, sc, cfg);
      k4::select_blocks(oh, in.shared, sc, one_head);
      const f64::Report rep = f64::check_index(cfg, in.shared, sc, cp);
      CHECK_MESSAGE(f64::all_ok(rep), f64::describe(rep));
      // planted: the one-head selection (long_row at 289 .. 512 blocks; with init_blocks 2 the
      // pinned blocks 0, 1 too) is refused under index.cp, and the CP one without it
      CHECK_FALSE(f64::all_ok(f64::check_index(cfg, in.shared, sc, oh)));
      CHECK_FALSE(f64::all_ok(f64::check_index(one_head, in.shared, sc, cp)));
    }
  }
}

TEST_CASE("planted input errors: one wrong input of a stage is caught by its comparison") {
  const Run& base = planted_run();
  const k4::Config& cfg = base.w->cfg;
  const int S = base.in.shared.tokens, r = 1;
  const k4::RankResult& R = base.res.ranks[r];
  const k4::StepShared& sh = base.in.shared;
  auto caught = [](const std::string& what, const f64::Report& rep) {
    CHECK_MESSAGE(!f64::all_ok(rep), what, " is not caught");
  };
  // split: token 1 is a pad row (one key: page 0, key 0), so its o is v_scale * V and its m
  // the key's score: its k scale doubled, its v scale doubled, one of its V bytes' sign
  {
    REQUIRE(R.index.sparse_table[129] == 0);
    REQUIRE(R.index.n_ctx[1] == 1);
    k4::StepRank rin = base.in.ranks[r];
    REQUIRE(f64::all_ok(f64::check_split(cfg, sh, rin, R.index, R.split)));
    rin.k_scale[0] *= 2.0f;
    caught("a doubled k scale", f64::check_split(cfg, sh, rin, R.index, R.split));
    rin = base.in.ranks[r];
    rin.v_scale[0] *= 2.0f;
    caught("a doubled v scale", f64::check_split(cfg, sh, rin, R.index, R.split));
    rin = base.in.ranks[r];
    for (int d = 0; d < 128; ++d) rin.v_cache[k4::v_byte(0, d)] ^= 0x80;  // the V signs
    caught("V's sign", f64::check_split(cfg, sh, rin, R.index, R.split));
  }
  // index: the last selected non-tail block's score lowered (token 2: 40 blocks, scored)
  {
    std::vector<float> sc2 = base.in.ranks[r].index_scores;  // rank 1's own scores
    const int32_t* blk = R.index.blocks.data() + 2 * 16;
    sc2[size_t(2) * sh.score_width + blk[14]] = -1e9f;
    caught("a lowered index score", f64::check_index(cfg, sh, sc2, R.index));
    // rank 0's scores are not rank 1's: checked against them, rank 1's selection is caught
    caught("another rank's index scores", f64::check_index(cfg, sh, base.in.ranks[0].index_scores, R.index));
  }
  // merge: one partition's l doubled, its m + 1 (token 2 has 8 live partitions)
  {
    k4::SplitOut sp = R.split;
    sp.l[(2 * 8 + 2) * 16 + 5] *= 2.0f;
    caught("a doubled partition l", f64::check_merge(cfg, sp, R.merge, S));
    sp = R.split;
    sp.m[(2 * 8 + 2) * 16 + 5] += 1.0f;
    caught("a partition m + 1", f64::check_merge(cfg, sp, R.merge, S));
  }
  // o_proj: one row scale 1% off; one weight's sign
  {
    k4::RankWeights w = base.w->ranks[r];
    w.s_o[100] *= 1.01f;
    caught("a row scale 1% off", f64::check_oproj(cfg, R.merge, w, R.oproj, S));
    w = base.w->ranks[r];
    size_t big = 0;  // token 0's largest input
    for (int i = 0; i < cfg.o_k(); ++i)
      if (std::fabs(f64::e4m3(R.merge.attn8[i])) > std::fabs(f64::e4m3(R.merge.attn8[big]))) big = size_t(i);
    w.w_o[size_t(100) * cfg.o_k() + big] ^= 0x80;
    caught("a weight's sign", f64::check_oproj(cfg, R.merge, w, R.oproj, S));
  }
  // router: a norm weight, a residual element, a gate row's element, an expert bias
  {
    k4::RankWeights w = base.w->ranks[r];
    w.g_post[10] = f64::bf16_nearest(f64::bf16(w.g_post[10]) + 0.5);
    caught("a norm weight + 0.5", f64::check_router(cfg, R.a, sh.h_in, w, R.router, S));
    std::vector<uint16_t> h = sh.h_in;
    h[cfg.hidden + 33] ^= 0x8000;
    caught("a residual sign (router)", f64::check_router(cfg, R.a, h, base.w->ranks[r], R.router, S));
    caught("a residual sign (h_mid)", f64::check_residual(R.a, h, R.h_mid));
    w = base.w->ranks[r];
    w.w_gate[size_t(4) * cfg.hidden + 12] = f64::bf16_nearest(f64::bf16(w.w_gate[size_t(4) * cfg.hidden + 12]) + 1.0);
    caught("a gate weight + 1", f64::check_router(cfg, R.a, sh.h_in, w, R.router, S));
    w = base.w->ranks[r];
    w.bias[R.route.ids[0]] -= 10.0f;  // token 0's first pick loses its place
    caught("a pick's bias - 10", f64::check_route(cfg, R.router, w, R.route, S));
  }
  // experts: a routed expert's up / gate scale, its down scale (token 0's first pick)
  {
    const int e = R.route.ids[0];
    struct Edited : k4::ExpertSource {
      const k4::ExpertSource& base;
      int e;
      std::function<void(k4::ExpertWeights&)> edit;
      Edited(const k4::ExpertSource& b, int ee, std::function<void(k4::ExpertWeights&)> f) : base(b), e(ee), edit(std::move(f)) {}
      std::shared_ptr<const k4::ExpertWeights> expert(int rank, int id) const override {
        if (id != e) return base.expert(rank, id);
        auto w = std::make_shared<k4::ExpertWeights>(*base.expert(rank, id));
        edit(*w);
        return w;
      }
    };
    const Edited g(*base.w->experts, e, [&](k4::ExpertWeights& w) { w.s13[size_t(7) * cfg.hidden / 32 + 3] += 3; });
    caught("a gate scale x8", f64::check_up_gate(cfg, R.route, R.router, g, r, R.moe, S));
    const Edited u(*base.w->experts, e, [&](k4::ExpertWeights& w) { w.s13[size_t(cfg.inter + 7) * cfg.hidden / 32 + 3] += 3; });
    caught("an up scale x8", f64::check_up_gate(cfg, R.route, R.router, u, r, R.moe, S));
    const Edited d(*base.w->experts, e, [&](k4::ExpertWeights& w) { w.s2[size_t(50) * cfg.inter / 32 + 1] += 3; });
    caught("a down scale x8", f64::check_down(cfg, R.route, d, r, R.moe, S));
    k4::RouteOut ro = R.route;
    ro.weights[0] *= 1.5f;
    caught("a route weight x1.5", f64::check_down(cfg, ro, *base.w->experts, r, R.moe, S));
  }
}

}  // TEST_SUITE

TEST_SUITE("exhaustive_float64") {

TEST_CASE("the float64 guard over 40 random steps (tiny / small, TP 1..8)") {
  f64::Report total;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    k4::test::Rng g(seed * 3);
    const int S = 1 + g.below(16), tp = 1 << g.below(4);
    std::vector<int> lens;
    for (int k = 0; k < S; ++k) lens.push_back(g.below(6) == 0 ? 0 : 1 + g.below(12000));
    const Run r = run_case({seed % 3 ? "tiny" : "small", tp, seed % 2 + 1, lens, 1, seed});
    const f64::Report rep = f64::check_step(*r.w, r.in, r.res);
    CAPTURE(seed);
    CHECK_MESSAGE(f64::all_ok(rep), f64::describe(rep));
    f64::merge_into(total, rep);
  }
  check_report(total);
}

TEST_CASE("the float64 guard at full size, S = 16 (wide MoE, AG_RS)") {
  std::vector<int> lens;
  for (int k = 0; k < 16; ++k) lens.push_back(k == 3 ? 0 : 100 + 997 * k);
  const Run r = run_case({"minimax-m3-tp4", 4, 1, lens, 1, 7});
  check_report(f64::check_step(*r.w, r.in, r.res));
}

}  // TEST_SUITE
