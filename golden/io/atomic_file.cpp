// atomic_file.cpp -- see atomic_file.hpp.
#include "golden/io/atomic_file.hpp"

#include "golden/io/crash_guard.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace k4 {

namespace fs = std::filesystem;

namespace {

std::atomic<uint64_t> g_written{0};

fs::path dir_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

}  // namespace

void check_output(const std::string& path, bool overwrite) {
  if (path.empty()) throw std::invalid_argument("output path is empty");
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) throw std::invalid_argument("output " + path + " is a directory");
  if (fs::exists(p, ec) && !overwrite)
    throw std::invalid_argument("output " + path + " exists; pass --force to overwrite it");
  const fs::path dir = dir_of(p);
  if (!fs::is_directory(dir, ec)) throw std::invalid_argument("output directory " + dir.string() + " does not exist");
}

std::string temporary_path(const std::string& path, int owner) {
  const fs::path p(path);
  return (dir_of(p) / ("." + p.filename().string() + ".tmp-" + std::to_string(owner))).string();
}

int remove_stale_temporaries(const std::string& path) {
  const fs::path p(path);
  const std::string prefix = "." + p.filename().string() + ".tmp-";
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir_of(p), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0 || name.size() == prefix.size()) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const pid_t pid = pid_t(std::stol(digits));
    if (pid == getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge): keep
    std::error_code rec;
    if (fs::remove(it->path(), rec)) ++removed;
  }
  return removed;
}

AtomicOutput::AtomicOutput(const std::string& path, bool overwrite) : path_(path) {
  check_output(path, overwrite);
  const fs::path p(path);
  std::error_code ec;
  remove_stale_temporaries(path);
  temp_ = temporary_path(path, int(getpid()));
  fs::remove(temp_, ec);
  guard::note_temporary(temp_);  // a crash or a SIGTERM removes it (golden/io/crash_guard.hpp)
  g_written = 0;
}

AtomicOutput::~AtomicOutput() {
  if (!done_) {
    std::error_code ec;
    fs::remove(temp_, ec);  // never throws
    guard::forget_temporary(temp_);
  }
}

namespace {

// fsync(2) of a file or a directory, by name; "" or why it failed.
std::string sync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return std::strerror(errno);
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: the file system cannot sync this kind of file (some refuse directories); nothing to wait for
  return r == 0 || err == EINVAL ? "" : std::strerror(err);
}

}  // namespace

void AtomicOutput::commit() {
  if (const std::string why = sync_path(temp_, O_RDONLY); !why.empty())
    throw std::runtime_error("cannot flush " + temp_ + " to the disk (fsync): " + why);
  std::error_code ec;
  fs::rename(temp_, path_, ec);
  if (ec) throw std::runtime_error("cannot rename " + temp_ + " to " + path_ + ": " + ec.message());
  done_ = true;
  guard::forget_temporary(temp_);
  // the rename itself is on the disk once the directory is: a failure here loses nothing written
  if (const std::string why = sync_path(dir_of(fs::path(path_)).string(), O_RDONLY | O_DIRECTORY); !why.empty())
    std::fprintf(stderr, "warning: %s is complete but its directory could not be flushed (fsync): %s\n",
                 path_.c_str(), why.c_str());
}

void count_written(uint64_t bytes) {
  const uint64_t total = g_written += bytes;
  const char* e = std::getenv("K4_FAIL_AFTER_BYTES");
  if (!e || !*e) return;
  const uint64_t limit = std::strtoull(e, nullptr, 10);
  if (total >= limit)
    throw std::runtime_error("injected write failure after " + std::to_string(total) + " bytes (K4_FAIL_AFTER_BYTES=" +
                             std::string(e) + ")");
}

}  // namespace k4
