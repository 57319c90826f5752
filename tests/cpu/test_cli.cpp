// test_cli.cpp -- the k4 command end to end: --help everywhere, exit codes (0 ok, 2 bad
// input / usage), golden + inspect, byte-identical files for any --threads, and a synthetic
// checkpoint file giving the same golden tensors as the embedded synthetic default.
// The binary is found as tests/cpu/cli_run.hpp says (beside the tests, or $K4_BIN).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "golden/format/schema.hpp"
#include "golden/io/hdf5.hpp"
#include "tests/cpu/cli_run.hpp"

namespace fs = std::filesystem;
using k4::cli::Run;
using k4::cli::slurp;
using k4::cli::TempDir;
using k4::cli::run;

TEST_SUITE("cli") {

TEST_CASE("k4 --help on every subcommand; usage errors exit 2 with one message") {
  REQUIRE_K4();
  TempDir t;
  for (const char* sub : {"", "synth", "golden", "inspect"}) {
    CAPTURE(sub);
    const Run r = run(t, std::string(sub) + " --help");
    CHECK(r.rc == 0);
    CHECK(r.out.find("Usage") != std::string::npos);
  }
  Run r = run(t, "golden --preset tiny");  // no --out
  CHECK(r.rc == 2);
  CHECK(r.err.find("--out") != std::string::npos);
  r = run(t, "frobnicate");
  CHECK(r.rc == 2);
  r = run(t, "golden --preset huge --tokens 1 --out " + t.path("x.h5"));
  CHECK(r.rc == 2);
  CHECK(r.err.find("unknown preset 'huge'") != std::string::npos);
  r = run(t, "golden --preset tiny --tokens 17 --out " + t.path("x.h5"));
  CHECK(r.rc == 2);
  CHECK(r.err.find("tokens 17 is outside 1..16") != std::string::npos);
  CHECK(!fs::exists(t.path("x.h5")));
}

TEST_CASE("k4 golden + inspect on tiny; refusing to overwrite; inspect of a non-golden") {
  REQUIRE_K4();
  TempDir t;
  const std::string g = t.path("x.h5");
  Run r = run(t, "golden --preset tiny --tokens 4 --context 1000 --out " + g);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("wrote " + g) != std::string::npos);
  r = run(t, "golden --preset tiny --tokens 4 --context 1000 --out " + g);
  CHECK(r.rc == 2);
  CHECK(r.err.find("exists; pass --force") != std::string::npos);
  r = run(t, "inspect " + g);
  CHECK(r.rc == 0);
  CHECK(r.out.find("/rank3/moe/outputs/ar_out") != std::string::npos);
  CHECK(r.out.find("@magic = K4GOLDEN") != std::string::npos);
  CHECK(r.out.find("nan 0") != std::string::npos);
  std::ofstream(t.path("junk.h5")) << "junk";
  r = run(t, "inspect " + t.path("junk.h5"));
  CHECK(r.rc == 2);
  CHECK(r.err.find("cannot be opened as HDF5") != std::string::npos);
}

TEST_CASE("k4 inspect --json: every dataset with its dtype and shape; bad input gives the text form's error") {
  REQUIRE_K4();
  TempDir t;
  const std::string g = t.path("x.h5");
  REQUIRE(run(t, "golden --preset tiny --tp 2 --tokens 2 --context 1000 --special-q --out " + g).rc == 0);
  Run r = run(t, "inspect --json " + g);
  REQUIRE(r.rc == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["file"] == g);
  CHECK(j["attributes"]["magic"] == "K4GOLDEN");
  CHECK(j["variant"] == "seed");
  // every dataset the reader knows, with the schema's dtype and the file's shape
  const k4::golden::GoldenReader valid(g);
  std::map<std::string, nlohmann::json> ds;
  for (const auto& d : j["datasets"]) ds[d["path"].get<std::string>()] = d;
  size_t seen = 0;
  k4::h5::File f(g, k4::h5::File::Mode::ReadOnly);
  for (const auto& [path, d] : ds) {
    const k4::h5::Dataset x = f.root().open_dataset(path);
    CHECK(d["dtype"] == x.attr_string("dtype"));
    CHECK(d["shape"].get<std::vector<uint64_t>>() == x.shape());
    CHECK(d["stats"]["count"].get<uint64_t>() >= 1);
    ++seen;
  }
  CHECK(seen > 50);
  CHECK(ds.count("/rank1/moe/outputs/ar_out") == 1);
  CHECK(ds.at("/rank0/split/inputs/q")["stats"]["nan"].get<uint64_t>() >= 1);  // --special-q: token 0 NaN (head 0)
  for (const char* bad : {"missing.h5", "junk.h5", "dir"}) {
    const std::string p = t.path(bad);
    if (std::string(bad) == "junk.h5") std::ofstream(p) << "junk";
    if (std::string(bad) == "dir") fs::create_directory(p);
    const Run a = run(t, "inspect --json " + p), b = run(t, "inspect " + p);
    CHECK(a.rc == 2);
    CHECK(a.out.empty());
    CHECK(a.err == b.err);
    CHECK(a.err.find(p) != std::string::npos);
  }
}

TEST_CASE("k4 golden: byte-identical for --threads 1 and 2; scenario options and a scenario file") {
  REQUIRE_K4();
  TempDir t;
  {
    std::ofstream f(t.path("s.json"));
    f << R"({"tokens": 6, "q_len": 2, "context": ["short", "medium", 5000], "pad_rows": [0],
             "inject": {"score_ties": true, "nan_scores": 1, "repeated_expert": 3}})";
  }
  const std::string common = "golden --preset tiny --tp 2 --scenario " + t.path("s.json") + " --neg-zero-scores 2 --seed 9";
  REQUIRE(run(t, common + " --threads 1 --out " + t.path("a.h5")).rc == 0);
  REQUIRE(run(t, common + " --threads 2 --out " + t.path("b.h5")).rc == 0);
  const std::string a = slurp(t.path("a.h5")), b = slurp(t.path("b.h5"));
  CHECK(a.size() > 10000);
  CHECK(a == b);
  k4::golden::GoldenReader g(t.path("a.h5"));
  CHECK(g.tokens() == 6);
  CHECK(g.tp() == 2);
  CHECK(g.root_attr("scenario").find("\"neg_zero_scores\":2") != std::string::npos);
}

TEST_CASE("k4 synth file as --checkpoint gives the same golden tensors as the embedded default") {
  REQUIRE_K4();
  TempDir t;
  REQUIRE(run(t, "synth --preset tiny --tp 2 --seed 5 --out " + t.path("w.safetensors")).rc == 0);
  CHECK(run(t, "synth --preset tiny --tp 2 --seed 5 --out " + t.path("w.safetensors")).rc == 2);  // exists
  REQUIRE(run(t, "golden --preset tiny --tp 2 --tokens 3 --context 2500 --weight-seed 5 --out " + t.path("a.h5")).rc == 0);
  REQUIRE(run(t, "golden --preset tiny --tp 2 --tokens 3 --context 2500 --checkpoint " + t.path("w.safetensors") +
                     " --out " + t.path("b.h5"))
              .rc == 0);
  k4::golden::GoldenReader a(t.path("a.h5")), b(t.path("b.h5"));
  for (int r = 0; r < 2; ++r) {
    const k4::RankResult x = a.rank_result(r), y = b.rank_result(r);
    CHECK(x.ar_out == y.ar_out);
    CHECK(x.moe.mid == y.moe.mid);
    CHECK(x.a == y.a);
  }
  CHECK(b.root_attr("weights").find("checkpoint") == 0);
}

}  // TEST_SUITE cli
