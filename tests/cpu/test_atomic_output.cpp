// test_atomic_output.cpp -- nothing lost: every writer (k4 synth, k4 golden, k4 diff --json /
// --html, golden::write_inputs_file, golden::write_dump) writes a temporary and renames it.
//  (a) an existing output is refused without --force (exit 2, one message), byte for byte
//      unchanged;
//  (b) a run that fails after the output was opened (K4_FAIL_AFTER_BYTES, golden/io/atomic_file.hpp,
//      or a bad input found late) leaves neither the output nor a temporary, and an existing
//      output it was to replace (--force) unchanged;
//  (c) a run killed with SIGKILL mid-write leaves no file at the output path; its
//      ".NAME.tmp-PID" is removed by the next run that writes NAME (a live process's is kept).
#include <doctest/doctest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "golden/io/atomic_file.hpp"
#include "golden/diff/compare.hpp"
#include "golden/format/schema.hpp"
#include "tests/cpu/cli_run.hpp"

extern char** environ;

namespace fs = std::filesystem;
using namespace k4;
using k4::cli::Run;
using k4::cli::slurp;
using k4::cli::TempDir;

namespace {

// The names in the directory that are temporaries of `name` (".NAME.tmp-PID").
std::vector<std::string> temporaries(const TempDir& t, const std::string& name) {
  std::vector<std::string> out;
  for (const std::string& e : t.entries())
    if (e.rfind("." + name + ".tmp-", 0) == 0) out.push_back(e);
  return out;
}

void write_text(const std::string& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

// Waits until `path` exists (or `limit` passes); true if it appeared.
bool wait_for(const std::function<bool()>& cond, double limit_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!cond()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void kill_and_reap(const TempDir& t, pid_t pid) {
  ::kill(pid, SIGKILL);
  const Run r = cli::wait(t, pid);
  CHECK(r.signal == SIGKILL);
}

// A small golden and a dump of it, for the diff report cases.
struct DiffFiles {
  TempDir t{"atomic_diff"};
  std::string golden, dump, bad;
  bool ok = false;
  DiffFiles() {
    golden = t.path("g.h5");
    dump = t.path("d.h5");
    bad = t.path("bad.h5");
    if (cli::run(t, "golden --preset tiny --tp 2 --tokens 2 --context 300 --out " + golden).rc != 0) return;
    golden::GoldenReader g(golden);
    golden::write_dump(dump, g.config(), g.tokens(), g.result(), {}, false);
    write_text(bad, "not a dump");
    ok = true;
  }
};
const DiffFiles& diff_files() {
  static DiffFiles D;
  return D;
}

const std::string kPrecious = "precious bytes that must survive\n";

}  // namespace

TEST_SUITE("atomic_output") {

// ============================================================== (a) no overwrite without --force

TEST_CASE("atomic (a): k4 golden and k4 synth refuse an existing output, before any work, file unchanged") {
  REQUIRE_K4();
  TempDir t("atomic");
  const std::string g = t.path("g.h5"), w = t.path("w.safetensors");
  write_text(g, kPrecious);
  write_text(w, kPrecious);
  Run r = cli::run(t, "golden --preset minimax-m3-tp4 --tokens 16 --context 65536 --out " + g);  // refused at once
  CHECK(r.rc == 2);
  CHECK(r.err == "k4 golden: error: output " + g + " exists; pass --force to overwrite it\n");
  CHECK(slurp(g) == kPrecious);
  r = cli::run(t, "synth --preset minimax-m3-tp4 --out " + w);
  CHECK(r.rc == 2);
  CHECK(r.err == "k4 synth: error: output " + w + " exists; pass --force to overwrite it\n");
  CHECK(slurp(w) == kPrecious);
  // a real previous output too, and --force replaces it
  REQUIRE(cli::run(t, "golden --preset tiny --tokens 1 --out " + g + " --force").rc == 0);
  const std::string before = slurp(g);
  r = cli::run(t, "golden --preset tiny --tokens 1 --seed 2 --out " + g);
  CHECK(r.rc == 2);
  CHECK(slurp(g) == before);
  CHECK(cli::run(t, "golden --preset tiny --tokens 1 --seed 2 --out " + g + " --force").rc == 0);
  CHECK(slurp(g) != before);
  CHECK(t.entries() == std::vector<std::string>{"g.h5", "w.safetensors"});
}

TEST_CASE("atomic (a): k4 diff --json / --html refuse an existing file without --force, unchanged") {
  REQUIRE_K4();
  const DiffFiles& D = diff_files();
  REQUIRE(D.ok);
  TempDir t("atomic");
  const std::string js = t.path("r.json"), html = t.path("r.html");
  write_text(js, kPrecious);
  write_text(html, kPrecious);
  Run r = cli::run(t, "diff " + D.golden + " " + D.dump + " --json " + js);
  CHECK(r.rc == 2);
  CHECK(r.err == "k4 diff: error: output " + js + " exists; pass --force to overwrite it\n");
  r = cli::run(t, "replay " + D.golden + " " + D.dump + " --html " + html);
  CHECK(r.rc == 2);
  CHECK(r.err == "k4 replay: error: output " + html + " exists; pass --force to overwrite it\n");
  CHECK(slurp(js) == kPrecious);
  CHECK(slurp(html) == kPrecious);
  r = cli::run(t, "diff " + D.golden + " " + D.dump + " --json " + js + " --html " + html + " --force");
  CHECK(r.rc == 0);
  CHECK(slurp(js).find("\"first_divergence\"") != std::string::npos);
  CHECK(slurp(html).rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(t.entries() == std::vector<std::string>{"r.html", "r.json"});
}

TEST_CASE("atomic (a): write_inputs_file and write_dump refuse an existing file, unchanged") {
  REQUIRE_K4();
  const DiffFiles& D = diff_files();
  REQUIRE(D.ok);
  TempDir t("atomic");
  const std::string i = t.path("i.h5"), d = t.path("d.h5");
  write_text(i, kPrecious);
  write_text(d, kPrecious);
  golden::GoldenReader g(D.golden);
  CHECK_THROWS_WITH_AS(golden::write_inputs_file(i, g.config(), g.inputs(), false),
                       ("output " + i + " exists; pass --force to overwrite it").c_str(), std::invalid_argument);
  CHECK_THROWS_WITH_AS(golden::write_dump(d, g.config(), g.tokens(), g.result(), {}, false),
                       ("output " + d + " exists; pass --force to overwrite it").c_str(), std::invalid_argument);
  CHECK(slurp(i) == kPrecious);
  CHECK(slurp(d) == kPrecious);
  CHECK(t.entries() == std::vector<std::string>{"d.h5", "i.h5"});
}

// ============================================================== (b) a failing run leaves nothing

TEST_CASE("atomic (b): k4 golden failing mid-write (injected) leaves neither output nor temporary") {
  REQUIRE_K4();
  TempDir t("atomic");
  const std::string g = t.path("g.h5");
  Run r = cli::run(t, "golden --preset tiny --tokens 4 --context 1000 --out " + g, "K4_FAIL_AFTER_BYTES=3000000 ");
  CHECK(r.rc == 1);
  CHECK(r.err.find("k4 golden: failed: injected write failure after") != std::string::npos);
  CHECK(t.entries().empty());
  // replacing an existing golden (--force): the old one survives the failure byte for byte
  REQUIRE(cli::run(t, "golden --preset tiny --tokens 1 --out " + g).rc == 0);
  const std::string before = slurp(g);
  r = cli::run(t, "golden --preset tiny --tokens 4 --context 1000 --force --out " + g, "K4_FAIL_AFTER_BYTES=3000000 ");
  CHECK(r.rc == 1);
  CHECK(slurp(g) == before);
  CHECK(t.entries() == std::vector<std::string>{"g.h5"});
}

TEST_CASE("atomic (b): k4 synth failing mid-write (injected) leaves neither output nor temporary") {
  REQUIRE_K4();
  TempDir t("atomic");
  const std::string w = t.path("w.safetensors");
  const Run r = cli::run(t, "synth --preset tiny --out " + w, "K4_FAIL_AFTER_BYTES=1000000 ");
  CHECK(r.rc == 1);
  CHECK(r.err.find("k4 synth: failed: injected write failure after") != std::string::npos);
  CHECK(t.entries().empty());
}

TEST_CASE("atomic (b): k4 golden with a bad checkpoint or bad inputs leaves nothing at --out") {
  REQUIRE_K4();
  TempDir t("atomic");
  const std::string g = t.path("g.h5"), k = t.path("w.safetensors");
  write_text(k, "junk that is no safetensors file");
  CHECK(cli::run(t, "golden --preset tiny --checkpoint " + k + " --out " + g).rc == 2);
  CHECK(cli::run(t, "golden --preset tiny --tokens 17 --out " + g).rc == 2);
  CHECK(t.entries() == std::vector<std::string>{"w.safetensors"});
}

TEST_CASE("atomic (b): k4 diff with --json / --html: a bad dump, or a failure writing a report, leaves no file") {
  REQUIRE_K4();
  const DiffFiles& D = diff_files();
  REQUIRE(D.ok);
  TempDir t("atomic");
  const std::string js = t.path("r.json"), html = t.path("r.html");
  Run r = cli::run(t, "diff " + D.golden + " " + D.bad + " --json " + js + " --html " + html);
  CHECK(r.rc == 2);
  CHECK(t.entries().empty());
  r = cli::run(t, "replay " + D.golden + " " + D.dump + " --json " + js + " --html " + html, "K4_FAIL_AFTER_BYTES=1 ");
  CHECK(r.rc == 1);
  CHECK(r.err.find("injected write failure") != std::string::npos);
  CHECK(t.entries().empty());
}

TEST_CASE("atomic (b): write_inputs_file and write_dump failing mid-file leave neither file nor temporary") {
  REQUIRE_K4();
  const DiffFiles& D = diff_files();
  REQUIRE(D.ok);
  TempDir t("atomic");
  golden::GoldenReader g(D.golden);
  const Config cfg = g.config();
  const StepInputs in = g.inputs();
  const StepResult res = g.result();
  // injected, mid-file
  ::setenv("K4_FAIL_AFTER_BYTES", "100000", 1);
  CHECK_THROWS_WITH_AS(golden::write_inputs_file(t.path("i.h5"), cfg, in, false), doctest::Contains("injected write failure"),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(golden::write_dump(t.path("d.h5"), cfg, g.tokens(), res, {}, false),
                       doctest::Contains("injected write failure"), std::runtime_error);
  ::unsetenv("K4_FAIL_AFTER_BYTES");
  CHECK(t.entries().empty());
  // a bad input found after the file was opened
  StepInputs short_in = in;
  short_in.ranks.pop_back();
  CHECK_THROWS_AS(golden::write_inputs_file(t.path("i.h5"), cfg, short_in, false), std::invalid_argument);
  StepResult short_res = res;
  short_res.ranks[1].moe.partial.pop_back();
  CHECK_THROWS_WITH_AS(golden::write_dump(t.path("d.h5"), cfg, g.tokens(), short_res, {}, false),
                       doctest::Contains("rank 1 moe/outputs/partial has"), std::invalid_argument);
  CHECK(t.entries().empty());
  // and without a failure they are written
  golden::write_inputs_file(t.path("i.h5"), cfg, in, false);
  golden::write_dump(t.path("d.h5"), cfg, g.tokens(), res, {}, false);
  CHECK(t.entries() == std::vector<std::string>{"d.h5", "i.h5"});
}

// ============================================================== (c) SIGKILL mid-write

TEST_CASE("atomic (c): k4 golden killed with SIGKILL mid-write: no file at --out; the next run removes the stale temporary") {
  REQUIRE_K4();
  TempDir t("atomic");
  const std::string g = t.path("g.h5");
  // small, S = 16: ~2 s of model, then ~0.5 s writing 400 MB; killed as soon as the temporary exists
  const pid_t pid = cli::spawn(t, {"golden", "--preset", "small", "--tokens", "16", "--context", "65536", "--kv-form",
                                   "whole", "--out", g});
  const bool seen = wait_for([&] { return !temporaries(t, "g.h5").empty(); }, 120);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill_and_reap(t, pid);
  REQUIRE(seen);
  // the command runs in k4's child (golden/io/crash_guard.hpp), which dies with k4: given the
  // second it would need to finish the file, it still writes nothing
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(!fs::exists(g));
  const std::vector<std::string> left = temporaries(t, "g.h5");
  REQUIRE(left.size() == 1);
  CHECK(left[0] == ".g.h5.tmp-" + std::to_string(pid));  // the documented residue: named like the output
  // a later run for the same output cleans it
  REQUIRE(cli::run(t, "golden --preset tiny --tokens 1 --out " + g).rc == 0);
  CHECK(t.entries() == std::vector<std::string>{"g.h5"});
  golden::GoldenReader check(g);
  CHECK(check.tokens() == 1);
}

TEST_CASE("atomic (c): k4 golden --preset minimax-m3-tp4 killed after ~1 s: no file at --out") {
  REQUIRE_K4();
  TempDir t("atomic");
  const std::string g = t.path("g.h5");
  const pid_t pid = cli::spawn(t, {"golden", "--preset", "minimax-m3-tp4", "--tokens", "16", "--context", "65536", "--out", g});
  std::this_thread::sleep_for(std::chrono::seconds(1));
  kill_and_reap(t, pid);
  CHECK(!fs::exists(g));
  for (const std::string& e : t.entries()) CHECK(e.rfind(".g.h5.tmp-", 0) == 0);  // at most its temporary
  CHECK(remove_stale_temporaries(g) == int(temporaries(t, "g.h5").size()));
  CHECK(t.entries().empty());
}

TEST_CASE("atomic (c): k4 synth --preset minimax-m3-tp4 killed mid-write: no file at --out; the next synth cleans up") {
  REQUIRE_K4();
  TempDir t("atomic");
  const std::string w = t.path("w.safetensors");
  const pid_t pid = cli::spawn(t, {"synth", "--preset", "minimax-m3-tp4", "--out", w});
  const bool seen = wait_for([&] { return !temporaries(t, "w.safetensors").empty(); }, 60);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // streaming 3.9 GB: well inside the write
  kill_and_reap(t, pid);
  REQUIRE(seen);
  CHECK(!fs::exists(w));
  const std::vector<std::string> left = temporaries(t, "w.safetensors");
  REQUIRE(left.size() == 1);
  CHECK(fs::file_size(t.path(left[0])) > 0);
  REQUIRE(cli::run(t, "synth --preset tiny --out " + w).rc == 0);
  CHECK(t.entries() == std::vector<std::string>{"w.safetensors"});
}

TEST_CASE("atomic (c): the temporary of a process still running is not removed") {
  REQUIRE_K4();
  TempDir t("atomic");
  const std::string g = t.path("g.h5");
  // a live process: a sleep started here; its pid names a temporary it "writes"
  pid_t sleeper = -1;
  char arg0[] = "sleep", arg1[] = "30";
  char* argv[] = {arg0, arg1, nullptr};
  REQUIRE(posix_spawnp(&sleeper, "sleep", nullptr, nullptr, argv, environ) == 0);
  const std::string live = ".g.h5.tmp-" + std::to_string(sleeper);
  write_text(t.path(live), "in progress");
  write_text(t.path(".g.h5.tmp-999999999"), "stale");  // no such process
  write_text(t.path(".g.h5.tmp-abc"), "not ours");     // not a pid: left alone
  REQUIRE(cli::run(t, "golden --preset tiny --tokens 1 --out " + g).rc == 0);
  std::vector<std::string> want = {".g.h5.tmp-abc", live, "g.h5"};
  std::sort(want.begin(), want.end());
  CHECK(t.entries() == want);
  ::kill(sleeper, SIGKILL);
  int st = 0;
  ::waitpid(sleeper, &st, 0);
  CHECK(remove_stale_temporaries(g) == 1);
  CHECK(t.entries() == std::vector<std::string>{".g.h5.tmp-abc", "g.h5"});
}

}  // TEST_SUITE atomic_output
