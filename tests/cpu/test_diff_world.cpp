// test_diff_world.cpp -- the shared golden and the planted faults (test_diff_world.hpp).
#include "tests/cpu/test_diff_world.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "golden/inputs/scenario.hpp"
#include "golden/inputs/synth.hpp"

namespace fs = std::filesystem;

namespace k4::test {
namespace {

struct OwnedWorld {
  DiffWorld w;
  ~OwnedWorld() {
    std::error_code ec;
    if (!w.dir.empty() && !w.keep) fs::remove_all(w.dir, ec);
  }
};

// Gives expert e_b the gate row and bias of e_a on every rank: equal scores.
void tie_experts(LayerWeights& w, int e_a, int e_b) {
  const int H = w.cfg.hidden;
  for (RankWeights& r : w.ranks) {
    std::copy(r.w_gate.begin() + size_t(e_a) * H, r.w_gate.begin() + size_t(e_a + 1) * H, r.w_gate.begin() + size_t(e_b) * H);
    r.bias[size_t(e_b)] = r.bias[size_t(e_a)];
  }
}

// Experts whose FFN partial rows cancel across ranks: rank 0 serves its experts with the
// down-projection scales 2^20 larger, rank 1 serves rank 0's experts with w2 negated (every
// E2M1 sign flipped), so p1 = -p0 exactly, 2^20 above ranks 2 and 3's rows. In rank order
// 0 + p0 + p1 cancels exactly and ar_out = bf16(p2 + p3); in any other order the big rows
// round the small ones away first: the rank order of the all-reduce changes bits.
class CancellingExperts : public ExpertSource {
 public:
  explicit CancellingExperts(std::shared_ptr<const ExpertSource> base) : base_(std::move(base)) {}
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    if (rank > 1) return base_->expert(rank, e);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find({rank, e});
    if (it != cache_.end()) return it->second;
    auto w = std::make_shared<ExpertWeights>(*base_->expert(0, e));
    for (uint8_t& x : w->s2) x = uint8_t(x + 20);
    if (rank == 1)
      for (uint8_t& x : w->w2) x ^= 0x88;
    cache_[{rank, e}] = w;
    return w;
  }

 private:
  std::shared_ptr<const ExpertSource> base_;
  mutable std::mutex mu_;
  mutable std::map<std::pair<int, int>, std::shared_ptr<const ExpertWeights>> cache_;
};

DiffWorld build() {
  DiffWorld W;
  W.cfg = preset("tiny");
  Scenario s;
  s.tokens = 4;
  s.context = {"1000"};
  apply_scenario(s, W.cfg);
  W.w = synth::synthetic_layer(W.cfg, 7);
  W.w.experts = std::make_shared<CancellingExperts>(W.w.experts);
  W.in = make_inputs(W.cfg, s, 3, &W.w);
  W.gold = run_step(W.w, W.in);
  // The tie: token 0's first pick e_a and the highest expert it does not pick get equal
  // gate rows and biases; the stages from the router on are recomputed with that layer.
  const int SL = W.cfg.moe_slots();
  const std::vector<int32_t>& ids = W.gold.ranks[0].route.ids;
  const int e_a = ids[0];
  int e_b = W.cfg.n_routed - 1;
  while (std::find(ids.begin(), ids.begin() + W.cfg.top_k, e_b) != ids.begin() + W.cfg.top_k) --e_b;
  tie_experts(W.w, e_a, e_b);
  rerun(W.gold, W, From::Router);
  const std::vector<int32_t>& t = W.gold.ranks[0].route.ids;
  const auto a = std::find(t.begin(), t.begin() + W.cfg.top_k, std::min(e_a, e_b));
  const auto b = std::find(t.begin(), t.begin() + W.cfg.top_k, std::max(e_a, e_b));
  if (a == t.begin() + W.cfg.top_k || b == t.begin() + W.cfg.top_k || b < a)
    throw std::logic_error("test world: the tied experts are not both picked in id order");
  W.tie_token = 0;
  W.tie_slot_a = int(a - t.begin());
  W.tie_slot_b = int(b - t.begin());
  (void)SL;
  if (const char* keep = std::getenv("K4_DIFF_KEEP")) {  // keep the golden and the dumps there
    W.dir = keep;
    W.keep = true;
  } else {
    W.dir = (fs::temp_directory_path() / ("k4_test_diff_" + std::to_string(::getpid()))).string();
    fs::remove_all(W.dir);
  }
  fs::create_directories(W.dir);
  W.golden_path = W.path("golden.h5");
  golden::GoldenMeta meta;
  meta.scenario_json = scenario_to_json(s);
  meta.weight_seed = 7;
  meta.input_seed = 3;
  golden::WriteOptions wo;
  wo.overwrite = true;
  golden::write_golden(W.golden_path, W.w, W.in, W.gold, meta, wo);
  return W;
}

Fault start(const DiffWorld& W, const std::string& name, int rank, const std::string& stage, const std::string& tensor,
            std::vector<uint64_t> index) {
  return Fault{name, W.gold, rank, stage, tensor, std::move(index)};
}

}  // namespace

const DiffWorld& diff_world() {
  static OwnedWorld w{build()};
  return w.w;
}

void rerun(StepResult& res, const DiffWorld& W, From from) {
  const Config& cfg = W.cfg;
  const int S = W.in.shared.tokens, T = cfg.tp;
  auto at = [&](From f) { return int(from) <= int(f); };
  for (int r = 0; r < T; ++r) {
    RankResult& R = res.ranks[size_t(r)];
    if (at(From::Split)) split_attention(R.split, W.in.shared, W.in.ranks[size_t(r)], R.index, cfg);
    if (at(From::Merge)) merge_partitions(R.merge, R.split, S, cfg);
    if (at(From::Oproj)) o_proj_partials(R.oproj, R.merge, W.w.ranks[size_t(r)], S, cfg);
  }
  std::vector<const std::vector<uint16_t>*> parts;
  if (at(From::AllReduceA)) {
    for (int r = 0; r < T; ++r) parts.push_back(&res.ranks[size_t(r)].oproj.partial);
    std::vector<std::vector<uint16_t>> a;
    all_reduce_rows(a, parts, S, cfg.hidden, true, cfg.ag_rs(S), cfg.o_rows);
    for (int r = 0; r < T; ++r) {
      res.ranks[size_t(r)].a = a[size_t(r)];
      residual_add(res.ranks[size_t(r)].h_mid, res.ranks[size_t(r)].a, W.in.shared.h_in);
    }
  }
  for (int r = 0; r < T; ++r) {
    RankResult& R = res.ranks[size_t(r)];
    if (at(From::Router)) route_scores(R.router, R.a, W.in.shared.h_in, W.w.ranks[size_t(r)], S, cfg);
    if (at(From::Route)) route_top4(R.route, R.router, S, cfg);
    if (at(From::UpGate)) experts_up_gate(R.moe, R.route, R.router, *W.w.experts, r, S, cfg);
    if (at(From::Down)) experts_down(R.moe, R.route, *W.w.experts, r, S, cfg);
  }
  if (at(From::ArOut)) {
    parts.clear();
    for (int r = 0; r < T; ++r) parts.push_back(&res.ranks[size_t(r)].moe.partial);
    std::vector<std::vector<uint16_t>> ar;
    all_reduce_rows(ar, parts, S, cfg.hidden, T > 1, cfg.ag_rs(S), cfg.dn_rows);
    for (int r = 0; r < T; ++r) res.ranks[size_t(r)].ar_out = ar[size_t(r)];
  }
}

Fault fault_split_bit_flip(const DiffWorld& W) {
  const int tok = 2, part = 1, dim = 517;
  Fault F = start(W, "split_bit_flip", 1, "split", "o", {tok, part, dim});
  std::vector<uint16_t>& o = F.res.ranks[1].split.o;
  o[(size_t(tok) * W.cfg.n_split + part) * W.cfg.o_k() + dim] ^= 0x0040;  // bf16 mantissa bit 6
  rerun(F.res, W, From::Merge);
  return F;
}

Fault fault_xsc_round_down(const DiffWorld& W) {
  const int tok = 1, blk = 5;
  Fault F = start(W, "xsc_round_down", 2, "router", "xsc", {tok, blk});
  F.res.ranks[2].router.xsc[size_t(tok) * (W.cfg.hidden / 32) + blk] -= 1;  // RoundUp's +1 forgotten
  rerun(F.res, W, From::Route);
  return F;
}

Fault fault_tied_experts(const DiffWorld& W) {
  const int SL = W.cfg.moe_slots(), k = W.tie_token;
  Fault F = start(W, "tied_experts", 0, "moe", "route_ids", {uint64_t(k), uint64_t(W.tie_slot_a)});
  RouteOut& rt = F.res.ranks[0].route;
  std::swap(rt.ids[size_t(k) * SL + W.tie_slot_a], rt.ids[size_t(k) * SL + W.tie_slot_b]);
  std::swap(rt.weights[size_t(k) * SL + W.tie_slot_a], rt.weights[size_t(k) * SL + W.tie_slot_b]);
  rerun(F.res, W, From::UpGate);
  return F;
}

Fault fault_block_order(const DiffWorld& W) {
  const int tok = 1, s0 = 1, s1 = 4, ppb = W.cfg.pages_per_block();
  Fault F = start(W, "block_order", 3, "index", "sparse_table", {tok, uint64_t(s0 * ppb)});
  std::vector<int32_t>& t = F.res.ranks[3].index.sparse_table;
  const size_t row = size_t(tok) * W.cfg.sparse_table_words();
  for (int j = 0; j < ppb; ++j) std::swap(t[row + s0 * ppb + j], t[row + s1 * ppb + j]);
  rerun(F.res, W, From::Split);
  return F;
}

Fault fault_ffn_rank_order(const DiffWorld& W) {
  Fault F = start(W, "ffn_rank_order", 0, "moe", "ar_out", {});
  const int S = W.in.shared.tokens, T = W.cfg.tp;
  std::vector<const std::vector<uint16_t>*> rev;
  for (int r = T - 1; r >= 0; --r) rev.push_back(&F.res.ranks[size_t(r)].moe.partial);
  std::vector<std::vector<uint16_t>> ar;
  all_reduce_rows(ar, rev, S, W.cfg.hidden, true, W.cfg.ag_rs(S), W.cfg.dn_rows);
  for (int r = 0; r < T; ++r) F.res.ranks[size_t(r)].ar_out = ar[size_t(r)];
  const std::vector<uint16_t>& g = W.gold.ranks[0].ar_out;
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i] != ar[0][i]) {
      F.index = {i / size_t(W.cfg.hidden), i % size_t(W.cfg.hidden)};
      break;
    }
  return F;  // F.index empty: the reversed order changed no bit (the test says so)
}

}  // namespace k4::test
