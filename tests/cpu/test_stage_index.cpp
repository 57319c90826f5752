// test_stage_index.cpp -- stage 0 (sparse block selection) on hand-worked rows.
//
// Each case builds one decode row whose selection follows from the contract by hand (the
// expected slots are written out, not computed): pinned init / local blocks (init_blocks > 0
// through a custom Config), ties to the higher block id, -0 == +0, NaN below -Inf, short
// contexts in id order, the tail block last, n_ctx of a partial tail, pad rows, the long path.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/stages/index.hpp"

namespace {

using k4::Config;
using k4::IndexOut;
using k4::StepShared;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// One row (or several) with block table entry b -> 100 + b, so a page id names its block,
// and one rank's index scores.
struct Rows {
  StepShared sh;
  std::vector<float> scores;
};
Rows rows(const std::vector<int>& seq_lens, const std::vector<std::vector<float>>& scores, int q_len = 1) {
  Rows out;
  StepShared& sh = out.sh;
  sh.tokens = int(seq_lens.size());
  sh.q_len = q_len;
  sh.seq_lens = seq_lens;
  int width = 1;
  for (int L : seq_lens) width = std::max(width, (std::max(L, 1) + 127) / 128);
  sh.bt_width = sh.score_width = width;
  sh.block_table.assign(size_t(sh.tokens) * width, 0);
  out.scores.assign(size_t(sh.tokens) * width, 0.0f);
  for (int k = 0; k < sh.tokens; ++k)
    for (int b = 0; b < width; ++b) {
      if (seq_lens[k] > 0) sh.block_table[size_t(k) * width + b] = 100 + b;
      if (b < int(scores[k].size())) out.scores[size_t(k) * width + b] = scores[k][b];
    }
  return out;
}

void select_rows(IndexOut& out, const Rows& r, const Config& c) { k4::select_blocks(out, r.sh, r.scores, c); }

std::vector<int> slots_of(const IndexOut& out, int k) {
  return std::vector<int>(out.blocks.begin() + k * 16, out.blocks.begin() + k * 16 + 16);
}

// Slot s's 8 pages are entry * stride + j; every unused slot and page word is 0.
void check_table(const IndexOut& out, int k, const std::vector<int>& want_blocks, int stride, int want_n_ctx,
                 bool pad = false) {
  const int32_t* t = out.sparse_table.data() + size_t(k) * 129;
  for (int s = 0; s < 16; ++s)
    for (int j = 0; j < 8; ++j) {
      const int b = want_blocks[s];
      const int32_t want = b < 0 ? 0 : (pad ? 0 : 100 + b) * stride + j;
      CHECK_MESSAGE(t[s * 8 + j] == want, "row ", k, " slot ", s, " page ", j);
    }
  CHECK(t[128] == want_n_ctx);
  CHECK(out.n_ctx[k] == want_n_ctx);
}

std::vector<int> ids(std::initializer_list<int> l) {
  std::vector<int> v(l);
  v.resize(16, -1);
  return v;
}

}  // namespace

TEST_SUITE("stage_index") {

TEST_CASE("pinned init and local blocks (init_blocks 2, local_blocks 2), a partial tail") {
  Config c = k4::preset("tiny");
  c.init_blocks = 2;
  c.local_blocks = 2;
  c.validate();
  // 5000 keys: 40 blocks, the tail 39 holds 5000 - 39*128 = 8 keys. Scores rise with the id,
  // so the pins must override them: blocks 0, 1 score lowest, 38, 39 would rank anyway.
  std::vector<float> sc(40);
  for (int b = 0; b < 40; ++b) sc[b] = float(b);
  sc[0] = -100.0f, sc[1] = -50.0f;  // pinned at 1e30: their scores are never read
  IndexOut out;
  select_rows(out, rows({5000}, {sc}), c);
  // rank: 1, 0 (1e30, the tie to the higher id), 39, 38 (1e29), then 37 .. 26 by score;
  // the tail (39) moves to the last slot, the others keep their order.
  const std::vector<int> want = {1, 0, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 39};
  CHECK(slots_of(out, 0) == want);
  // n_ctx: 15 full blocks and the tail's 8 keys
  check_table(out, 0, want, c.kv_page_stride, 15 * 128 + 8);
  CHECK(out.long_row[0] == 0);
}

TEST_CASE("ties go to the higher block id") {
  const Config c = k4::preset("tiny");
  // 20 blocks of equal score (the tail's is forced): the 15 highest non-tail ids win, in id
  // order from the top, then the tail. 2560 keys = 20 full blocks.
  IndexOut out;
  select_rows(out, rows({2560}, {std::vector<float>(20, 1.0f)}), c);
  const std::vector<int> want = {18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 19};
  CHECK(slots_of(out, 0) == want);
  check_table(out, 0, want, c.kv_page_stride, 16 * 128);
}

TEST_CASE("-0 equals +0: the tie goes to the higher id, whichever sign it has") {
  const Config c = k4::preset("tiny");
  // 17 blocks, 16 selected: exactly one drops. Everything scores 1 except block 3 (+0) and
  // block 5 (-0). Equal keys: block 5 wins the tie, block 3 drops. (Were -0 below +0,
  // block 5 would drop.)
  std::vector<float> sc(17, 1.0f);
  sc[3] = 0.0f, sc[5] = -0.0f;
  IndexOut out;
  select_rows(out, rows({17 * 128}, {sc}), c);
  const std::vector<int> want = {15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 4, 2, 1, 0, 5, 16};
  CHECK(slots_of(out, 0) == want);
  CHECK(k4::index_key(c, 3, 0.0f, 17) == k4::index_key(c, 5, -0.0f, 17));
}

TEST_CASE("NaN ranks below -Inf, either sign of NaN") {
  const Config c = k4::preset("tiny");
  std::vector<float> sc(17, 1.0f);
  sc[4] = kNaN, sc[7] = -kInf;
  IndexOut out;
  select_rows(out, rows({17 * 128}, {sc}), c);
  // block 4 (NaN) drops; -Inf (block 7) is still a number and ranks last of the selected
  std::vector<int> want = {15, 14, 13, 12, 11, 10, 9, 8, 6, 5, 3, 2, 1, 0, 7, 16};
  CHECK(slots_of(out, 0) == want);
  // a negative NaN (0xFFC00000) likewise
  float neg_nan;
  const uint32_t bits = 0xFFC00000u;
  std::memcpy(&neg_nan, &bits, 4);
  sc[4] = neg_nan;
  select_rows(out, rows({17 * 128}, {sc}), c);
  CHECK(slots_of(out, 0) == want);
  CHECK(k4::index_key(c, 4, neg_nan, 17) == INT32_MIN);
  CHECK(k4::index_key(c, 4, kNaN, 17) == INT32_MIN);
  CHECK(k4::index_key(c, 7, -kInf, 17) > INT32_MIN);
}

TEST_CASE("short contexts (<= 16 blocks) take the blocks in id order; the scores are not read") {
  const Config c = k4::preset("tiny");
  for (int nb : {1, 2, 10, 16}) {
    CAPTURE(nb);
    std::vector<float> sc(nb);
    for (int b = 0; b < nb; ++b) sc[b] = b % 3 == 0 ? kNaN : float(-b);  // would reorder if read
    IndexOut out;
    const int seq = nb * 128 - 37;  // a partial tail of 91 keys
    select_rows(out, rows({seq}, {sc}), c);
    std::vector<int> want(16, -1);
    for (int b = 0; b < nb; ++b) want[b] = b;
    CHECK(slots_of(out, 0) == want);
    // the tail is last and partial: n_ctx is the whole context
    check_table(out, 0, want, c.kv_page_stride, seq);
  }
}

TEST_CASE("n_ctx for a partial tail, and a tail that is not selected") {
  Config c = k4::preset("tiny");
  // 17*128 + 5 keys: 18 blocks, the tail (17) holds 5 keys: 15 full blocks + 5
  std::vector<float> sc(18);
  for (int b = 0; b < 18; ++b) sc[b] = float(b % 5);
  IndexOut out;
  select_rows(out, rows({17 * 128 + 5}, {sc}), c);
  CHECK(out.n_ctx[0] == 15 * 128 + 5);
  CHECK(out.blocks[15] == 17);
  // Scores above the tail's pinned 1e29 (adversarial; K1's scores never get there) push the
  // tail out: 16 full blocks by rank (ties to the higher id), n_ctx = 16 * 128.
  std::vector<float> big(18, 2e29f);
  select_rows(out, rows({17 * 128 + 5}, {big}), c);
  const std::vector<int> want = {16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  CHECK(slots_of(out, 0) == want);
  CHECK(out.n_ctx[0] == 16 * 128);
  // +Inf scores outrank a pinned init block too (the pins are finite 1e30 / 1e29)
  c.init_blocks = 1;
  std::vector<float> inf(18, kInf);
  select_rows(out, rows({17 * 128 + 5}, {inf}), c);
  CHECK(slots_of(out, 0) == want);
}

TEST_CASE("pad rows (seq_len 0) select block 0 of page 0 with one key") {
  const Config c = k4::preset("tiny");
  IndexOut out;
  // a pad row next to a real one: the pad row's block-table row is all zero
  select_rows(out, rows({0, 300}, {{kNaN}, {1.0f, 2.0f, 3.0f}}), c);
  check_table(out, 0, ids({0}), c.kv_page_stride, 1, /*pad=*/true);
  CHECK(slots_of(out, 0) == ids({0}));
  CHECK(slots_of(out, 1) == ids({0, 1, 2}));
  CHECK(out.n_ctx[1] == 300);
}

TEST_CASE("kv_page_stride 8 and 16 address a block's 8 pages") {
  for (int stride : {8, 16}) {
    Config c = k4::preset("tiny");
    c.kv_page_stride = stride;
    c.validate();
    IndexOut out;
    select_rows(out, rows({200}, {{0.0f, 0.0f}}), c);
    check_table(out, 0, ids({0, 1}), stride, 200);
  }
}

TEST_CASE("a long request: every row takes the long path; it selects what ranking selects") {
  const Config c = k4::preset("tiny");
  // q_len 2: row 0 has 512 blocks (short by itself), row 1 has 513 (> THREADS): both long.
  const int L0 = 512 * 128, L1 = 512 * 128 + 1;
  std::vector<float> s0(513), s1(513);
  for (int b = 0; b < 513; ++b) s0[b] = s1[b] = -float(b);  // block 0's score is -0
  s1[300] = 5.0f;                                              // one outlier in row 1
  IndexOut out;
  select_rows(out, rows({L0, L1}, {s0, s1}, /*q_len=*/2), c);
  CHECK(out.long_row[0] == 1);
  CHECK(out.long_row[1] == 1);
  // row 0: the tail 511 pinned, then 0 (score -0), 1, ..., 14; tail last, full (512*128)
  CHECK(slots_of(out, 0) == std::vector<int>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 511}));
  CHECK(out.n_ctx[0] == 16 * 128);
  // row 1: the tail 512 (one key), then 300 (5.0), then 0 .. 13
  CHECK(slots_of(out, 1) == std::vector<int>({300, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 512}));
  CHECK(out.n_ctx[1] == 15 * 128 + 1);
  // the same rows as separate one-row requests: row 0 is then short, and selects the same
  IndexOut out2;
  select_rows(out2, rows({L0, L1}, {s0, s1}, /*q_len=*/1), c);
  CHECK(out2.long_row[0] == 0);
  CHECK(out2.long_row[1] == 1);
  CHECK(out2.sparse_table == out.sparse_table);
}

}  // TEST_SUITE
