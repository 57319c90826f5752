// atomic_file.hpp -- an output file that appears only when complete.
//
// Writing goes to a temporary name in the target's directory (".NAME.tmp-PID"); commit()
// renames it onto the target. An existing target is refused unless overwrite was asked
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

// Removes the ".NAME.tmp-<pid>" files of PATH left by processes that no longer run; returns
// how many. (AtomicOutput calls it; a temporary of a live process, this one included, stays.)
int remove_stale_temporaries(const std::string& path);

// Fault injection for the tests of the writers: with K4_FAIL_AFTER_BYTES=N in the
// environment, count_written throws std::runtime_error ("injected write failure", exit 1)
// once N bytes were counted since the last AtomicOutput was made. Every writer counts the
// bytes it writes into its temporary (golden, safetensors, inputs file, dump, diff reports).
void count_written(uint64_t bytes);

}  // namespace k4
