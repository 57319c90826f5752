// test_weights_file.cpp -- `k4 golden --weights-file FILE` (golden/format/weights_file.hpp):
// the layer's weights written once and reused, goldens that refer to them through virtual
// datasets with a hash, read by every reader as if they held them; and every way the weights
// can go missing or change named with exit 2 and nothing left at --out.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>

#include "golden/format/schema.hpp"
#include "golden/format/weights_file.hpp"
#include "golden/io/hdf5.hpp"
#include "tests/cpu/cli_run.hpp"

namespace fs = std::filesystem;
using namespace k4;
using cli::Run;
using cli::TempDir;

namespace {

std::string golden_cmd(const std::string& out, int seed, const std::string& extra = "") {
  return "golden --preset tiny --tokens 4 --context 1000 --seed " + std::to_string(seed) + " --out " + out + " " + extra;
}

void expect_bad(const Run& r, std::initializer_list<std::string> want) {
  CAPTURE(r.err);
  CHECK(r.signal == 0);
  CHECK(r.rc == 2);
  for (const std::string& w : want) CHECK_MESSAGE(r.err.find(w) != std::string::npos, "stderr lacks: " << w);
}

// The same tensors, bit for bit: inputs, every rank's results and weights, the stored experts.
void require_same(const golden::GoldenReader& a, const golden::GoldenReader& b) {
  REQUIRE(a.tp() == b.tp());
  const LayerWeights wa = a.weights(), wb = b.weights();
  for (int r = 0; r < a.tp(); ++r) {
    CAPTURE(r);
    CHECK(a.rank_result(r).ar_out == b.rank_result(r).ar_out);
    CHECK(a.rank_result(r).moe.mid == b.rank_result(r).moe.mid);
    CHECK(wa.ranks[size_t(r)].w_o == wb.ranks[size_t(r)].w_o);
    CHECK(wa.ranks[size_t(r)].s_o == wb.ranks[size_t(r)].s_o);
    const golden::MoeStage ma = a.moe(r), mb = b.moe(r);
    REQUIRE(ma.expert_ids == mb.expert_ids);
    for (int32_t e : ma.expert_ids) {
      const auto p = ma.experts->expert(r, e), q = mb.experts->expert(r, e);
      CHECK(p->w13 == q->w13);
      CHECK(p->s13 == q->s13);
      CHECK(p->w2 == q->w2);
      CHECK(p->s2 == q->s2);
    }
    if (a.config().variant.shared_fp8) {  // V6.1: the MXFP8 shared expert, sh_w13 .. sh_s2
      const int sh = a.config().shared_expert();
      const auto p = ma.experts->expert(r, sh), q = mb.experts->expert(r, sh);
      CHECK(p->w13 == q->w13);
      CHECK(p->s13 == q->s13);
      CHECK(p->w2 == q->w2);
      CHECK(p->s2 == q->s2);
    }
  }
}

// Flips one bit of row `row` of dataset `ds` of an HDF5 file in place.
void flip(const std::string& file, const std::string& ds, uint64_t row) {
  h5::File f(file, h5::File::Mode::ReadWrite);
  const h5::Dataset d = f.root().open_dataset(ds);
  const std::vector<uint64_t> sh = d.shape();
  std::vector<uint8_t> v(size_t(sh[1] * sh[2]));
  d.read_rows(row, 1, v.data(), h5::Elem::U8);
  v[7] ^= 1;
  d.write_rows(row, 1, v.data(), h5::Elem::U8);
  f.close();
}

}  // namespace

TEST_SUITE("golden") {

TEST_CASE("--weights-file: written once, reused; the goldens refer to it and read as the self-contained ones") {
  REQUIRE_K4();
  TempDir t("wfile");
  const std::string wf = t.path("w.h5");
  // self-contained goldens of two seeds, and the same two through one weights file
  for (int s : {1, 2}) REQUIRE(cli::run(t, golden_cmd(t.path("self" + std::to_string(s) + ".h5"), s)).rc == 0);
  const Run w1 = cli::run(t, golden_cmd(t.path("a1.h5"), 1, "--weights-file " + wf));
  CAPTURE(w1.err);
  REQUIRE(w1.rc == 0);
  CHECK(w1.out.find("weights in " + wf + " (written, hash ") != std::string::npos);
  const auto wf_time = fs::last_write_time(wf);
  const Run w2 = cli::run(t, golden_cmd(t.path("a2.h5"), 2, "--weights-file " + wf));
  CAPTURE(w2.err);
  REQUIRE(w2.rc == 0);
  CHECK(w2.out.find("(reused, hash ") != std::string::npos);
  CHECK(fs::last_write_time(wf) == wf_time);  // not rewritten
  for (int s : {1, 2}) {
    CAPTURE(s);
    const std::string self = t.path("self" + std::to_string(s) + ".h5"), ref = t.path("a" + std::to_string(s) + ".h5");
    // the weights are not in the golden: it is much smaller
    CHECK(fs::file_size(ref) * 3 < fs::file_size(self));
    golden::GoldenReader a(self), b(ref);
    CHECK(b.root_attr("weights_file").find("\"path\":\"w.h5\"") != std::string::npos);
    require_same(a, b);
    // the other readers: replay and diff resolve it as well
    const Run rep = cli::run(t, "replay " + ref + " " + ref);
    CAPTURE(rep.out);
    CHECK(rep.rc == 0);
    CHECK(cli::run(t, "diff " + self + " " + ref).rc == 0);
    const Run ins = cli::run(t, "inspect " + ref);
    CHECK(ins.rc == 0);
    CHECK(ins.out.find("virtual") != std::string::npos);
  }
  // the weights file holds every expert of every rank, once
  const golden::WeightsFile w(wf);
  CHECK(w.source().weights == "synthetic");
  w.verify();
  // a golden moved together with its weights file still reads (the reference is relative)
  fs::create_directory(t.path("moved"));
  fs::copy(t.path("a1.h5"), t.path("moved/a1.h5"));
  fs::copy(wf, t.path("moved/w.h5"));
  golden::GoldenReader m(t.path("moved/a1.h5"));
  require_same(golden::GoldenReader(t.path("self1.h5")), m);
}

TEST_CASE("--weights-file from a checkpoint in the MXFP8 layout with MXFP8 experts: the same golden as without") {
  REQUIRE_K4();
  TempDir t("wfile_ck");
  REQUIRE(cli::run(t, "synth --layout mxfp8 --out " + t.path("m8")).rc == 0);
  const std::string base = "golden --tokens 3 --context 900 --checkpoint " + t.path("m8") + " --variant moe.experts=mxfp8";
  REQUIRE(cli::run(t, base + " --out " + t.path("self.h5")).rc == 0);
  const Run r = cli::run(t, base + " --weights-file " + t.path("w.h5") + " --out " + t.path("a.h5"));
  CAPTURE(r.err);
  REQUIRE(r.rc == 0);
  // reused: the checkpoint is not read again, and a different scenario comes out right too
  const Run r2 = cli::run(t, base + " --seed 4 --weights-file " + t.path("w.h5") + " --out " + t.path("b.h5"));
  CAPTURE(r2.err);
  REQUIRE(r2.rc == 0);
  REQUIRE(cli::run(t, base + " --seed 4 --out " + t.path("self4.h5")).rc == 0);
  require_same(golden::GoldenReader(t.path("self.h5")), golden::GoldenReader(t.path("a.h5")));
  require_same(golden::GoldenReader(t.path("self4.h5")), golden::GoldenReader(t.path("b.h5")));
  CHECK(golden::GoldenReader(t.path("a.h5")).root_attr("weight_prep").find("mxfp8-stored") != std::string::npos);
  CHECK(cli::run(t, "replay " + t.path("b.h5") + " " + t.path("b.h5")).rc == 0);
}

TEST_CASE("--weights-file under moe.shared_fp8: the MXFP8 shared expert's tables in the file, the same goldens") {
  REQUIRE_K4();
  TempDir t("wfile_sh8");
  const std::string wf = t.path("w.h5"), v = "--variant moe.shared_fp8=on ";
  for (int s : {1, 2}) {
    CAPTURE(s);
    const std::string self = t.path("self" + std::to_string(s) + ".h5"), ref = t.path("a" + std::to_string(s) + ".h5");
    REQUIRE(cli::run(t, golden_cmd(self, s, v)).rc == 0);
    const Run w = cli::run(t, golden_cmd(ref, s, v + "--weights-file " + wf));
    CAPTURE(w.err);
    REQUIRE(w.rc == 0);
    CHECK(w.out.find(s == 1 ? "(written, hash " : "(reused, hash ") != std::string::npos);
    golden::GoldenReader a(self), b(ref);
    require_same(a, b);
    {
      h5::File f(ref, h5::File::Mode::ReadOnly);
      CHECK(f.root().open_dataset("/rank1/moe/inputs/sh_w13").is_virtual());
      CHECK(f.root().open_dataset("/rank1/moe/inputs/w13").is_virtual());
    }
    CHECK(cli::run(t, "diff " + self + " " + ref).rc == 0);
    CHECK(cli::run(t, "replay " + ref + " " + ref).rc == 0);
  }
  {  // the file: n_routed MXFP4 rows, the shared expert apart; its shape names the variant
    const golden::WeightsFile w(wf);
    w.verify();
    CHECK(golden::weights_shape(w.config()).find("shared mxfp8") != std::string::npos);
    h5::File f(wf, h5::File::Mode::ReadOnly);
    CHECK(f.root().open_dataset("/rank0/w13").shape()[0] == uint64_t(w.config().n_routed));
    CHECK(f.root().open_dataset("/rank0/sh_w2").shape()[0] == 1);
  }
  // the seed build's file is not this one's: refused, naming the shape
  expect_bad(cli::run(t, golden_cmd(t.path("n.h5"), 3, "--weights-file " + wf)), {"holds other weights", "shared mxfp8"});
  CHECK(!fs::exists(t.path("n.h5")));
  // a bit of the shared expert changed in the file: the goldens over it are refused, naming the table
  flip(wf, "/rank0/sh_w2", 0);
  expect_bad(cli::run(t, "inspect " + t.path("a1.h5")), {"golden " + t.path("a1.h5"), "/rank0/moe/inputs/sh_w2 reads bytes from weights file " + wf});
}

// One HDF5 lock (golden/io/hdf5.hpp): while another thread holds it, neither a golden's stored
// experts nor a weights file's are read (libhdf5 is not thread-safe: two calls at once were
// possible while the reader and the weights file had a mutex each).
TEST_CASE("one HDF5 mutex: a GoldenReader's and a WeightsFile's expert reads wait for it") {
  REQUIRE_K4();
  TempDir t("wfile_mutex");
  const std::string wf = t.path("w.h5"), g = t.path("g.h5");
  REQUIRE(cli::run(t, golden_cmd(g, 1, "--weights-file " + wf)).rc == 0);
  const golden::GoldenReader gr(g);
  const golden::MoeStage ms = gr.moe(0);
  const golden::WeightsFile w(wf);
  const LayerWeights lw = w.weights(gr.config());
  const int e = ms.expert_ids[0];
  std::future<std::shared_ptr<const ExpertWeights>> from_golden, from_file;
  {
    std::lock_guard<std::recursive_mutex> held(h5::serial_mutex());
    from_golden = std::async(std::launch::async, [&] { return ms.experts->expert(0, e); });
    from_file = std::async(std::launch::async, [&] { return lw.experts->expert(0, e); });
    CHECK(from_golden.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
    CHECK(from_file.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  }
  CHECK(from_golden.get()->w13 == from_file.get()->w13);
}

}  // TEST_SUITE golden

TEST_SUITE("bad_input") {

TEST_CASE("--weights-file: a golden moved without it, a replaced or changed weights file, other weights (exit 2)") {
  REQUIRE_K4();
  TempDir t("wfile_bad");
  const std::string wf = t.path("w.h5"), g = t.path("a.h5");
  REQUIRE(cli::run(t, golden_cmd(g, 1, "--weights-file " + wf)).rc == 0);
  const std::string ids_path = "/rank1/moe/inputs/expert_ids";
  std::vector<int32_t> ids;
  {
    golden::GoldenReader r(g);
    ids = r.moe(1).expert_ids;
  }
  REQUIRE(!ids.empty());
  SUBCASE("moved without its weights file") {
    fs::create_directory(t.path("sub"));
    fs::copy(g, t.path("sub/a.h5"));
    for (const char* cmd : {"replay", "diff", "inspect"}) {
      CAPTURE(cmd);
      const std::string args = std::string(cmd) + " " + t.path("sub/a.h5") + (std::string(cmd) == "inspect" ? "" : " " + t.path("sub/a.h5"));
      expect_bad(cli::run(t, args), {"golden " + t.path("sub/a.h5") + ": its weights are in the weights file 'w.h5'",
                                     "which is not at " + t.path("sub/w.h5"), "moved without its weights file"});
    }
    CHECK_THROWS_AS(golden::GoldenReader(t.path("sub/a.h5")), golden::FormatError);
  }
  SUBCASE("the weights file replaced by another one") {
    REQUIRE(cli::run(t, golden_cmd(t.path("o.h5"), 1, "--weight-seed 9 --weights-file " + t.path("w9.h5"))).rc == 0);
    fs::copy(t.path("w9.h5"), wf, fs::copy_options::overwrite_existing);
    expect_bad(cli::run(t, "replay " + g + " " + g),
               {"its weights file " + wf + " has content hash ", "but the golden was written against ", "replaced or rewritten"});
  }
  SUBCASE("the weights file changed in place (one bit of an expert the golden uses)") {
    flip(wf, "/rank1/w13", uint64_t(ids[0]));
    expect_bad(cli::run(t, "replay " + g + " " + g),
               {"dataset /rank1/moe/inputs/w13 reads bytes from weights file " + wf + " that hash to ",
                "the weights file changed after the golden was written"});
    // and reusing it for a new golden is refused, leaving nothing
    expect_bad(cli::run(t, golden_cmd(t.path("n.h5"), 2, "--weights-file " + wf)),
               {"weights file " + wf + ": its contents hash to ", "but its attribute hash says "});
    CHECK(!fs::exists(t.path("n.h5")));
  }
  SUBCASE("a bit of an expert no golden uses: the golden still reads; a new golden is refused") {
    int unused = -1;
    for (int e = 0; e <= 32 && unused < 0; ++e)
      if (!std::binary_search(ids.begin(), ids.end(), e)) unused = e;
    REQUIRE(unused >= 0);
    flip(wf, "/rank1/w13", uint64_t(unused));
    CHECK(cli::run(t, "replay " + g + " " + g).rc == 0);
    expect_bad(cli::run(t, golden_cmd(t.path("n.h5"), 2, "--weights-file " + wf)), {"its contents hash to "});
    CHECK(!fs::exists(t.path("n.h5")));
  }
  SUBCASE("reused for other weights") {
    expect_bad(cli::run(t, golden_cmd(t.path("n.h5"), 2, "--weight-seed 3 --weights-file " + wf)),
               {"weights file " + wf + " holds other weights than this golden's: weight_seed '1' (this golden's: '3')"});
    expect_bad(cli::run(t, "golden --preset small --tokens 2 --context 500 --out " + t.path("n.h5") + " --weights-file " + wf),
               {"holds other weights than this golden's: shape 'hidden 2048, "});
    CHECK(!fs::exists(t.path("n.h5")));
  }
  SUBCASE("not a weights file") {
    expect_bad(cli::run(t, golden_cmd(t.path("n.h5"), 2, "--weights-file " + g)),
               {"weights file " + g + ": not a K4 weights file (no magic 'K4WEIGHTS' at /)"});
    CHECK(!fs::exists(t.path("n.h5")));
  }
  SUBCASE("weight injections") {
    expect_bad(cli::run(t, golden_cmd(t.path("n.h5"), 2, "--special-weights --weights-file " + wf)),
               {"--weights-file: the scenario's weight injections"});
    CHECK(!fs::exists(t.path("n.h5")));
  }
  SUBCASE("the F32 router gate") {
    expect_bad(cli::run(t, golden_cmd(t.path("n.h5"), 2, "--variant router.gate=f32 --weights-file " + wf)),
               {"--weights-file with router.gate = f32: a weights file holds the bf16 router gate"});
    CHECK(!fs::exists(t.path("n.h5")));
  }
}

}  // TEST_SUITE bad_input
