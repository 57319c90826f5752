// hdf5.hpp -- a thin RAII layer over the HDF5 C API (HighFive style).
//
// One checked call per C function: every failure throws h5::Error whose message names the
// file, the object (group, dataset or attribute path) and the C function, followed by
// HDF5's own error stack. Handles close in destructors that never throw. HDF5's automatic
// error printing is turned off the first time this layer is used.
//
// Only what the goldens need: groups, soft links, datasets of raw-bit integers (uint8,
// uint16, int32, uint32) of any rank, virtual datasets over another file's rows, and scalar
// string / int64 / double attributes.
// Everything written is deterministic: object timestamps are off (H5Pset_obj_track_times),
// no compression, contiguous layout; the same calls in the same order give the same bytes.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "golden/io/crash_guard.hpp"

namespace k4::h5 {

// The one HDF5 lock of the process. libhdf5 is built without thread safety: every call of
// this layer into it holds this mutex (recursive: a layer function may call another), and the
// readers (GoldenReader, WeightsFile's expert source) hold it around their reads and caches,
// so that no two HDF5 calls run at once, whichever objects they go through. It is never held
// while waiting for other threads.
std::recursive_mutex& serial_mutex();

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The element types a raw-bit dataset may hold.
enum class Elem { U8, U16, I32, U32 };
const char* elem_name(Elem e);
size_t elem_size(Elem e);
template <class T> constexpr Elem elem_of();
template <> constexpr Elem elem_of<uint8_t>() { return Elem::U8; }
template <> constexpr Elem elem_of<uint16_t>() { return Elem::U16; }
template <> constexpr Elem elem_of<int32_t>() { return Elem::I32; }
template <> constexpr Elem elem_of<uint32_t>() { return Elem::U32; }

// An owned hid_t with its close function.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer c) : id_(id), close_(c) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept;
  ~Handle() { reset(); }
  void reset() noexcept;  // closes under serial_mutex()
  // Gives up ownership without closing.
  hid_t release() noexcept { hid_t i = id_; id_ = -1; return i; }
  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Where an object lives, for messages: "file F, dataset /rank0/split/outputs/o".
struct Where {
  std::string file;
  std::string path;
  std::string str(const char* kind = "object") const;
};

class Group;

// Attribute access on any object (file root, group or dataset).
class Object {
 public:
  Object() = default;
  Object(Handle h, Where w) : h_(std::move(h)), where_(std::move(w)) {}
  // Every libhdf5 call on the object takes its id: the crash guard learns which file it is.
  hid_t id() const { guard::note_hdf5_file(where_.file); return h_.id(); }
  const Where& where() const { return where_; }
  const std::string& path() const { return where_.path; }
  const std::string& file() const { return where_.file; }

  void set_attr(const std::string& name, const std::string& value) const;
  void set_attr(const std::string& name, const char* value) const { set_attr(name, std::string(value)); }
  void set_attr(const std::string& name, int64_t value) const;
  void set_attr(const std::string& name, int value) const { set_attr(name, int64_t(value)); }
  void set_attr(const std::string& name, double value) const;
  bool has_attr(const std::string& name) const;
  std::string attr_string(const std::string& name) const;
  int64_t attr_int(const std::string& name) const;
  double attr_double(const std::string& name) const;
  std::vector<std::string> attr_names() const;
  // "string", "int", "float" or "other".
  std::string attr_kind(const std::string& name) const;

 protected:
  Handle h_;
  Where where_;
};

class Dataset : public Object {
 public:
  using Object::Object;
  std::vector<uint64_t> shape() const;
  uint64_t size() const;
  // The stored integer type; throws if it is not one of Elem.
  Elem elem() const;
  // Whole-dataset read/write of raw bits (mem type = the dataset's element type).
  void write_raw(const void* data, Elem mem) const;
  void read_raw(void* data, Elem mem) const;
  // Rows [row, row + n) of the first dimension.
  void write_rows(uint64_t row, uint64_t n, const void* data, Elem mem) const;
  void read_rows(uint64_t row, uint64_t n, void* data, Elem mem) const;

  // An HDF5 virtual dataset (its elements live in other files' datasets).
  bool is_virtual() const;

  template <class T> std::vector<T> read() const {
    std::vector<T> v(size());
    read_raw(v.data(), elem_of<T>());
    return v;
  }
};

class Group : public Object {
 public:
  using Object::Object;
  Group create_group(const std::string& name) const;
  Group open_group(const std::string& name) const;
  Group require_group(const std::string& name) const;  // open or create
  // A link of any kind exists at this name (relative or absolute path).
  bool exists(const std::string& name) const;
  // The link resolves to an object (false for a dangling soft link).
  bool resolves(const std::string& name) const;
  bool is_group(const std::string& name) const;
  bool is_dataset(const std::string& name) const;
  // "" if name is a hard link; the target path if it is a soft link.
  std::string soft_target(const std::string& name) const;
  void link_soft(const std::string& name, const std::string& target) const;
  // Child link names in name order.
  std::vector<std::string> children() const;

  Dataset create_dataset(const std::string& name, Elem stored, const std::vector<uint64_t>& shape) const;
  Dataset open_dataset(const std::string& name) const;
  // A virtual dataset (HDF5 VDS): row i of its first dimension is row src_rows[i] of the
  // dataset src_path of file src_file (a relative name is found beside this file, HDF5's
  // rule), the other dimensions the same. Runs of consecutive rows are one mapping each.
  // Elements whose source cannot be opened read as the fill value 0: the caller checks the
  // source (a golden's weights file: its hash, docs/golden-format.md).
  Dataset create_virtual(const std::string& name, Elem stored, const std::vector<uint64_t>& shape,
                         const std::string& src_file, const std::string& src_path,
                         const std::vector<uint64_t>& src_shape, const std::vector<uint64_t>& src_rows) const;

  template <class T>
  Dataset write(const std::string& name, const std::vector<uint64_t>& shape, const T* data) const {
    Dataset d = create_dataset(name, elem_of<T>(), shape);
    d.write_raw(data, elem_of<T>());
    return d;
  }
  std::string child_path(const std::string& name) const;
};

class File {
 public:
  enum class Mode { ReadOnly, ReadWrite, CreateExclusive, CreateTruncate };
  File() = default;
  File(const std::string& path, Mode mode);
  File(File&&) = default;
  File& operator=(File&&) = default;
  ~File() = default;  // Handle closes
  Group root() const;
  const std::string& path() const { return path_; }
  // Flushes and closes now (throws on failure, unlike the destructor).
  void close();

 private:
  std::string path_;
  Handle h_;
};

// Turns automatic error printing off (idempotent; called by File's constructor).
void silence_errors();

// The HDF5 error stack as one line, most recent first; empty if none.
std::string error_stack();

// Library version "1.10.8".
std::string library_version();

}  // namespace k4::h5
