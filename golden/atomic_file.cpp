// atomic_file.cpp -- see atomic_file.hpp.
#include "golden/atomic_file.hpp"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace k4 {

namespace fs = std::filesystem;

AtomicOutput::AtomicOutput(const std::string& path, bool overwrite) : path_(path) {
  if (path.empty()) throw std::invalid_argument("output path is empty");
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) throw std::invalid_argument("output " + path + " is a directory");
  if (fs::exists(p, ec) && !overwrite)
    throw std::invalid_argument("output " + path + " exists; pass --force to overwrite it");
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) throw std::invalid_argument("output directory " + dir.string() + " does not exist");
  temp_ = (dir / ("." + p.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
  fs::remove(temp_, ec);
}

AtomicOutput::~AtomicOutput() {
  if (!done_) {
    std::error_code ec;
    fs::remove(temp_, ec);  // never throws
  }
}

void AtomicOutput::commit() {
  std::error_code ec;
  fs::rename(temp_, path_, ec);
  if (ec) throw std::runtime_error("cannot rename " + temp_ + " to " + path_ + ": " + ec.message());
  done_ = true;
}

}  // namespace k4
