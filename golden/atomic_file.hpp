// atomic_file.hpp -- an output file that appears only when complete.
//
// Writing goes to a temporary name in the target's directory (".NAME.tmp-PID"); commit()
// renames it onto the target. An existing target is refused unless overwrite was asked
// (std::invalid_argument: bad input, exit code 2). If the writer throws before commit(),
// the destructor removes the temporary, so a failure never leaves a half-written file.
#pragma once
#include <string>

namespace k4 {

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

}  // namespace k4
