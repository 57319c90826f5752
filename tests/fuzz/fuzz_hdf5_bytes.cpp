// fuzz_hdf5_bytes.cpp -- libFuzzer target, byte level: the golden / dump readers on raw
// bytes (seeds: small valid dumps), so libhdf5's own file parser sees corrupt files.
//
// Feeds: the input as a whole .h5 file (one tmpfs file, rewritten for every input), opened
// with DumpReader (every schema dataset read at the shape of a pristine tiny golden's) and
// GoldenReader (every stage of every rank when it opens), and diff_files of the pristine
// golden against it.
// Not findings: FormatError / std::invalid_argument, std::runtime_error (h5::Error).
// Findings: as fuzz_golden_reader. libhdf5 (Debian's 1.10.8) crashes on some corrupt files;
// the k4 tools run every command under golden/io/crash_guard.hpp, which turns such a crash into
// "the file is corrupt", exit 2. So a crash with libhdf5 on its stack is not a finding here:
// the guard's in-process classifier saves the input into $K4_FUZZ_HANDLED_DIR (if set) and
// ends the process with 0 (run in fork mode: libFuzzer starts the next job), and
// scripts/fuzz.sh checks every saved input with the production `k4 diff` (exit 2, the
// message, no signal). ASan's reports from inside libhdf5's calls are suppressed
// (tests/fuzz/libhdf5/asan.supp: libhdf5 is not instrumented, its memcpy calls are) and so are
// its leaks (lsan.supp); any crash elsewhere is a finding as always.
// K4_FUZZ_MAKE_SEEDS=DIR writes its seed dumps into DIR and exits.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "golden/io/crash_guard.hpp"
#include "tests/fuzz/golden_edits.hpp"

using namespace k4;

namespace {

struct State {
  fuzz::ScratchDir dir{"hdf5bytes"};
  fuzz::World world;
  State() { world = fuzz::make_world(dir.path("")); }
};

State& state() {
  static State s;
  return s;
}

const uint8_t* g_data = nullptr;  // the input being run, for the crash handler
size_t g_size = 0;
char g_handled_dir[1024] = "";

// In the signal handler (async-signal-safe only): DIR/libhdf5-<FNV-1a of the input>.
void save_handled(int) {
  if (!g_handled_dir[0] || !g_data) return;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < g_size; ++i) h = (h ^ g_data[i]) * 1099511628211ull;
  char path[1100];
  size_t n = 0;
  for (const char* p = g_handled_dir; *p && n < 1024; ++p) path[n++] = *p;
  for (const char* p = "/libhdf5-"; *p; ++p) path[n++] = *p;
  for (int k = 60; k >= 0; k -= 4) path[n++] = "0123456789abcdef"[(h >> k) & 15];
  path[n] = 0;
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  for (size_t off = 0; off < g_size;) {
    const ssize_t w = write(fd, g_data + off, g_size - off);
    if (w <= 0) break;
    off += size_t(w);
  }
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  State& st = state();
  if (const char* d = std::getenv("K4_FUZZ_HANDLED_DIR"); d && *d && std::strlen(d) < sizeof g_handled_dir)
    std::strcpy(g_handled_dir, d);
  if (const char* dir = std::getenv("K4_FUZZ_MAKE_SEEDS"); dir && *dir) {
    // Small dumps of the TP 1 base (tests/fuzz/corpus/make_seeds.py): the byte-level seeds.
    const golden::GoldenReader gr(st.world.bases[0].pristine_golden);
    const StepResult res = gr.result();
    auto dump = [&](const char* name, std::vector<std::string> stages, std::vector<std::string> omit) {
      golden::DumpSelection sel;
      sel.stages = std::move(stages);
      sel.omit = std::move(omit);
      golden::write_dump(std::string(dir) + "/" + name, gr.config(), gr.tokens(), res, sel, true);
    };
    dump("dump_index.h5", {"index"}, {});
    dump("dump_index_ncx.h5", {"index"}, {"index/outputs/sparse_table", "index/outputs/blocks"});
    dump("dump_merge.h5", {"merge"}, {"merge/outputs/attn"});
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  State& st = state();
  const fuzz::Base& g = st.world.bases[0];  // tiny TP 1 golden: its shapes and its diff
  const std::string path = st.dir.path("input.h5");
  fuzz::write_file(path, data, size);
  g_data = data;
  g_size = size;
  // after libFuzzer's own handlers (installed past LLVMFuzzerInitialize): ours go first and
  // pass every crash outside libhdf5 on to them, so that libFuzzer still saves its input
  static const bool installed = (guard::install_in_process(save_handled), true);
  (void)installed;
  // The check that the classification lets our own crashes through as findings:
  // K4_FUZZ_PLANT_CRASH=1 crashes here, in k4's code, on every input (scripts/fuzz.sh plant).
  static const bool plant = std::getenv("K4_FUZZ_PLANT_CRASH") != nullptr;
  if (plant) *static_cast<volatile int*>(nullptr) = int(size);
  const unsigned ok = fuzz::kInvalidArgument | fuzz::kRuntimeError;
  fuzz::expect_clean("DumpReader", ok, [&] { fuzz::read_dump(path, g.shapes, g.tp); });
  fuzz::expect_clean("GoldenReader", ok, [&] { fuzz::read_golden(path); });
  fuzz::expect_clean("diff_files", ok, [&] { fuzz::diff_and_report(g.pristine_golden, path, false); });
  return 0;
}
