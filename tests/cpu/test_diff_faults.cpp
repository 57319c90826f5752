// test_diff_faults.cpp -- planted kernel faults, one per stage and kind, each written as a
// dump: the diff names the right rank, stage, tensor and element (bits, values, distance),
// and the replay calls the planted stage wrong and every stage downstream of it (which,
// replayed on the dump's own inputs, matches) an inherited fault.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "golden/diff/compare.hpp"
#include "tests/cpu/test_diff_world.hpp"

using namespace k4;
using namespace k4::golden;
using k4::test::DiffWorld;
using k4::test::Fault;

namespace {

const TensorDiff* find_tensor(const StageDiff& s, const std::string& name) {
  for (const TensorDiff& t : s.tensors)
    if (t.name == name && t.group.find("outputs") != std::string::npos) return &t;
  return nullptr;
}

const StageDiff& stage_of(const DiffReport& rep, const std::string& stage, int rank) {
  for (const StageDiff& s : rep.stages)
    if (s.stage == stage && s.rank == rank) return s;
  throw std::logic_error("no stage " + stage);
}

int stage_pos(const std::string& s) {
  const auto& n = stage_names();
  return int(std::find(n.begin(), n.end(), s) - n.begin());
}

// Writes the fault's dump, diffs with replay, and checks what every fault must show.
// every_rank: the fault is planted on every rank (the planted stage is wrong on each).
DiffReport check_fault(const Fault& F, bool every_rank = false) {
  const DiffWorld& W = test::diff_world();
  const std::string dump = W.path(F.name + ".h5");
  write_dump(dump, W.cfg, W.in.shared.tokens, F.res, {}, true);
  DiffOptions opt;
  opt.replay = true;
  opt.max_list = 4;
  const DiffReport rep = diff_files(W.golden_path, dump, opt);
  CAPTURE(F.name);
  CHECK(rep.exit_code() == 1);
  CHECK(rep.any_mismatch());
  CHECK(rep.not_compared.empty());
  REQUIRE(rep.first.found);
  CHECK(rep.first.rank == F.rank);
  CHECK(rep.first.stage == F.stage);
  CHECK(rep.first.tensor == F.tensor);
  CHECK(rep.first.index == F.index);
  // The planted tensor: its first mismatch is at that element, with both sides' bits.
  const StageDiff& ps = stage_of(rep, F.stage, F.rank);
  const TensorDiff* pt = find_tensor(ps, F.tensor);
  REQUIRE(pt != nullptr);
  REQUIRE(!pt->first.empty());
  CHECK(pt->first.front().index == F.index);
  CHECK(pt->first.front().ref != pt->first.front().got);
  // Verdicts: the planted stage is wrong; everything before it matches; everything after
  // it that differs from the golden inherited the bad input (its replay matches the dump).
  for (const StageDiff& s : rep.stages) {
    CAPTURE(s.stage);
    CAPTURE(s.rank);
    CAPTURE(s.replay.text);
    const bool planted = s.stage == F.stage && (every_rank || s.rank == F.rank);
    if (planted) {
      CHECK(s.replay.verdict == Verdict::Own);
    } else if (stage_pos(s.stage) < stage_pos(F.stage)) {
      CHECK(s.status == StageDiff::Status::Match);
      CHECK(s.replay.verdict == Verdict::Match);
    } else if (s.mismatches() > 0) {
      CHECK(s.replay.verdict == Verdict::Inherited);
    } else {
      CHECK(s.replay.verdict == Verdict::Match);
    }
  }
  // The text report says the same.
  const std::string text = report_text(rep);
  CHECK(text.find("first divergence: rank " + std::to_string(F.rank) + ", stage " + F.stage + ", tensor " + F.tensor) !=
        std::string::npos);
  CHECK(text.find("this stage is wrong") != std::string::npos);
  return rep;
}

std::set<std::pair<std::string, int>> inherited(const DiffReport& rep) {
  std::set<std::pair<std::string, int>> s;
  for (const StageDiff& sd : rep.stages)
    if (sd.replay.verdict == Verdict::Inherited) s.insert({sd.stage, sd.rank});
  return s;
}

}  // namespace

TEST_SUITE("diff") {

TEST_CASE("planted fault: a flipped bit in split o (rank 1)") {
  const DiffWorld& W = test::diff_world();
  const Fault F = test::fault_split_bit_flip(W);
  const DiffReport rep = check_fault(F);
  const TensorDiff* o = find_tensor(stage_of(rep, "split", 1), "o");
  REQUIRE(o);
  CHECK(o->mismatches == 1);
  CHECK(o->first[0].dist.kind == Distance::Kind::Ulp);
  CHECK(o->first[0].dist.n == 64);  // bit 6 of a bf16: 64 ulp
  CHECK((o->first[0].ref ^ o->first[0].got) == 0x40u);
  CHECK(o->dims == std::vector<std::string>{"token", "split", "dim"});
  // downstream: rank 1's merge, then every rank's o_proj all-reduce, router and experts
  const auto inh = inherited(rep);
  CHECK(inh.count({"merge", 1}));
  for (int r = 0; r < W.cfg.tp; ++r) {
    CAPTURE(r);
    CHECK(inh.count({"oproj", r}));
    CHECK(inh.count({"router", r}));
    CHECK(inh.count({"moe", r}));
  }
  CHECK(!inh.count({"merge", 0}));  // other ranks' attention is untouched
}

TEST_CASE("planted fault: one MXFP8 scale of xn rounded down (router xsc, rank 2), and its downstream effect") {
  const DiffWorld& W = test::diff_world();
  const Fault F = test::fault_xsc_round_down(W);
  const DiffReport rep = check_fault(F);
  const StageDiff& router = stage_of(rep, "router", 2);
  const TensorDiff* xsc = find_tensor(router, "xsc");
  REQUIRE(xsc);
  CHECK(xsc->mismatches == 1);
  CHECK(xsc->dtype == DType::E8M0);
  CHECK(xsc->first[0].ref == xsc->first[0].got + 1);
  CHECK(xsc->first[0].dist.n == 1);
  CHECK(router.mismatches() == 1);  // only the scale: xn8 as stored
  // the experts of rank 2 computed with the bad scale: gate / up of token 1 differ, inherited
  const StageDiff& moe2 = stage_of(rep, "moe", 2);
  const TensorDiff* gate = find_tensor(moe2, "gate");
  REQUIRE(gate);
  CHECK(gate->mismatches > 0);
  for (const Mismatch& m : gate->first) CHECK(m.index[0] == 1);
  const auto inh = inherited(rep);
  for (int r = 0; r < W.cfg.tp; ++r) CHECK(inh.count({"moe", r}));  // ar_out: every rank sums rank 2's partial
  // the up/gate step of rank 2 was recomputed on the dump's xsc and matched the dump
  bool seen = false;
  for (const ReplayStep& st : moe2.replay.steps)
    if (st.name == "up/gate") {
      seen = true;
      CHECK(st.recomputed);
      for (const TensorDiff& t : st.outputs) CHECK(t.status == TensorDiff::Status::Match);
    }
  CHECK(seen);
}

TEST_CASE("planted fault: two tied experts swapped in a route (rank 0)") {
  const DiffWorld& W = test::diff_world();
  // the tie is real: equal route scores, the lower id picked first
  const int E = W.cfg.n_routed, SL = W.cfg.moe_slots(), k = W.tie_token;
  const int ea = W.gold.ranks[0].route.ids[size_t(k) * SL + W.tie_slot_a];
  const int eb = W.gold.ranks[0].route.ids[size_t(k) * SL + W.tie_slot_b];
  REQUIRE(ea < eb);
  CHECK(W.gold.ranks[0].router.sig[size_t(k) * E + ea] == W.gold.ranks[0].router.sig[size_t(k) * E + eb]);
  const Fault F = test::fault_tied_experts(W);
  const DiffReport rep = check_fault(F);
  const StageDiff& moe0 = stage_of(rep, "moe", 0);
  const TensorDiff* ids = find_tensor(moe0, "route_ids");
  REQUIRE(ids);
  CHECK(ids->mismatches == 2);
  CHECK(ids->first[0].dist.kind == Distance::Kind::Int);
  CHECK(ids->first[0].dist.n == eb - ea);
  CHECK(find_tensor(moe0, "route_weights")->mismatches == 0);  // tied: the same weights
  // the routing step is the one that differs; up/gate on the dump's route matches the dump
  for (const ReplayStep& st : moe0.replay.steps) {
    CAPTURE(st.name);
    bool any = false;
    for (const TensorDiff& t : st.outputs) any = any || t.status == TensorDiff::Status::Mismatch;
    CHECK(any == (st.name == "routing"));
  }
  CHECK(moe0.replay.text.find("route_ids") != std::string::npos);
}

TEST_CASE("planted fault: two blocks swapped in the index sparse table (rank 3)") {
  const DiffWorld& W = test::diff_world();
  const Fault F = test::fault_block_order(W);
  const DiffReport rep = check_fault(F);
  const TensorDiff* st = find_tensor(stage_of(rep, "index", 3), "sparse_table");
  REQUIRE(st);
  CHECK(st->mismatches == 2 * uint64_t(W.cfg.pages_per_block()));
  CHECK(st->dims == std::vector<std::string>{"token", "table_word"});
  const auto inh = inherited(rep);
  CHECK(inh.count({"split", 3}));  // the partitions hold other keys
  CHECK(!inh.count({"split", 0}));
  for (int r = 0; r < W.cfg.tp; ++r) CHECK(inh.count({"router", r}));
}

TEST_CASE("planted fault: the FFN partial rows summed in reversed rank order (ar_out, every rank)") {
  const DiffWorld& W = test::diff_world();
  // the world's FFN rows cancel across ranks 0 and 1 (test_diff_world.hpp)
  const std::vector<uint16_t>&p0 = W.gold.ranks[0].moe.partial, &p1 = W.gold.ranks[1].moe.partial;
  size_t negated = 0;
  for (size_t i = 0; i < p0.size(); ++i) negated += (p0[i] ^ p1[i]) == 0x8000u || (p0[i] & 0x7FFFu) == 0;
  CHECK(negated == p0.size());
  const Fault F = test::fault_ffn_rank_order(W);
  REQUIRE_MESSAGE(!F.index.empty(), "the reversed rank order changed no bit on these inputs: the case would test nothing");
  const DiffReport rep = check_fault(F, /*every_rank=*/true);
  for (const StageDiff& s : rep.stages) {
    CAPTURE(s.stage);
    CAPTURE(s.rank);
    if (s.stage != "moe") {
      CHECK(s.status == StageDiff::Status::Match);
      continue;
    }
    for (const TensorDiff& t : s.tensors) CHECK((t.name == "ar_out") == (t.mismatches > 0));
    // the step that is wrong is the all-reduce
    for (const ReplayStep& st : s.replay.steps)
      for (const TensorDiff& t : st.outputs) CHECK((t.status == TensorDiff::Status::Mismatch) == (st.name == "all-reduce"));
  }
}

}  // TEST_SUITE
