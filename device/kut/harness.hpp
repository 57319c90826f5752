// harness.hpp -- runs a kernel-under-test library (k4_kut.h) over goldens, stage by stage and
// rank by rank, and reports the first divergence of each golden (its case): case, rank,
// stage, tensor, element, both sides' bits and values.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "device/kut/k4_kut.h"

namespace k4::kut {

// Where the tensors handed to the library live (host memory here; device memory in a GPU build).
class Memory {
 public:
  virtual ~Memory() = default;
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void* stream() { return nullptr; }
};
std::unique_ptr<Memory> host_memory();

// A loaded library: dlopen + k4_kut_get, the ABI version checked. Throws std::invalid_argument
// naming the file and what is wrong with it. Never unloaded (RTLD_NODELETE, harness.cpp): the
// library's threads and runtimes may outlive this object.
class Library {
 public:
  explicit Library(const std::string& path);
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  const k4_kut_impl& impl() const { return *impl_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* handle_ = nullptr;
  const k4_kut_impl* impl_ = nullptr;
};

struct CaseResult {
  std::string name;        // the case: the golden's file name
  int tensors = 0;         // outputs compared bit-exact before the first divergence
  bool ok = true;
  int rank = -1;
  std::string stage, tensor;
  std::string element;     // "[token 1] (flat 1)"
  std::string detail;      // the divergence: both sides' bits, values, distance, the count
  std::string error;       // the library failed (run_stage returned nonzero) or an input was unusable
  std::string line() const;  // "FAIL  case: rank 2, stage merge, tensor x_scale, element [token 1] ..."
};

// Every stage in `stages` (empty: all) the library supports, every rank, of one golden.
CaseResult run_case(const Library& lib, Memory& mem, const std::string& golden_path, const std::vector<std::string>& stages);

// The command (k4_kut run, k4_device run --kut): every golden through `lib` in `mem` (named
// `memory` in the header line), one line a case (ok, FAIL with its detail, or ERROR), then
// "N of M cases bit-exact". Returns 0 when every case is bit-exact, else 1. `stages`: a
// comma-separated list, empty for every stage the library supports.
int run_cases(const std::string& tool, const Library& lib, Memory& mem, const std::string& memory,
              const std::vector<std::string>& goldens, const std::string& stages);

}  // namespace k4::kut
