// test_diff.cpp -- k4 diff: element distances per dtype, the tensor diff, partial dumps
// (missing ranks, stages, tensors; shape and dtype that differ), unusable inputs, and the
// CLI's exit codes and JSON (0 match, 1 mismatch, 2 unusable input).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "tests/cpu/cli_run.hpp"
#include "reference/numerics/hd.hpp"
#include "golden/diff/compare.hpp"
#include "golden/io/hdf5.hpp"
#include "tests/cpu/test_diff_world.hpp"

namespace fs = std::filesystem;
using namespace k4;
using namespace k4::golden;
using k4::test::DiffWorld;

namespace {


using k4::cli::k4_bin;  // tests/cpu/cli_run.hpp
using k4::cli::slurp;

struct Cmd {
  int rc;
  std::string out, err;
};

Cmd run_k4(const std::string& args) {
  const DiffWorld& W = test::diff_world();
  const std::string o = W.path("cli_out.txt"), e = W.path("cli_err.txt");
  const int s = std::system((k4_bin() + " " + args + " > " + o + " 2> " + e).c_str());
  return Cmd{WIFEXITED(s) ? WEXITSTATUS(s) : -1, slurp(o), slurp(e)};
}

const StageDiff& stage_of(const DiffReport& rep, const std::string& stage, int rank) {
  for (const StageDiff& s : rep.stages)
    if (s.stage == stage && s.rank == rank) return s;
  throw std::logic_error("no stage " + stage);
}

}  // namespace

TEST_SUITE("diff") {

TEST_CASE("distances: ULPs in the ordered-integer form, -0 vs +0, NaN, integer deltas, every dtype") {
  // f32: neighbours, across zero, -0 / +0, NaN
  CHECK(distance(DType::F32, f32_bits(1.0f), f32_bits(std::nextafter(1.0f, 2.0f))).n == 1);
  CHECK(distance(DType::F32, 0x00000001u, 0x80000001u).n == 2);  // +min subnormal vs -min subnormal
  const Distance z = distance(DType::F32, 0x00000000u, 0x80000000u);
  CHECK(z.kind == Distance::Kind::Ulp);
  CHECK(z.n == 0);
  CHECK(z.str() == "0 ulp (-0 vs +0)");
  CHECK(distance(DType::F32, 0x7FC00000u, f32_bits(1.0f)).kind == Distance::Kind::NanVsNumber);
  CHECK(distance(DType::F32, 0x7FC00000u, 0xFFC00000u).kind == Distance::Kind::NanVsNan);
  CHECK(distance(DType::F32, f32_bits(3.4028235e38f), 0x7F800000u).n == 1);  // max finite vs inf
  // bf16
  CHECK(distance(DType::BF16, 0x3F80u, 0x3F81u).n == 1);
  CHECK(distance(DType::BF16, 0x3F80u, 0xBF80u).n == 2 * 0x3F80);
  CHECK(distance(DType::BF16, 0x7FC1u, 0x3F80u).kind == Distance::Kind::NanVsNumber);
  // e4m3: 0x7F / 0xFF are NaN, 0x7E = 448
  CHECK(distance(DType::E4M3, 0x7Eu, 0x7Du).n == 1);
  CHECK(distance(DType::E4M3, 0x01u, 0x81u).n == 2);
  CHECK(distance(DType::E4M3, 0x7Fu, 0x7Eu).kind == Distance::Kind::NanVsNumber);
  // e8m0: unsigned exponent, 0xFF NaN
  CHECK(distance(DType::E8M0, 127u, 126u).n == 1);
  CHECK(distance(DType::E8M0, 0xFFu, 0xFEu).kind == Distance::Kind::NanVsNumber);
  // e2m1x2: the larger of the two nibbles' distances
  CHECK(distance(DType::E2M1X2, 0x21u, 0x71u).n == 5);
  CHECK(distance(DType::E2M1X2, 0x19u, 0x11u).n == 2);  // -0.5 vs +0.5 in the low nibble
  // integers: |a - b|
  CHECK(distance(DType::I32, uint32_t(-3), 4u).kind == Distance::Kind::Int);
  CHECK(distance(DType::I32, uint32_t(-3), 4u).n == 7);
  CHECK(distance(DType::U8, 0u, 255u).n == 255);
  // decoded values and bits
  CHECK(value_text(DType::BF16, 0x3F80u) == "1");
  CHECK(value_text(DType::F32, 0x80000000u) == "-0");
  CHECK(value_text(DType::E4M3, 0x7Eu) == "448");
  CHECK(value_text(DType::E4M3, 0x7Fu) == "nan");
  CHECK(value_text(DType::E8M0, 127u) == "1");
  CHECK(value_text(DType::E2M1X2, 0xB1u) == "(0.5, -1.5)");
  CHECK(value_text(DType::I32, uint32_t(-7)) == "-7");
  CHECK(bits_hex(DType::BF16, 0x3C5Eu) == "0x3c5e");
  CHECK(bits_hex(DType::F32, 1u) == "0x00000001");
  CHECK(bits_hex(DType::E8M0, 0x7Cu) == "0x7c");
}

TEST_CASE("tensor diff: counts, the first N in index order with named indices, the histogram") {
  RawTensor a = raw_tensor<uint16_t>(DType::BF16, {"token", "hidden"}, {2, 3}, {0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x0000, 0x7FC0});
  RawTensor b = raw_tensor<uint16_t>(DType::BF16, {"token", "hidden"}, {2, 3}, {0x3F80, 0x3F84, 0x3F80, 0x3F81, 0x8000, 0x3F80});
  TensorDiff d;
  diff_tensor(d, a, b, 2);
  CHECK(d.status == TensorDiff::Status::Mismatch);
  CHECK(d.mismatches == 4);
  REQUIRE(d.first.size() == 2);
  CHECK(d.first[0].flat == 1);
  CHECK(d.first[0].index == std::vector<uint64_t>{0, 1});
  CHECK(d.first[1].index == std::vector<uint64_t>{1, 0});
  CHECK(index_text(d.first[0].index, d.dims) == "[token 0, hidden 1]");
  CHECK(d.where == std::vector<uint64_t>{1, 3, 4, 5});
  CHECK(d.hist[0] == 1);  // -0 vs +0
  CHECK(d.hist[1] == 1);  // 1 ulp
  CHECK(d.hist[3] == 1);  // 4 ulp: bucket 4-7
  CHECK(hist_label(3) == "4-7");
  CHECK(hist_label(9) == "2^8");  // [2^8, 2^9)
  CHECK(d.nan_vs_number == 1);
  TensorDiff same;
  diff_tensor(same, a, a, 10);
  CHECK(same.status == TensorDiff::Status::Match);
  CHECK(same.mismatches == 0);
}

TEST_CASE("the golden against itself matches; a dump of the reference's own result matches") {
  const DiffWorld& W = test::diff_world();
  DiffOptions opt;
  opt.replay = true;
  const DiffReport self = diff_files(W.golden_path, W.golden_path, opt);
  CHECK(self.exit_code() == 0);
  CHECK(!self.first.found);
  CHECK(self.tensors_compared > 100);
  for (const StageDiff& s : self.stages) CHECK(s.replay.verdict == Verdict::Match);
  const std::string dump = W.path("clean.h5");
  write_dump(dump, W.cfg, W.in.shared.tokens, W.gold, {}, true);
  const DiffReport rep = diff_files(W.golden_path, dump, opt);
  CHECK(rep.exit_code() == 0);
  CHECK(rep.not_compared.empty());
  CHECK(rep.stages.size() == stage_names().size() * size_t(W.cfg.tp));
  CHECK(report_text(rep).find("result: MATCH") != std::string::npos);
}

TEST_CASE("partial dumps: missing ranks, stages and tensors are reported, the rest compared and replayed") {
  const DiffWorld& W = test::diff_world();
  const test::Fault F = test::fault_split_bit_flip(W);
  DumpSelection sel;
  sel.ranks = {1};
  sel.stages = {"split", "merge"};
  sel.omit = {"split/outputs/m"};
  const std::string dump = W.path("partial.h5");
  write_dump(dump, W.cfg, W.in.shared.tokens, F.res, sel, true);
  DiffOptions opt;
  opt.replay = true;
  const DiffReport rep = diff_files(W.golden_path, dump, opt);
  CHECK(rep.exit_code() == 1);
  CHECK(rep.first.found);
  CHECK(rep.first.rank == 1);
  CHECK(rep.first.stage == "split");
  CHECK(rep.first.tensor == "o");
  CHECK(stage_of(rep, "split", 0).status == StageDiff::Status::Missing);
  CHECK(stage_of(rep, "split", 0).why == "rank 0 is not in the dump");
  CHECK(stage_of(rep, "oproj", 1).status == StageDiff::Status::Missing);
  CHECK(stage_of(rep, "oproj", 1).why.find("stage oproj of rank 1 is not in the dump") != std::string::npos);
  bool m_listed = false;
  for (const NotCompared& n : rep.not_compared) m_listed = m_listed || (n.rank == 1 && n.tensor == "split/outputs/m");
  CHECK(m_listed);
  // merge replays on the dump's split outputs o and l, and on the golden's m (not dumped)
  const StageDiff& merge = stage_of(rep, "merge", 1);
  CHECK(merge.replay.verdict == Verdict::Inherited);
  REQUIRE(merge.replay.steps.size() == 1);
  bool golden_m = false;
  for (const std::string& s : merge.replay.steps[0].inputs) golden_m = golden_m || s == "split/outputs/m (golden: not in the dump)";
  CHECK(golden_m);
  CHECK(stage_of(rep, "split", 1).replay.verdict == Verdict::Own);
  CHECK(stage_of(rep, "moe", 2).replay.verdict == Verdict::NotReplayed);
  // --require-all turns what was not compared into a failure even when the rest matches
  const std::string clean = W.path("partial_clean.h5");
  write_dump(clean, W.cfg, W.in.shared.tokens, W.gold, sel, true);
  const DiffReport ok = diff_files(W.golden_path, clean, {});
  CHECK(ok.exit_code() == 0);
  CHECK(ok.exit_code(true) == 1);
}

TEST_CASE("replay says what it cannot replay: a page the golden (selected KV form) does not store") {
  const DiffWorld& W = test::diff_world();
  golden::GoldenMeta meta;
  meta.kv_form = "selected";
  golden::WriteOptions wo;
  wo.overwrite = true;
  const std::string sel_golden = W.path("golden_selected.h5");
  write_golden(sel_golden, W.w, W.in, W.gold, meta, wo);
  // a page no sparse table names: not stored in the selected form
  std::set<int32_t> named(W.gold.ranks[0].index.sparse_table.begin(), W.gold.ranks[0].index.sparse_table.end());
  int32_t unstored = 0;
  while (named.count(unstored)) ++unstored;
  REQUIRE(unstored < W.in.ranks[0].n_pages);
  StepResult bad = W.gold;
  bad.ranks[0].index.sparse_table[0] = unstored;  // token 0, slot 0, page 0: keys 0..15, read
  const std::string dump = W.path("unstored_page.h5");
  write_dump(dump, W.cfg, W.in.shared.tokens, bad, {{0}, {"index", "split"}, {}}, true);
  DiffOptions opt;
  opt.replay = true;
  const DiffReport rep = diff_files(sel_golden, dump, opt);
  CHECK(rep.first.stage == "index");
  CHECK(stage_of(rep, "index", 0).replay.verdict == Verdict::Own);
  const StageDiff& sp = stage_of(rep, "split", 0);
  CHECK(sp.replay.verdict == Verdict::NotReplayed);
  CHECK(sp.replay.text.find("does not store") != std::string::npos);
}

TEST_CASE("shape and dtype that differ are said, not compared, and fail the diff") {
  const DiffWorld& W = test::diff_world();
  const std::string dump = W.path("shapes.h5");
  DumpSelection sel;
  sel.ranks = {0};
  sel.stages = {"merge"};
  write_dump(dump, W.cfg, W.in.shared.tokens, W.gold, sel, true);
  {
    h5::File f(dump, h5::File::Mode::ReadWrite);
    h5::Group o = f.root().open_group("/rank0/merge/outputs");
    // x_scale stored with a wrong shape, attn8 with a wrong dtype attribute
    std::vector<uint32_t> x(3, 0);
    H5Ldelete(o.id(), "x_scale", H5P_DEFAULT);
    h5::Dataset d = o.write<uint32_t>("x_scale", {3}, x.data());
    d.set_attr("dtype", "f32");
    o.open_dataset("attn8").set_attr("dtype", "u8");
    f.close();
  }
  const DiffReport rep = diff_files(W.golden_path, dump, {});
  CHECK(rep.exit_code() == 1);
  const StageDiff& m = stage_of(rep, "merge", 0);
  CHECK(m.status == StageDiff::Status::Mismatch);
  int seen = 0;
  for (const TensorDiff& t : m.tensors) {
    if (t.name == "x_scale") {
      CHECK(t.status == TensorDiff::Status::ShapeDiffers);
      CHECK(t.why.find("(3)") != std::string::npos);
      ++seen;
    }
    if (t.name == "attn8") {
      CHECK(t.status == TensorDiff::Status::DtypeDiffers);
      CHECK(t.why.find("u8") != std::string::npos);
      ++seen;
    }
    if (t.name == "attn") CHECK(t.status == TensorDiff::Status::Match);
  }
  CHECK(seen == 2);
  CHECK(!rep.first.found);  // nothing compared differs; the two are listed as not compared
  CHECK(rep.not_compared.size() >= 2);
}

TEST_CASE("unusable inputs throw FormatError: missing file, not HDF5, not a golden, schema version, other config") {
  const DiffWorld& W = test::diff_world();
  CHECK_THROWS_AS(diff_files(W.path("nope.h5"), W.golden_path, {}), FormatError);
  CHECK_THROWS_AS(diff_files(W.golden_path, W.path("nope.h5"), {}), FormatError);
  {
    std::ofstream(W.path("text.h5")) << "not hdf5\n";
  }
  CHECK_THROWS_AS(diff_files(W.golden_path, W.path("text.h5"), {}), FormatError);
  const std::string v2 = W.path("v2.h5");
  write_dump(v2, W.cfg, W.in.shared.tokens, W.gold, {{0}, {"index"}, {}}, true);
  {
    h5::File f(v2, h5::File::Mode::ReadWrite);
    f.root().set_attr("schema_version", int64_t(3));
    f.close();
  }
  try {
    diff_files(W.golden_path, v2, {});
    FAIL("schema version 3 accepted");
  } catch (const FormatError& e) {
    CHECK(std::string(e.what()).find("schema version 3") != std::string::npos);
  }
  const std::string nomagic = W.path("nomagic.h5");
  write_dump(nomagic, W.cfg, W.in.shared.tokens, W.gold, {{0}, {"index"}, {}}, true);
  {
    h5::File f(nomagic, h5::File::Mode::ReadWrite);
    f.root().set_attr("magic", "SOMETHING");
    f.close();
  }
  CHECK_THROWS_AS(diff_files(W.golden_path, nomagic, {}), FormatError);
  const std::string other = W.path("other_tokens.h5");
  write_dump(other, W.cfg, W.in.shared.tokens, W.gold, {{0}, {"index"}, {}}, true);
  {
    h5::File f(other, h5::File::Mode::ReadWrite);
    f.root().set_attr("tokens", int64_t(3));
    f.close();
  }
  CHECK_THROWS_AS(diff_files(W.golden_path, other, {}), FormatError);
  // a dump with nothing of the schema in it cannot pass
  const std::string empty = W.path("empty.h5");
  write_dump(empty, W.cfg, W.in.shared.tokens, W.gold, {{0}, {"index"}, {"index/outputs/sparse_table", "index/outputs/blocks", "index/outputs/n_ctx", "index/outputs/long_row"}}, true);
  CHECK_THROWS_AS(diff_files(W.golden_path, empty, {}), FormatError);
}

TEST_CASE("k4 diff / k4 replay: exit codes 0 / 1 / 2, --json first_divergence, --max") {
  REQUIRE_K4();
  const DiffWorld& W = test::diff_world();
  const std::string clean = W.path("cli_clean.h5"), bad = W.path("cli_bad.h5"), js = W.path("cli.json");
  write_dump(clean, W.cfg, W.in.shared.tokens, W.gold, {}, true);
  write_dump(bad, W.cfg, W.in.shared.tokens, test::fault_xsc_round_down(W).res, {}, true);
  Cmd c = run_k4("diff " + W.golden_path + " " + clean);
  CHECK(c.rc == 0);
  CHECK(c.out.find("result: MATCH") != std::string::npos);
  c = run_k4("diff " + W.golden_path + " " + bad + " --max 3 --force --json " + js);
  CHECK(c.rc == 1);
  CHECK(c.out.find("first divergence: rank 2, stage router, tensor xsc, element [token 1, hidden_block 5]") != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(slurp(js));
  CHECK(j["result"] == "mismatch");
  CHECK(j["first_divergence"]["rank"] == 2);
  CHECK(j["first_divergence"]["stage"] == "router");
  CHECK(j["first_divergence"]["tensor"] == "xsc");
  CHECK(j["first_divergence"]["index"] == nlohmann::json::array({1, 5}));
  bool seen = false;
  for (const auto& s : j["stages"])
    for (const auto& t : s["tensors"])
      if (s["rank"] == 2 && t["name"] == "xsc") {
        seen = true;
        CHECK(t["mismatches"] == 1);
        CHECK(t["first"][0]["coords"]["hidden_block"] == 5);
        CHECK(t["first"][0]["ulp"] == 1);
        CHECK(t["first"][0]["dump"]["bits"].get<std::string>().size() == 4);
      }
  CHECK(seen);
  for (const auto& s : j["stages"])
    for (const auto& t : s["tensors"])
      if (t.contains("first")) CHECK(t["first"].size() <= 3);
  c = run_k4("replay " + W.golden_path + " " + bad + " --json -");
  CHECK(c.rc == 1);
  const nlohmann::json r = nlohmann::json::parse(c.out);
  CHECK(r["replayed"] == true);
  for (const auto& s : r["stages"])
    if (s["stage"] == "router" && s["rank"] == 2) CHECK(s["replay"]["verdict"] == "this stage is wrong");
  c = run_k4("diff " + W.golden_path + " " + W.path("missing.h5"));
  CHECK(c.rc == 2);
  CHECK(c.err.find("no such file") != std::string::npos);
  c = run_k4("diff " + W.path("missing.h5") + " " + clean);
  CHECK(c.rc == 2);
  {
    std::ofstream(W.path("cli_text.h5")) << "plain text\n";
  }
  c = run_k4("diff " + W.golden_path + " " + W.path("cli_text.h5"));
  CHECK(c.rc == 2);
  CHECK(c.err.find("HDF5") != std::string::npos);
  c = run_k4("diff " + W.golden_path);
  CHECK(c.rc == 2);  // usage
}

}  // TEST_SUITE
