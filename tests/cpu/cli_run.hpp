// cli_run.hpp -- running the real `k4` binary from the CPU tests (test_cli, test_bad_input,
// test_atomic_output): where it is, a scratch directory, a run with its exit code and both
// streams, and a run in the background (for the SIGKILL cases).
// The binary is found beside the test binary (the build puts both in the build root), or in
// $K4_BIN; without it every case that runs it fails (REQUIRE_K4).
#pragma once
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace k4::cli {

// The k4 binary: $K4_BIN, else "k4" beside the running test binary; "" if neither.
std::string k4_bin();

// The repository root these tests were built from (for the tests that read its sources).
std::filesystem::path source_root();

// A fresh directory under the system temp dir, removed (with everything in it) at scope exit.
struct TempDir {
  std::filesystem::path dir;
  explicit TempDir(const std::string& tag = "cli");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path(const std::string& name) const { return (dir / name).string(); }
  // Names in the directory (sorted), without the runner's own stdout / stderr captures.
  std::vector<std::string> entries() const;
};

std::string slurp(const std::string& path);

struct Run {
  int rc;           // the exit status; -1 if k4 did not exit (a signal: an abort is a failure)
  int signal = 0;   // the signal that ended it, if one did
  std::string out, err;
};

// `k4 ARGS` through the shell (ARGS is a shell command tail: quote what needs it), stdout and
// stderr captured in t's directory. `prefix` goes before the binary (e.g. a setpriv command).
Run run(const TempDir& t, const std::string& args, const std::string& prefix = "");

// A command prefix that runs k4 without root's rights (setpriv to nobody) when the tests run as
// root, so that file permissions apply; "" when not root. Empty and *available = false when
// root and setpriv is missing.
std::string unprivileged_prefix(bool* available);

// `k4 ARGV...` started in the background (no shell), stdout / stderr to files in t; the pid.
pid_t spawn(const TempDir& t, const std::vector<std::string>& argv);
// Waits for a spawned k4; its status as Run (out / err read from the files).
Run wait(const TempDir& t, pid_t pid);

}  // namespace k4::cli

// A case that runs k4 fails without it (a missing binary is a broken build, not a pass).
#define REQUIRE_K4()                                                                          \
  REQUIRE_MESSAGE((!k4::cli::k4_bin().empty() && std::filesystem::exists(k4::cli::k4_bin())), \
                  "k4 binary not found beside the tests nor at $K4_BIN ('" << k4::cli::k4_bin() \
                  << "'): build the k4 target")
