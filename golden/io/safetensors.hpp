// safetensors.hpp -- a memory-mapped safetensors reader and a streaming writer.
//
// Format: 8 bytes little-endian header length N, N bytes of JSON
//   {"NAME": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"k": "v"}}
// then the data; offsets are relative to the byte after the header.
// The reader validates the header length, the JSON, every entry (shape of non-negative
// integers, begin <= end inside the file, end - begin = numel * dtype size for a known dtype),
// and get() validates dtype and shape against what the caller expects. An entry of a dtype
// this reader does not know (F4, F8_E4M3FNUZ, C64, ...) is kept by name and refused only
// when read: a real checkpoint's shard holds tensors K4 never reads. Every message names
// the file, the tensor and what was expected (std::invalid_argument: bad input, exit 2).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace k4::st {

// A safetensors header dtype (the file format's names; golden::DType is a golden tensor's).
enum class SafetensorsDtype { BOOL, U8, I8, F8_E4M3, F8_E5M2, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };
const char* dtype_name(SafetensorsDtype d);
bool dtype_from_name(const std::string& s, SafetensorsDtype& out);
size_t dtype_size(SafetensorsDtype d);

struct TensorView {
  std::string name;
  SafetensorsDtype dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping (may be unaligned)
  uint64_t nbytes = 0;
  uint64_t numel() const;
};

class File {
 public:
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0 || unknown_.count(name) != 0; }
  std::vector<std::string> names() const;  // sorted, unknown dtypes included
  // The dtype string of an entry whose dtype this reader does not know ("" if known / absent).
  std::string unknown_dtype(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return meta_; }
  // Any entry, unchecked beyond the header validation.
  const TensorView& at(const std::string& name) const;
  // Checked: the tensor exists, its dtype is one of `dtypes`, its shape equals `shape`.
  const TensorView& get(const std::string& name, const std::vector<SafetensorsDtype>& dtypes,
                        const std::vector<int64_t>& shape) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> unknown_;  // name -> its dtype string
  std::map<std::string, std::string> meta_;
};

// Tensors declared up front (the header holds every offset), then their bytes streamed in
// declaration order; the file is written to a temporary and renamed by finish().
class Writer {
 public:
  Writer(const std::string& path, bool overwrite);
  ~Writer();
  void declare(const std::string& name, SafetensorsDtype dtype, const std::vector<int64_t>& shape);
  // A tensor of any dtype string (one this reader does not know, for fixtures), `bytes` long.
  void declare_raw(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape, uint64_t bytes);
  void set_metadata(const std::string& key, const std::string& value);
  // Writes the header; after it only write() and finish().
  void begin();
  // The next bytes of the current tensor (tensors advance as each fills).
  void write(const void* data, uint64_t n);
  // Checks every tensor was written whole, closes, renames.
  void finish();
  uint64_t total_bytes() const;  // data bytes of every declared tensor

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

std::string shape_str(const std::vector<int64_t>& s);

}  // namespace k4::st
