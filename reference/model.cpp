// model.cpp -- K4's decode step: validate, then stages 0..5 of every rank with the two
// all-reduces between them (build_post_attn_kernel (seed:L1-L2572)).
#include "reference/model.hpp"

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace k4 {
namespace {

// One rank's experts, each fetched once for both MoE phases (up/gate and down), released
// when the rank's stage 5 is done: a source may build experts on demand and cache few.
class RankExpertCache : public ExpertSource {
 public:
  explicit RankExpertCache(const ExpertSource& src) : src_(src) {}
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = held_[{rank, e}];
    if (!slot) slot = src_.expert(rank, e);
    return slot;
  }

 private:
  const ExpertSource& src_;
  mutable std::mutex mu_;
  mutable std::map<std::pair<int, int>, std::shared_ptr<const ExpertWeights>> held_;
};

[[noreturn]] void bad(const std::string& tensor, const std::string& what) {
  throw std::invalid_argument("inputs: " + tensor + ": " + what);
}

void expect_size(const std::string& tensor, size_t got, size_t want, const std::string& shape) {
  if (got != want)
    bad(tensor, "has " + std::to_string(got) + " elements, expected " + std::to_string(want) + " " + shape);
}

}  // namespace

void validate_inputs(const StepInputs& in, const Config& cfg) {
  const StepShared& sh = in.shared;
  const int S = sh.tokens;
  if (S < 1 || S > cfg.max_tokens) bad("tokens", std::to_string(S) + " is outside 1.." + std::to_string(cfg.max_tokens));
  if (sh.q_len < 1 || S % sh.q_len != 0) bad("q_len", std::to_string(sh.q_len) + " must divide the token count " + std::to_string(S));
  expect_size("seq_lens", sh.seq_lens.size(), S, "(S)");
  expect_size("block_table", sh.block_table.size(), size_t(S) * sh.bt_width, "(S, bt_width)");
  expect_size("h_in", sh.h_in.size(), size_t(S) * cfg.hidden, "(S, hidden)");
  if (int(in.ranks.size()) != cfg.tp) bad("ranks", std::to_string(in.ranks.size()) + " rank inputs, expected tp = " + std::to_string(cfg.tp));
  for (int k = 0; k < S; ++k)
    if (sh.seq_lens[k] < 0 || sh.seq_lens[k] > cfg.max_context)
      bad("seq_lens[" + std::to_string(k) + "]", std::to_string(sh.seq_lens[k]) + " is outside 0.." + std::to_string(cfg.max_context));
  const std::vector<RowPlan> rows = plan_rows(cfg, sh);
  for (int k = 0; k < S; ++k) {
    const RowPlan& r = rows[k];
    const std::string row = "[" + std::to_string(k) + "]";
    if (r.n_blk > sh.bt_width) bad("block_table" + row, "row needs " + std::to_string(r.n_blk) + " blocks, the table is " + std::to_string(sh.bt_width) + " wide");
    if (r.n_blk > sh.score_width) bad("index_scores" + row, "row needs " + std::to_string(r.n_blk) + " scores, rows are " + std::to_string(sh.score_width) + " wide");
    if (!r.long_path && r.n_blk > cfg.long_from_blocks())
      bad("seq_lens" + row, "a short request's row has " + std::to_string(r.n_blk) + " blocks (> THREADS = " + std::to_string(cfg.long_from_blocks()) + "): a request's rows must be consecutive positions");
    const int span = (r.n_blk + cfg.n_split - 1) / cfg.n_split;
    if (r.long_path && r.n_blk - (cfg.n_split - 1) * span < cfg.topk_blocks)
      bad("seq_lens" + row, "a long request's row of " + std::to_string(r.n_blk) + " blocks leaves a share with fewer than TOPK_BLOCKS blocks");
  }
  for (int rk = 0; rk < cfg.tp; ++rk) {
    const StepRank& R = in.ranks[rk];
    const std::string p = "rank" + std::to_string(rk) + "/";
    const size_t page_bytes = size_t(cfg.page) * cfg.head_dim;
    expect_size(p + "q", R.q.size(), size_t(S) * cfg.o_k(), "(S, o_k)");
    expect_size(p + "index_scores", R.index_scores.size(), size_t(S) * sh.score_width, "(S, score_width)");
    expect_size(p + "k_cache", R.k_cache.size(), size_t(R.n_pages) * page_bytes, "(n_pages, page * head_dim)");
    expect_size(p + "v_cache", R.v_cache.size(), size_t(R.n_pages) * page_bytes, "(n_pages, page * head_dim)");
    const size_t n_scales = cfg.one_kv_scale() ? 1 : size_t(R.n_pages) * cfg.page;
    expect_size(p + "k_scale", R.k_scale.size(), n_scales, cfg.one_kv_scale() ? "(1) one a cache" : "(n_pages, page)");
    expect_size(p + "v_scale", R.v_scale.size(), n_scales, cfg.one_kv_scale() ? "(1) one a cache" : "(n_pages, page)");
    for (int k = 0; k < S; ++k)
      for (int b = 0; b < rows[k].n_blk; ++b) {
        const int64_t e = sh.block_table[size_t(k) * sh.bt_width + b];
        const int64_t last = e * cfg.kv_page_stride + cfg.pages_per_block() - 1;
        if (e < 0 || last >= R.n_pages)
          bad("block_table[" + std::to_string(k) + "][" + std::to_string(b) + "]",
              "entry " + std::to_string(e) + " addresses pages up to " + std::to_string(last) + ", the " + p + "cache has " + std::to_string(R.n_pages));
      }
  }
}

StepResult run_step(const LayerWeights& w, const StepInputs& in) {
  const Config& cfg = w.cfg;
  cfg.validate();
  validate_inputs(in, cfg);
  const int S = in.shared.tokens, W = cfg.tp;
  StepResult res;
  res.ranks.resize(W);
  for (int r = 0; r < W; ++r) {  // stages 0..3 up to the partial rows
    RankResult& R = res.ranks[r];
    select_blocks(R.index, in.shared, in.ranks[r].index_scores, cfg);  // its own index head
    split_attention(R.split, in.shared, in.ranks[r], R.index, cfg);
    merge_partitions(R.merge, R.split, S, cfg);
    o_proj_partials(R.oproj, R.merge, w.ranks[r], S, cfg);
  }
  std::vector<const std::vector<uint16_t>*> parts;
  for (int r = 0; r < W; ++r) parts.push_back(&res.ranks[r].oproj.partial);
  std::vector<std::vector<uint16_t>> a;
  all_reduce_rows(a, parts, S, cfg.hidden, /*zero_start=*/true, cfg.ag_rs(S), cfg.o_rows);
  for (int r = 0; r < W; ++r) {  // stages 4..5 up to the FFN partial rows
    RankResult& R = res.ranks[r];
    R.a = a[r];
    residual_add(R.h_mid, R.a, in.shared.h_in);
    route_scores(R.router, R.a, in.shared.h_in, w.ranks[r], S, cfg);
    route_top4(R.route, R.router, S, cfg);
    R.route.live = live_rows(cfg, in.shared.seq_lens);  // V2: which rows join the wide experts
    const RankExpertCache experts(*w.experts);
    experts_up_gate(R.moe, R.route, R.router, experts, r, S, cfg);
    experts_down(R.moe, R.route, experts, r, S, cfg);
  }
  parts.clear();
  for (int r = 0; r < W; ++r) parts.push_back(&res.ranks[r].moe.partial);
  std::vector<std::vector<uint16_t>> ar;
  // W == 1: the seed stores the partial itself (ffn_finish), no 0.0 start
  all_reduce_rows(ar, parts, S, cfg.hidden, /*zero_start=*/W > 1, cfg.ag_rs(S), cfg.dn_rows);
  for (int r = 0; r < W; ++r) res.ranks[r].ar_out = ar[r];
  return res;
}

}  // namespace k4
