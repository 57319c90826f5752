// progress.cpp -- see progress.hpp.
#include "tools/progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace k4::tools {

bool stderr_is_tty() { return ::isatty(2) == 1; }

Progress::Progress(std::string label, bool force, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), enabled_(force || stderr_is_tty()), start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

void Progress::update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  if (done > total) total = done;  // an estimated total (the golden's bytes) that fell short: 100%, not 103%
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  drawn_ = true;
  const double f = total ? double(done) / double(total) : 1.0;
  const int width = 30, fill = int(f * width + 0.5);
  std::string bar(size_t(fill > width ? width : fill), '#');
  bar.resize(width, ' ');
  const double secs = std::chrono::duration<double>(now - start_).count();
  if (unit_.empty())
    std::fprintf(stderr, "\r%s [%s] %3d%% %.1f/%.1f MB %.1fs", label_.c_str(), bar.c_str(), int(f * 100 + 0.5),
                 double(done) / 1e6, double(total) / 1e6, secs);
  else
    std::fprintf(stderr, "\r%s [%s] %3d%% %llu/%llu %s %.1fs", label_.c_str(), bar.c_str(), int(f * 100 + 0.5),
                 (unsigned long long)done, (unsigned long long)total, unit_.c_str(), secs);
  std::fflush(stderr);
}

void Progress::count(uint64_t done, bool final) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!final && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  drawn_ = true;
  const double secs = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r%s: %llu %s %.1fs", label_.c_str(), (unsigned long long)done, unit_.c_str(), secs);
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && drawn_) {
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }
  drawn_ = false;
}

}  // namespace k4::tools
