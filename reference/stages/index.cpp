// Stage 0, index: sparse block selection. Contract in index.hpp; seed lines cited inline.
#include "reference/stages/index.hpp"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "reference/numerics/hd.hpp"
#include "reference/numerics/keys.hpp"
#include "reference/model_mutants.hpp"

namespace k4 {
namespace {

constexpr int32_t kKeyNone = INT32_MIN;  // seed KEY_NONE
constexpr int kLanes = 64;
constexpr int kCandBatch = 2;  // seed CAND_BATCH
constexpr int kIndexCpFromBlocks = 288;  // INDEX_CP_FROM_BLOCKS (VARIANTS.md V6.2 rule 1)

// ---- the seed's lane networks (choose_pair (seed:L388-L452)), simulated lane by lane -
struct Lanes {
  int32_t key[kLanes];
  int32_t blk[kLanes];
};

Lanes xshfl(const Lanes& v, int off) {
  Lanes r;
  for (int i = 0; i < kLanes; ++i) r.key[i] = v.key[i ^ off], r.blk[i] = v.blk[i ^ off];
  return r;
}

// (key, block) pair a orders before b: higher key, then higher block id (beats (seed:L385-L387)).
bool beats(int32_t ah, int32_t al, int32_t bh, int32_t bl) { return ah > bh || (ah == bh && al > bl); }

// Top half of two descending 16-lists, b given reversed (merge16_best (seed:L395-L407)).
Lanes merge16_best(const Lanes& a, const Lanes& b) {
  Lanes cur;
  for (int i = 0; i < kLanes; ++i) {
    const bool b_hi = beats(b.key[i], b.blk[i], a.key[i], a.blk[i]);
    cur.key[i] = b_hi ? b.key[i] : a.key[i];
    cur.blk[i] = b_hi ? b.blk[i] : a.blk[i];
  }
  for (int off : {8, 4, 2, 1}) {
    const Lanes p = xshfl(cur, off);
    for (int i = 0; i < kLanes; ++i) {
      const bool p_hi = beats(p.key[i], p.blk[i], cur.key[i], cur.blk[i]);
      const bool take_hi = ((i % 16) & off) == 0;
      if (p_hi == take_hi) cur.key[i] = p.key[i], cur.blk[i] = p.blk[i];
    }
  }
  return cur;
}

// Bitonic sort of each 16-lane group, descending (sort16_desc (seed:L408-L420)).
Lanes sort16_desc(Lanes cur) {
  const int strides[4][4] = {{1}, {2, 1}, {4, 2, 1}, {8, 4, 2, 1}};
  const int sizes[4] = {2, 4, 8, 16};
  for (int s = 0; s < 4; ++s) {
    for (int t = 0; t <= s; ++t) {
      const int stride = strides[s][t];
      const Lanes p = xshfl(cur, stride);
      for (int i = 0; i < kLanes; ++i) {
        const int l16 = i % 16;
        const bool asc = (l16 & sizes[s]) != 0;
        const bool low = (l16 & stride) == 0;
        const bool take_high = low ^ asc;
        const bool partner_high = beats(p.key[i], p.blk[i], cur.key[i], cur.blk[i]);
        // choose_pair (seed:L388-L394): the partner when it is the one wanted
        if (partner_high == take_high) cur.key[i] = p.key[i], cur.blk[i] = p.blk[i];
      }
    }
  }
  return cur;
}

// Exact top 16 of a wave's 128 (key, block) pairs, in lanes 0..15 (wave_best (seed:L421-L435)).
Lanes wave_best(Lanes h0, Lanes h1) {
  h0 = sort16_desc(h0);
  h1 = sort16_desc(h1);
  h0 = merge16_best(h0, xshfl(h0, 31));
  h1 = merge16_best(h1, xshfl(h1, 31));
  h0 = merge16_best(h0, xshfl(h0, 47));
  h1 = merge16_best(h1, xshfl(h1, 47));
  return merge16_best(h0, xshfl(h1, 15));
}

// Merge eight sorted 16-rows of cand (pairs, row-major) to the exact top 16
// (rank_cands (seed:L436-L452)).
Lanes rank_cands(const int32_t* cand_key, const int32_t* cand_blk) {
  Lanes a, b;
  for (int lane = 0; lane < kLanes; ++lane) {
    const int group = lane / 16, index = lane % 16;
    const int ai = (2 * group) * 16 + index;
    const int bi = (2 * group + 1) * 16 + (16 - 1 - index);
    a.key[lane] = cand_key[ai], a.blk[lane] = cand_blk[ai];
    b.key[lane] = cand_key[bi], b.blk[lane] = cand_blk[bi];
  }
  Lanes r = merge16_best(a, b);
  r = merge16_best(r, xshfl(r, 31));
  return merge16_best(r, xshfl(r, 47));
}

// The ranked blocks' slots (place (seed:L453-L475)), for one row.
struct Placed {
  int32_t table[16 * 8 + 1];
  int32_t blocks[16];
  int32_t n_ctx;
};

// key/bb/rank/live per candidate thread; kt the tail block's key.
void place(Placed& out, const Config& cfg, const int32_t* key, const int32_t* bb, const int32_t* rank,
           const bool* live, int n, int32_t kt, int n_blk, int seq_len, const int32_t* bt_row) {
  const int ppb = cfg.pages_per_block();
  const int n_sel = std::min(n_blk, cfg.topk_blocks);
  const int tail = n_blk - 1;
  bool tail_sel = false;
  for (int i = 0; i < n; ++i) tail_sel |= live[i] && rank[i] < n_sel && bb[i] == tail;
  const int n_full = n_sel - (tail_sel ? 1 : 0);
  for (int i = 0; i < n; ++i) {
    if (!(live[i] && rank[i] < n_sel)) continue;
    const bool is_tail = bb[i] == tail;
    const bool tail_first = kt > key[i] || (kt == key[i] && tail > bb[i]);
    const int slot = is_tail && !K4_MODEL_MUTANT_ON(15) ? n_full : rank[i] - (tail_first ? 1 : 0);
    const int32_t page = bt_row[bb[i]];
    for (int j = 0; j < ppb; ++j) out.table[slot * ppb + j] = page * cfg.kv_page_stride + j;
    out.blocks[slot] = bb[i];
  }
  out.n_ctx = tail_sel ? n_full * cfg.sparse_block + seq_len - tail * cfg.sparse_block
                       : std::min(n_sel * cfg.sparse_block, seq_len);
}

const float* score_row(const StepShared& in, const std::vector<float>& scores, int k) {
  return scores.data() + size_t(k) * in.score_width;
}

// Short path (rank_blocks (seed:L322-L382)): thread b keys block b, rank = blocks beating it.
void select_short(Placed& out, const Config& cfg, const StepShared& in, const float* sc, int k, const RowPlan& row) {
  const int n_blk = row.n_blk;
  const bool scored = n_blk > cfg.topk_blocks;  // scored (seed:L302) -- short contexts take id order
  std::vector<int32_t> key(n_blk), bb(n_blk), rank(n_blk, 0);
  for (int b = 0; b < n_blk; ++b) {
    // a pinned block's slot holds no score: its key is forced, the word is not used
    const bool pinned = b < cfg.init_blocks || b >= n_blk - cfg.local_blocks;
    key[b] = scored ? index_key(cfg, b, pinned ? 0.0f : sc[b], n_blk) : -b;
    bb[b] = b;
  }
  for (int b = 0; b < n_blk; ++b)
    for (int j = 0; j < n_blk; ++j) rank[b] += key[j] > key[b] || (key[j] == key[b] && (K4_MODEL_MUTANT_ON(14) ? j < b : j > b));
  std::vector<char> live(n_blk, 1);
  place(out, cfg, key.data(), bb.data(), rank.data(), reinterpret_cast<const bool*>(live.data()), n_blk,
        key[n_blk - 1], n_blk, row.ctx, in.block_table.data() + size_t(k) * in.bt_width);
}

}  // namespace

int32_t index_key(const Config& cfg, int b, float score, int n_blk) {
  return index_key_bits(b, score, n_blk, cfg.init_blocks, cfg.local_blocks);  // index_key (seed:L312-L321)
}

std::vector<RowPlan> plan_rows(const Config& cfg, const StepShared& in) {
  std::vector<RowPlan> rows(in.tokens);
  for (int k = 0; k < in.tokens; ++k) {
    const int ctx = std::max(in.seq_lens[k], 1);  // a pad row is one key of page 0
    rows[k] = {ctx, (ctx + cfg.sparse_block - 1) / cfg.sparse_block, false};
  }
  // under index.cp (V6.2) from INDEX_CP_FROM_BLOCKS = 288 (aiter's step_rows, as the seed calls
  // it: step_rows (seed:L294-L296)), else past THREADS blocks
  const int from = cfg.variant.index_cp ? kIndexCpFromBlocks : cfg.long_from_blocks();
  // a request is long when its last row has more than THREADS blocks: all its rows are
  for (int r0 = 0; r0 < in.tokens; r0 += in.q_len) {
    const bool lng = rows[r0 + in.q_len - 1].n_blk > from;
    for (int k = r0; k < r0 + in.q_len; ++k) rows[k].long_path = lng;
  }
  return rows;
}

// One share's exact top 16 (wave_best per wave, then rank_cands over the waves' 16s) of the
// blocks block_of(j) for j in [lo, hi), a thread keying CAND_BATCH of them (j = lo + tid +
// THREADS i); score_of(b) is the score word block b's key reads.
template <class BlockOf, class ScoreOf>
void share_top16(int32_t* ck, int32_t* cb, const Config& cfg, int lo, int hi, int n_blk, int part, BlockOf block_of,
                 ScoreOf score_of) {
  const int threads = cfg.threads();
  std::vector<int32_t> wk(cfg.waves * 16), wb(cfg.waves * 16);
  for (int w = 0; w < cfg.waves; ++w) {
    Lanes h[kCandBatch];
    for (int i = 0; i < kCandBatch; ++i)
      for (int lane = 0; lane < kLanes; ++lane) {
        const int j = lo + w * kLanes + lane + threads * i, b = block_of(j);
        const bool lv = j < hi;
        h[i].key[lane] = lv ? index_key(cfg, b, score_of(b), n_blk) : kKeyNone;
        h[i].blk[lane] = lv ? b : -1;
      }
    const Lanes best = wave_best(h[0], h[1]);
    for (int lane = 0; lane < 16; ++lane) wk[w * 16 + lane] = best.key[lane], wb[w * 16 + lane] = best.blk[lane];
  }
  const Lanes cta = rank_cands(wk.data(), wb.data());
  for (int cnt = 0; cnt < 16; ++cnt) {
    if (cta.blk[cnt] < 0)
      throw std::invalid_argument("long-context share " + std::to_string(part) + " of " + std::to_string(n_blk) +
                                  " blocks holds fewer than TOPK_BLOCKS blocks (the seed leaves stale candidates)");
    ck[cnt] = cta.key[cnt], cb[cnt] = cta.blk[cnt];
  }
}

// index.cp = on (VARIANTS.md V6.2; select_long with every index head, ih_count (seed:L533-L548)): head r's
// candidates come in N_SPLIT = 2 TP shares, rank s's two halves of its own blocks
// own0_s + TP j, own0_s = init + ((s - init) mod TP) (own0 (seed:L534)); a read slot is clamped
// to `last`, the rank's last own block below n_blk - local_blocks (slots (seed:L545)); the
// share of rank s, half h goes to slot 2 s + h of head r's sel_cp (out_slot (seed:L546-L547)).
// The scores given are head r's logical ones (score of block b at b), which is what rank s
// stores at its own slot b div TP. Blocks below init_blocks are no candidate.
void select_long_cp(int32_t* ck, int32_t* cb, const Config& cfg, const float* scores, int n_blk) {
  const int TP = cfg.tp, init = cfg.init_blocks;
  for (int s = 0; s < TP; ++s) {
    const int own0 = init + ((s - init) % TP + TP) % TP;  // the seed's Python-int mod: never negative
    const int n_own = (n_blk - own0 + TP - 1) / TP;
    const int last = own0 + TP * ((n_blk - cfg.local_blocks - own0 + TP - 1) / TP - 1);
    const int span = (n_own + 1) / 2;
    for (int half = 0; half < 2; ++half) {
      const int lo = half * span, hi = std::min(lo + span, n_own), slot = 2 * s + half;
      share_top16(ck + slot * 16, cb + slot * 16, cfg, lo, hi, n_blk, slot, [&](int j) { return own0 + TP * j; },
                  [&](int b) { return scores[std::min(b, last)]; });
    }
  }
}

void select_long_candidates(int32_t* keys16, int32_t* blocks16, const Config& cfg, const float* scores,
                            int n_blk) {
  std::vector<int32_t> ck(cfg.n_split * 16), cb(cfg.n_split * 16);  // the candidate mailbox
  if (cfg.variant.index_cp) {
    select_long_cp(ck.data(), cb.data(), cfg, scores, n_blk);
  } else {  // select_long with one index head: share `part` is the part-th eighth of the blocks
    const int span = (n_blk + cfg.n_split - 1) / cfg.n_split;
    for (int part = 0; part < cfg.n_split; ++part) {
      const int lo = part * span, hi = std::min(lo + span, n_blk);
      share_top16(ck.data() + part * 16, cb.data() + part * 16, cfg, lo, hi, n_blk, part, [](int j) { return j; },
                  [&](int b) { return scores[std::max(std::min(std::max(b, cfg.init_blocks), n_blk - 1 - cfg.local_blocks), 0)]; });
    }
  }
  const Lanes top = rank_cands(ck.data(), cb.data());
  for (int i = 0; i < 16; ++i) keys16[i] = top.key[i], blocks16[i] = top.blk[i];
}

void select_blocks(IndexOut& out, const StepShared& in, const std::vector<float>& scores, const Config& cfg) {
  const int S = in.tokens, TW = cfg.sparse_table_words();
  if (scores.size() != size_t(S) * in.score_width)
    throw std::invalid_argument("index: the rank's index_scores have " + std::to_string(scores.size()) +
                                " elements, expected " + std::to_string(size_t(S) * in.score_width) + " (S, score_width)");
  out.sparse_table.assign(size_t(S) * TW, 0);
  out.blocks.assign(size_t(S) * cfg.topk_blocks, -1);
  out.n_ctx.assign(S, 0);
  out.long_row.assign(S, 0);
  const std::vector<RowPlan> rows = plan_rows(cfg, in);
#pragma omp parallel for schedule(dynamic)
  for (int k = 0; k < S; ++k) {
    Placed p;
    std::fill(std::begin(p.table), std::end(p.table), 0);
    std::fill(std::begin(p.blocks), std::end(p.blocks), -1);
    if (!rows[k].long_path) {
      select_short(p, cfg, in, score_row(in, scores, k), k, rows[k]);
    } else {
      int32_t key[16], blk[16], rank[16];
      bool live[16];
      select_long_candidates(key, blk, cfg, score_row(in, scores, k), rows[k].n_blk);
      for (int i = 0; i < 16; ++i) rank[i] = i, live[i] = blk[i] >= 0;
      // the tail block is a local one: its key is forced (kt (seed:L611))
      const int32_t kt = index_key(cfg, rows[k].n_blk - 1, 0.0f, rows[k].n_blk);
      place(p, cfg, key, blk, rank, live, 16, kt, rows[k].n_blk, rows[k].ctx,
            in.block_table.data() + size_t(k) * in.bt_width);
    }
    std::copy(p.table, p.table + TW - 1, out.sparse_table.begin() + size_t(k) * TW);
    out.sparse_table[size_t(k) * TW + TW - 1] = p.n_ctx;
    std::copy(p.blocks, p.blocks + cfg.topk_blocks, out.blocks.begin() + size_t(k) * cfg.topk_blocks);
    out.n_ctx[k] = p.n_ctx;
    out.long_row[k] = rows[k].long_path;
  }
}

}  // namespace k4
