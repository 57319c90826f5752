// fuzz_common.hpp -- what the libFuzzer targets of tests/fuzz share (header only, no libFuzzer
// dependency: the CPU suite's regression tests include it too).
//
//   Bytes          a forward reader of the fuzz input (exhausted: zeros), for edit programs
//   ScratchDir     a per-process directory on tmpfs (/dev/shm, else $TMPDIR), removed at exit
//   write_file     one input as a file
//   expect_clean   runs a call; the exceptions the code documents for bad input are fine,
//                  anything else is a finding: the message is printed and the process aborts
//                  (libFuzzer records a crash- file), or, with findings_throw(), Finding is
//                  thrown; K4_FUZZ_VERBOSE=1 prints the allowed ones
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

namespace k4::fuzz {

class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  size_t left() const { return n_ - i_; }
  uint8_t u8() { return i_ < n_ ? d_[i_++] : 0; }
  // Little-endian, the low part read first. The reads are sequenced by statements: the
  // operands of | are unsequenced, and gcc -O1 and -O3 took the bytes in different orders, so
  // one checked-in input meant different edits in the ASan and the release build.
  uint16_t u16() {
    const uint16_t lo = u8();
    const uint16_t hi = u8();
    return uint16_t(lo | (hi << 8));
  }
  uint32_t u32() {
    const uint32_t lo = u16();
    const uint32_t hi = u16();
    return lo | (hi << 16);
  }
  uint64_t u64() {
    const uint64_t lo = u32();
    const uint64_t hi = u32();
    return lo | (hi << 32);
  }
  // n bytes (fewer at the end of the input).
  std::string take(size_t n) {
    n = std::min(n, left());
    std::string s(reinterpret_cast<const char*>(d_ + i_), n);
    i_ += n;
    return s;
  }
  // A length-prefixed string of at most max bytes.
  std::string str(size_t max) { return take(u8() % (max + 1)); }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[u16() % v.size()]; }

 private:
  const uint8_t* d_;
  size_t n_, i_ = 0;
};

inline std::filesystem::path scratch_root() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) return "/dev/shm";
  return std::filesystem::temp_directory_path();
}

// A directory of this process's files, removed when the process exits normally.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    dir_ = scratch_root() / ("k4fuzz-" + tag + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

inline void write_file(const std::string& path, const void* data, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  if (n && std::fwrite(data, 1, n, f) != n) std::abort();
  std::fclose(f);
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A finding, thrown instead of aborting when findings_throw() is set (the CPU suite's
// regression tests replay crash inputs that way). Not a std::exception: expect_clean passes
// it on.
struct Finding {
  std::string what;
};
inline bool& findings_throw() {
  static bool t = false;
  return t;
}

[[noreturn]] inline void finding(const char* where, const std::string& what) {
  if (findings_throw()) throw Finding{std::string(where) + ": " + what};
  std::fprintf(stderr, "\n==k4fuzz== FINDING in %s: %s\n", where, what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Which exception types are the documented answer to bad input.
enum Allowed : unsigned { kInvalidArgument = 1, kRuntimeError = 2 };

// K4_FUZZ_VERBOSE=1: print every allowed exception (to see how far an input gets).
inline bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("K4_FUZZ_VERBOSE");
    return e && *e && *e != '0';
  }();
  return v;
}
inline void note_allowed(const char* where, const char* kind, const char* what) {
  if (verbose()) std::fprintf(stderr, "  %s: %s: %s\n", where, kind, what);
}

// Runs f(); returns true when it returned normally, false on an allowed exception. Anything
// else (std::logic_error other than invalid_argument, bad_alloc, a JSON library exception,
// a non-standard throw) is a finding.
template <class F>
bool expect_clean(const char* where, unsigned allowed, F&& f) {
  try {
    f();
    return true;
  } catch (const Finding&) {
    throw;
  } catch (const std::invalid_argument& e) {
    if (allowed & kInvalidArgument) {
      note_allowed(where, "invalid_argument", e.what());
      return false;
    }
    finding(where, std::string("std::invalid_argument: ") + e.what());
  } catch (const std::logic_error& e) {
    finding(where, std::string("std::logic_error (") + typeid(e).name() + "): " + e.what());
  } catch (const std::runtime_error& e) {
    if (allowed & kRuntimeError) {
      note_allowed(where, "runtime_error", e.what());
      return false;
    }
    finding(where, std::string("std::runtime_error (") + typeid(e).name() + "): " + e.what());
  } catch (const std::exception& e) {
    finding(where, std::string("unexpected exception (") + typeid(e).name() + "): " + e.what());
  } catch (...) {
    finding(where, "a non-standard exception");
  }
}

}  // namespace k4::fuzz
