// progress.hpp -- a one-line progress bar on stderr, shown only when stderr is a terminal
// or when asked (--progress); redrawn at most 10 times a second.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace k4::tools {

class Progress {
 public:
  // unit "": bytes, shown as MB; else counts of that unit ("rows").
  Progress(std::string label, bool force, std::string unit = "");
  ~Progress();
  void update(uint64_t done, uint64_t total);
  // where the total is not known beforehand: "label: N unit T s"; final: drawn even within
  // the 0.1 s since the last redraw (the last count before finish())
  void count(uint64_t done, bool final = false);
  void finish();
  bool enabled() const { return enabled_; }

 private:
  std::string label_, unit_;
  bool enabled_ = false, drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

bool stderr_is_tty();

}  // namespace k4::tools
