// index.cu -- stage 0, index: sparse block selection on the GPU; the twin of
// reference/stages/index.cpp (index (seed:L289-L640): step_rows, index_key, rank_blocks, place,
// select_blocks, select_long, wave_best, rank_cands).
//
// Contract (reference/stages/index.hpp), per rank r from r's own scores (its own mailbox's
// iscore (seed:L487)), per token row k, ctx = max(seq_len, 1),
// n_blk = ceil(ctx / 128):
//  - key(b): the score's bits as a signed-orderable int, pinned blocks forced (init 1e30,
//    local 1e29), -0 == +0, NaN below -Inf; a context of <= TOPK_BLOCKS blocks is not scored
//    (key = -b: id order). rank(b) = #{j beating b}, ties to the higher id.
//  - the first min(n_blk, 16) ranks are selected; the tail block takes the last slot.
//  - a long request (its last row > THREADS blocks) selects through the seed's lane
//    networks: each of N_SPLIT shares -> each wave's exact top 16 of its 2 x 64 lanes (bitonic
//    sort16_desc + merge16_best) -> the share's top 16 (rank_cands) -> the row's (rank_cands).
//  - index.cp = on (VARIANTS.md V6.2, docs/numerics.md V6.2.1-3; every index head:
//    ih_count (seed:L533-L548)): long from n_blk > 288 (INDEX_CP_FROM_BLOCKS); rank r's share
//    2 s + h is owner rank s's half h of its own blocks own0 + TP j, own0 = init + ((s - init)
//    mod TP) (a mod that is never negative), scored with head r's scores (rank r's own, as
//    the model reads them) at min(b, last); blocks below init_blocks are no candidate.
// Kernels: short rows (one block a row and rank, thread b keys block b); long shares (one
// block a (row, share) and rank: 8 waves of 64 lanes run the networks lane by lane in shared
// memory, so nothing depends on the warp size); long rows' final merge and placement.
// Every launch covers all rows; a block whose row takes the other path returns at once.
#include <climits>

#include "device/mutants.hpp"
#include "device/stages.hpp"
#include "reference/numerics/keys.hpp"

namespace k4::gpu {
namespace {

constexpr int32_t kKeyNone = INT32_MIN;  // seed KEY_NONE
constexpr int kNetLanes = 64;            // the seed's wave: the networks' lane groups
constexpr int kCandBatch = 2;            // seed CAND_BATCH
constexpr int kIndexCpFromBlocks = 288;  // INDEX_CP_FROM_BLOCKS (VARIANTS.md V6.2 rule 1)

// Sort key of block b's score: reference/numerics/keys.hpp (index_key (seed:L312-L321)).
K4_BODY int32_t index_key(const DevCfg& cfg, int b, float score, int n_blk) {
  if (K4_MUTANT_ON(5) && is_nan(score) && b >= cfg.init_blocks && b < n_blk - cfg.local_blocks) return int32_t(f32_bits(score) & 0x7FFFFFFFu);
  if (K4_MUTANT_ON(6) && f32_bits(score) == 0x80000000u && b >= cfg.init_blocks && b < n_blk - cfg.local_blocks) return -1;
  return index_key_bits(b, score, n_blk, cfg.init_blocks + (K4_MUTANT_ON(4) ? 1 : 0), K4_MUTANT_ON(3) ? 0 : cfg.local_blocks);
}

struct RowInfo {
  int ctx, n_blk;
  bool long_path;
};

// The seed's step_rows for row k (reference plan_rows).
K4_BODY RowInfo row_info(const IndexArgs& a, int k) {
  const int sb = a.cfg.sparse_block;
  auto n_blk_of = [&](int r) {
    const int ctx = a.seq_lens[r] > 1 ? a.seq_lens[r] : 1;
    return (ctx + sb - 1) / sb;
  };
  const int last = K4_MUTANT_ON(10) ? k : (k / a.q_len) * a.q_len + a.q_len - 1;
  RowInfo r;
  r.ctx = a.seq_lens[k] > 1 ? a.seq_lens[k] : 1;
  r.n_blk = n_blk_of(k);
  // under index.cp (V6.2) from INDEX_CP_FROM_BLOCKS = 288 (step_rows (seed:L294-L296)), else
  // past THREADS blocks
  const int from = a.cfg.index_cp && !K4_MUTANT_ON(80) ? kIndexCpFromBlocks - (K4_MUTANT_ON(79) ? 1 : 0)
                                                      : a.cfg.long_from_blocks - (K4_MUTANT_ON(9) ? 1 : 0);
  r.long_path = n_blk_of(last) > from;
  return r;
}

K4_BODY bool beats(int32_t ah, int32_t al, int32_t bh, int32_t bl) { return ah > bh || (ah == bh && (K4_MUTANT_ON(12) ? al < bl : al > bl)); }

// One placed candidate (place (seed:L453-L475)): its slot's pages and block id.
K4_BODY void place_one(const IndexArgs& a, int32_t* table, int32_t* blocks, int32_t key, int32_t bb, int rank,
                       int32_t kt, int n_blk, int n_full, const int32_t* bt_row) {
  const DevCfg& cfg = a.cfg;
  const int tail = n_blk - 1;
  const bool is_tail = bb == tail;
  const bool tail_first = kt > key || (kt == key && tail > bb);
  const int slot = is_tail && !K4_MUTANT_ON(2) ? n_full : rank - (tail_first ? 1 : 0);
  const int32_t page = bt_row[bb];
  for (int j = 0; j < cfg.ppb; ++j) table[slot * cfg.ppb + j] = page * cfg.kv_page_stride + j;
  blocks[slot] = bb;
}

K4_BODY int32_t sparse_ctx(const DevCfg& cfg, bool tail_sel, int n_sel, int n_blk, int seq_len) {
  const int n_full = n_sel - (tail_sel ? 1 : 0), tail = n_blk - 1;
  const int capped = n_sel * cfg.sparse_block < seq_len ? n_sel * cfg.sparse_block : seq_len;
  return tail_sel ? n_full * cfg.sparse_block + seq_len - tail * cfg.sparse_block - (K4_MUTANT_ON(8) ? 1 : 0) : capped;
}

K4_BODY void plant(int32_t* table, int rank, int k) {
  if (kPlantStage == 0 && rank == 0 && k == 0) table[0] ^= 1;
}

// -------------------------------------------------------------------- short rows
struct ShortBody {
  IndexArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int k = c.bx, r = c.by, S = a.tokens, TW = cfg.table_words, T = cfg.topk_blocks;
    int32_t* table = a.sparse_table + (size_t(r) * S + k) * TW;
    int32_t* blocks = a.blocks + (size_t(r) * S + k) * T;
    const RowInfo row = row_info(a, k);
    SmemCarver carve{smem};
    int32_t* key = carve.take<int32_t>(cfg.long_from_blocks);
    int32_t* rank = carve.take<int32_t>(cfg.long_from_blocks);
    // every row: unselected slots hold 0 / -1 (the long rows' final kernel places later)
    c.each(TW + T, [&](int i) {
      if (i < TW) table[i] = 0;
      else blocks[i - TW] = -1;
      if (i == 0) {
        a.n_ctx[size_t(r) * S + k] = 0;
        a.long_row[size_t(r) * S + k] = row.long_path ? 1 : 0;
      }
    });
    if (row.long_path) return;  // uniform over the block
    const int n_blk = row.n_blk, n_sel = n_blk < T ? n_blk : T, tail = n_blk - 1;
    const bool scored = n_blk > T - (K4_MUTANT_ON(13) ? 1 : 0);  // scored (seed:L302) -- short contexts take id order
    const float* sc = a.scores + (size_t(r) * S + k) * a.score_width;  // rank r's own scores
    c.each(n_blk, [&](int b) {
      // a pinned block's slot holds no score: its key is forced, the word is not used
      const bool pinned = b < cfg.init_blocks || b >= n_blk - cfg.local_blocks;
      key[b] = scored ? index_key(cfg, b, pinned ? 0.0f : sc[b], n_blk) : -b;
    });
    c.each(n_blk, [&](int b) {
      int cnt = 0;
      for (int j = 0; j < n_blk; ++j) cnt += key[j] > key[b] || (key[j] == key[b] && (K4_MUTANT_ON(1) ? j < b : j > b));
      rank[b] = cnt;
    });
    const int32_t* bt_row = a.block_table + size_t(k) * a.bt_width;
    c.each(n_blk, [&](int b) {
      const bool tail_sel = rank[tail] < n_sel;
      if (rank[b] < n_sel)
        place_one(a, table, blocks, key[b], b, rank[b], key[tail], n_blk, n_sel - (tail_sel ? 1 : 0), bt_row);
    });
    c.one([&] {
      const int32_t n_ctx = sparse_ctx(cfg, rank[tail] < n_sel, n_sel, n_blk, K4_MUTANT_ON(7) ? a.seq_lens[k] : row.ctx);
      table[TW - 1] = n_ctx;
      a.n_ctx[size_t(r) * S + k] = n_ctx;
      plant(table, r, k);
    });
  }
};

// -------------------------------------------------------------- the lane networks
// n lanes (a multiple of 64) in shared memory: lane t's (key, block) at k[t], b[t]; the
// seed's xor shuffles stay inside a 64-lane group since every offset is < 64.
struct Lanes {
  int32_t* k;
  int32_t* b;
};

// dst[t] = src[t ^ off]
template <class Ctx>
K4_BODY void gather(Ctx& c, Lanes dst, Lanes src, int off, int n) {
  c.each(n, [&](int t) {
    dst.k[t] = src.k[t ^ off];
    dst.b[t] = src.b[t ^ off];
  });
}

// Bitonic sort of each 16-lane group, descending (sort16_desc (seed:L408-L420)).
template <class Ctx>
K4_BODY void sort16_desc(Ctx& c, Lanes a, Lanes tmp, int n) {
  for (int s = 0; s < 4; ++s) {
    const int size = 2 << s;
    for (int t = s; t >= 0; --t) {
      const int stride = 1 << t;
      gather(c, tmp, a, stride, n);
      c.each(n, [&](int i) {
        const int l16 = i % 16;
        const bool asc = (l16 & size) != 0;
        const bool low = (l16 & stride) == 0;
        const bool take_high = low ^ asc;
        const bool partner_high = beats(tmp.k[i], tmp.b[i], a.k[i], a.b[i]);
        if (partner_high == take_high) a.k[i] = tmp.k[i], a.b[i] = tmp.b[i];
      });
    }
  }
}

// a := the top half of the descending 16-lists a and b_src[t ^ b_off]
// (merge16_best (seed:L395-L407)).
template <class Ctx>
K4_BODY void merge16_best(Ctx& c, Lanes a, Lanes b_src, int b_off, Lanes tmp, int n) {
  gather(c, tmp, b_src, b_off, n);
  c.each(n, [&](int i) {
    if (beats(tmp.k[i], tmp.b[i], a.k[i], a.b[i])) a.k[i] = tmp.k[i], a.b[i] = tmp.b[i];
  });
  for (int off = 8; off >= 1; off /= 2) {
    gather(c, tmp, a, off, n);
    c.each(n, [&](int i) {
      const bool p_hi = beats(tmp.k[i], tmp.b[i], a.k[i], a.b[i]);
      const bool take_hi = ((i % 16) & off) == 0;
      if (p_hi == take_hi) a.k[i] = tmp.k[i], a.b[i] = tmp.b[i];
    });
  }
}

// Exact top 16 of each wave's 128 pairs (h0, h1 lanes) into h0's lanes 0..15
// (wave_best (seed:L421-L435)).
template <class Ctx>
K4_BODY void wave_best(Ctx& c, Lanes h0, Lanes h1, Lanes tmp, int n) {
  sort16_desc(c, h0, tmp, n);
  sort16_desc(c, h1, tmp, n);
  merge16_best(c, h0, h0, 31, tmp, n);
  merge16_best(c, h1, h1, 31, tmp, n);
  merge16_best(c, h0, h0, 47, tmp, n);
  merge16_best(c, h1, h1, 47, tmp, n);
  merge16_best(c, h0, h1, 15, tmp, n);
}

// Eight sorted 16-rows of (cand_k, cand_b) -> the exact top 16 in lanes 0..15 of a (64 lanes;
// rank_cands (seed:L436-L452)). b, tmp: 64-lane scratch.
template <class Ctx>
K4_BODY void rank_cands(Ctx& c, Lanes a, Lanes b, Lanes tmp, const int32_t* cand_k, const int32_t* cand_b) {
  c.each(kNetLanes, [&](int lane) {
    const int group = lane / 16, index = lane % 16;
    const int ai = (2 * group) * 16 + index;
    const int bi = (2 * group + 1) * 16 + (K4_MUTANT_ON(11) ? index : 16 - 1 - index);
    a.k[lane] = cand_k[ai], a.b[lane] = cand_b[ai];
    b.k[lane] = cand_k[bi], b.b[lane] = cand_b[bi];
  });
  merge16_best(c, a, b, 0, tmp, kNetLanes);
  merge16_best(c, a, a, 31, tmp, kNetLanes);
  merge16_best(c, a, a, 47, tmp, kNetLanes);
}

// ------------------------------------------------------------------ long rows: shares
struct LongShareBody {
  IndexArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int NS = cfg.n_split, k = c.bx / NS, part = c.bx % NS, r = c.by, S = a.tokens;
    const RowInfo row = row_info(a, k);
    if (!row.long_path) return;
    const int n = cfg.threads;  // 8 waves of 64 lanes
    SmemCarver carve{smem};
    Lanes h0{carve.take<int32_t>(n), carve.take<int32_t>(n)};
    Lanes h1{carve.take<int32_t>(n), carve.take<int32_t>(n)};
    Lanes tmp{carve.take<int32_t>(n), carve.take<int32_t>(n)};
    int32_t* cand_k = carve.take<int32_t>(cfg.waves * 16);
    int32_t* cand_b = carve.take<int32_t>(cfg.waves * 16);
    const int n_blk = row.n_blk;
    const float* sc = a.scores + (size_t(r) * S + k) * a.score_width;  // rank r's own scores
    if (cfg.index_cp) {
      // rank r's sel_cp slot `part` = 2 s + h (out_slot (seed:L546-L547)): owner rank s's half h
      // of its own blocks own0 + TP j (own0 (seed:L534)), keyed with head r's scores
      const int TP = cfg.tp, init = cfg.init_blocks, s = part / 2;
      const int rem = K4_MUTANT_ON(78) ? (s - init) % TP : ((s - init) % TP + TP) % TP;  // Python's mod
      const int own0 = K4_MUTANT_ON(77) ? s : init + rem;
      const int n_own = K4_MUTANT_ON(81) ? (n_blk - own0) / TP : (n_blk - own0 + TP - 1) / TP;
      // the last scored one: the local blocks' slots hold no score (last (seed:L537))
      const int last = own0 + TP * ((n_blk - cfg.local_blocks - own0 + TP - 1) / TP - 1);
      const int span = (n_own + 1) / 2, lo = (part % 2) * span, hi = lo + span < n_own ? lo + span : n_own;
      c.each(n, [&](int t) {  // thread t keys own blocks j = lo + t and lo + t + THREADS
        for (int i = 0; i < kCandBatch; ++i) {
          const int j = lo + t + cfg.threads * i, b = own0 + TP * j;
          const bool lv = j < hi;
          const int slot = b < last ? b : last;  // head r's logical scores: block b at b
          const int32_t key = lv ? index_key(cfg, b, sc[K4_MUTANT_ON(82) ? slot / TP : slot], n_blk) : kKeyNone;
          const Lanes h = i == 0 ? h0 : h1;
          h.k[t] = key;
          h.b[t] = lv ? b : -1;
        }
      });
    } else {
      const int span = (n_blk + NS - 1) / NS, lo = part * span, hi = lo + span < n_blk ? lo + span : n_blk;
      c.each(n, [&](int t) {  // thread t = wave * 64 + lane keys blocks lo + t and lo + t + THREADS
        for (int i = 0; i < kCandBatch; ++i) {
          const int b = lo + t + cfg.threads * i;
          const bool lv = b < hi;
          int slot = b > cfg.init_blocks ? b : cfg.init_blocks;
          slot = slot < n_blk - 1 - cfg.local_blocks ? slot : n_blk - 1 - cfg.local_blocks;
          const int32_t key = lv ? index_key(cfg, b, sc[slot > 0 ? slot : 0], n_blk) : kKeyNone;
          const Lanes h = i == 0 ? h0 : h1;
          h.k[t] = key;
          h.b[t] = lv ? b : -1;
        }
      });
    }
    wave_best(c, h0, h1, tmp, n);
    c.each(cfg.waves * 16, [&](int i) {
      const int w = i / 16, lane = i % 16;
      cand_k[i] = h0.k[w * kNetLanes + lane];
      cand_b[i] = h0.b[w * kNetLanes + lane];
    });
    rank_cands(c, h1, h0, tmp, cand_k, cand_b);
    int32_t* out = a.cand + ((size_t(r) * S + k) * NS + part) * 16 * 2;
    c.each(16, [&](int cnt) {
      out[2 * cnt] = h1.k[cnt];
      out[2 * cnt + 1] = h1.b[cnt];
    });
  }
};

// --------------------------------------------------------- long rows: final merge
struct LongFinalBody {
  IndexArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char* smem) const {
    const DevCfg& cfg = a.cfg;
    const int NS = cfg.n_split, k = c.bx, r = c.by, S = a.tokens, TW = cfg.table_words, T = cfg.topk_blocks;
    const RowInfo row = row_info(a, k);
    if (!row.long_path) return;
    SmemCarver carve{smem};
    Lanes top{carve.take<int32_t>(kNetLanes), carve.take<int32_t>(kNetLanes)};
    Lanes b{carve.take<int32_t>(kNetLanes), carve.take<int32_t>(kNetLanes)};
    Lanes tmp{carve.take<int32_t>(kNetLanes), carve.take<int32_t>(kNetLanes)};
    int32_t* cand_k = carve.take<int32_t>(NS * 16);
    int32_t* cand_b = carve.take<int32_t>(NS * 16);
    int32_t* flag = carve.take<int32_t>(1);
    const int32_t* in = a.cand + (size_t(r) * S + k) * NS * 16 * 2;
    c.each(NS * 16, [&](int i) {
      cand_k[i] = in[2 * i];
      cand_b[i] = in[2 * i + 1];
    });
    rank_cands(c, top, b, tmp, cand_k, cand_b);
    const int n_blk = row.n_blk, n_sel = n_blk < T ? n_blk : T, tail = n_blk - 1;
    // the tail block is a local one: its key is forced (kt (seed:L611))
    const int32_t kt = index_key(cfg, tail, 0.0f, n_blk);
    c.one([&] {
      bool tail_sel = false;
      for (int i = 0; i < 16; ++i) tail_sel |= top.b[i] >= 0 && i < n_sel && top.b[i] == tail;
      flag[0] = tail_sel ? 1 : 0;
    });
    int32_t* table = a.sparse_table + (size_t(r) * S + k) * TW;
    int32_t* blocks = a.blocks + (size_t(r) * S + k) * T;
    const int32_t* bt_row = a.block_table + size_t(k) * a.bt_width;
    c.each(16, [&](int i) {
      if (top.b[i] >= 0 && i < n_sel)
        place_one(a, table, blocks, top.k[i], top.b[i], i, kt, n_blk, n_sel - flag[0], bt_row);
    });
    c.one([&] {
      const int32_t n_ctx = sparse_ctx(cfg, flag[0] != 0, n_sel, n_blk, row.ctx);
      table[TW - 1] = n_ctx;
      a.n_ctx[size_t(r) * S + k] = n_ctx;
      plant(table, r, k);
    });
  }
};

}  // namespace

void launch_select_blocks(const IndexArgs& a, hipStream_t s) {
  const DevCfg& cfg = a.cfg;
  const size_t short_smem = SmemSize().add<int32_t>(cfg.long_from_blocks).add<int32_t>(cfg.long_from_blocks).used;
  launch(ShortBody{a}, Grid{a.tokens, a.ranks, 1}, cfg.threads, short_smem, s);
  // the long-path kernels run for every step: a block whose row is short returns at once
  SmemSize share;
  for (int i = 0; i < 6; ++i) share.add<int32_t>(cfg.threads);
  share.add<int32_t>(cfg.waves * 16).add<int32_t>(cfg.waves * 16);
  launch(LongShareBody{a}, Grid{a.tokens * cfg.n_split, a.ranks, 1}, cfg.threads, share.used, s);
  SmemSize fin;
  for (int i = 0; i < 6; ++i) fin.add<int32_t>(kNetLanes);
  fin.add<int32_t>(cfg.n_split * 16).add<int32_t>(cfg.n_split * 16).add<int32_t>(1);
  launch(LongFinalBody{a}, Grid{a.tokens, a.ranks, 1}, cfg.threads, fin.used, s);
}

}  // namespace k4::gpu
