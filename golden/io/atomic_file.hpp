// atomic_file.hpp -- an output file that appears only when complete.
//
// Writing goes to a temporary name in the target's directory (".NAME.tmp-PID"; a crash or a
// SIGTERM of the command removes it: golden/io/crash_guard.hpp); commit() flushes it to the disk (fsync), renames it onto
// the target and flushes the directory, so that after a crash or a power loss NAME is either
// absent, the old file, or the whole new one (never a renamed but empty file). An existing target is refused unless overwrite was asked
// (std::invalid_argument: bad input, exit code 2). If the writer throws before commit(),
// the destructor removes the temporary, so a failure never leaves a half-written file.
// A process killed before commit() (SIGKILL, power loss) leaves its ".NAME.tmp-PID" behind,
// never a file at NAME; the next AtomicOutput for NAME removes every ".NAME.tmp-<pid>" whose
// process is gone (docs/reliability.md, "Nothing lost").
#pragma once
#include <cstdint>
#include <string>

namespace k4 {

// The checks AtomicOutput makes, without touching anything: PATH is not empty, not a
// directory, not an existing file unless overwrite, and its directory exists. Tools call it
// before long work so that a refusal comes first (std::invalid_argument).
void check_output(const std::string& path, bool overwrite);

class AtomicOutput {
 public:
  AtomicOutput(const std::string& path, bool overwrite);
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;
  ~AtomicOutput();
  const std::string& temp_path() const { return temp_; }
  const std::string& path() const { return path_; }
  void commit();

 private:
  std::string path_, temp_;
  bool done_ = false;
};

// The temporary of PATH that process OWNER writes: "DIR/.NAME.tmp-OWNER".
std::string temporary_path(const std::string& path, int owner);

// Removes the ".NAME.tmp-<pid>" files of PATH left by processes that no longer run; returns
// how many. (AtomicOutput calls it; a temporary of a live process, this one included, stays.)
int remove_stale_temporaries(const std::string& path);

// Fault injection for the tests of the writers: with K4_FAIL_AFTER_BYTES=N in the
// environment, count_written throws std::runtime_error ("injected write failure", exit 1)
// once N bytes were counted since the last AtomicOutput was made. Every writer counts the
// bytes it writes into its temporary (golden, safetensors, inputs file, dump, diff reports).
void count_written(uint64_t bytes);

}  // namespace k4
