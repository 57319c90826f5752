// safetensors.cpp -- see safetensors.hpp.
#include "golden/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "golden/io/atomic_file.hpp"

namespace k4::st {
namespace {

struct DtypeInfo {
  SafetensorsDtype d;
  const char* name;
  size_t size;
};
const DtypeInfo kDtypes[] = {
    {SafetensorsDtype::BOOL, "BOOL", 1}, {SafetensorsDtype::U8, "U8", 1},           {SafetensorsDtype::I8, "I8", 1},
    {SafetensorsDtype::F8_E4M3, "F8_E4M3", 1}, {SafetensorsDtype::F8_E5M2, "F8_E5M2", 1}, {SafetensorsDtype::F8_E8M0, "F8_E8M0", 1},
    {SafetensorsDtype::I16, "I16", 2},   {SafetensorsDtype::U16, "U16", 2},         {SafetensorsDtype::F16, "F16", 2},
    {SafetensorsDtype::BF16, "BF16", 2}, {SafetensorsDtype::I32, "I32", 4},         {SafetensorsDtype::U32, "U32", 4},
    {SafetensorsDtype::F32, "F32", 4},   {SafetensorsDtype::F64, "F64", 8},         {SafetensorsDtype::I64, "I64", 8},
    {SafetensorsDtype::U64, "U64", 8},
};

constexpr uint64_t kMaxHeader = 100u << 20;  // safetensors' own limit

}  // namespace

const char* dtype_name(SafetensorsDtype d) {
  for (const DtypeInfo& i : kDtypes)
    if (i.d == d) return i.name;
  return "?";
}
bool dtype_from_name(const std::string& s, SafetensorsDtype& out) {
  for (const DtypeInfo& i : kDtypes)
    if (s == i.name) {
      out = i.d;
      return true;
    }
  return false;
}
size_t dtype_size(SafetensorsDtype d) {
  for (const DtypeInfo& i : kDtypes)
    if (i.d == d) return i.size;
  return 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

uint64_t TensorView::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

// ---- reader ----------------------------------------------------------------------------

File::File(const std::string& path) : path_(path) {
  auto bad = [&](const std::string& what) { throw std::invalid_argument("safetensors " + path + ": " + what); };
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) bad(std::string("cannot open (") + std::strerror(errno) + ")");
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = S_ISDIR(st.st_mode) ? "is a directory, expected a .safetensors file"
                                                : std::string("is not a regular file");
    ::close(fd_);
    fd_ = -1;
    bad(why);
  }
  size_ = uint64_t(st.st_size);
  if (size_ < 8) {
    ::close(fd_);
    fd_ = -1;
    bad("file of " + std::to_string(size_) + " bytes is shorter than the 8-byte header length");
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) {
    ::close(fd_);
    fd_ = -1;
    bad(std::string("cannot mmap (") + std::strerror(errno) + ")");
  }
  map_ = static_cast<uint8_t*>(m);
  try {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | map_[i];
    if (n > kMaxHeader) bad("header length " + std::to_string(n) + " exceeds the 100 MiB limit (corrupt length?)");
    if (8 + n > size_)
      bad("header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size_) + " bytes)");
    const uint64_t data0 = 8 + n, data_len = size_ - data0;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(reinterpret_cast<const char*>(map_ + 8), reinterpret_cast<const char*>(map_ + 8 + n));
    } catch (const std::exception& e) {
      bad(std::string("header is not valid JSON (") + e.what() + ")");
    }
    if (!j.is_object()) bad("header is not a JSON object");
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& e = it.value();
      if (name == "__metadata__") {
        if (!e.is_object()) bad("__metadata__ is not an object");
        for (auto m2 = e.begin(); m2 != e.end(); ++m2)
          meta_[m2.key()] = m2.value().is_string() ? m2.value().get<std::string>() : m2.value().dump();
        continue;
      }
      auto tbad = [&](const std::string& what) { bad("tensor '" + name + "': " + what); };
      if (!e.is_object()) tbad("entry is not an object");
      if (!e.contains("dtype") || !e["dtype"].is_string()) tbad("no dtype string");
      if (!e.contains("shape") || !e["shape"].is_array()) tbad("no shape array");
      if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
        tbad("no data_offsets [begin, end]");
      TensorView v;
      v.name = name;
      const bool known = dtype_from_name(e["dtype"].get<std::string>(), v.dtype);
      uint64_t elems = 1;
      bool overflow = false, empty = false;
      for (const auto& d : e["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) tbad("shape " + e["shape"].dump() + " is not non-negative integers");
        const uint64_t n = uint64_t(d.get<int64_t>());
        if (n == 0) empty = true;
        else if (elems > (uint64_t(1) << 60) / n) overflow = true;
        elems *= n;
        v.shape.push_back(d.get<int64_t>());
      }
      if (overflow && !empty) tbad("shape " + e["shape"].dump() + " has more than 2^60 elements");
      const auto& off = e["data_offsets"];
      if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        tbad("data_offsets " + off.dump() + " are not non-negative integers");
      const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
      if (b > en) tbad("data_offsets " + off.dump() + ": begin after end");
      if (en > data_len)
        tbad("data_offsets " + off.dump() + " run past the end of the file (data section of " +
             std::to_string(data_len) + " bytes)");
      if (!known) {  // its size rule is unknown (F4 packs two a byte): only the offsets are checked
        unknown_[name] = e["dtype"].get<std::string>();
        continue;
      }
      const uint64_t want = v.numel() * dtype_size(v.dtype);
      if (en - b != want)
        tbad("holds " + std::to_string(en - b) + " bytes, but " + dtype_name(v.dtype) + " " + shape_str(v.shape) +
             " needs " + std::to_string(want));
      v.data = map_ + data0 + b;
      v.nbytes = en - b;
      tensors_[name] = std::move(v);
    }
  } catch (...) {
    ::munmap(map_, size_);
    ::close(fd_);
    map_ = nullptr;
    fd_ = -1;
    throw;
  }
}

File::~File() {
  if (map_) ::munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> File::names() const {
  std::vector<std::string> n;
  for (const auto& kv : tensors_) n.push_back(kv.first);
  for (const auto& kv : unknown_) n.push_back(kv.first);
  std::sort(n.begin(), n.end());
  return n;
}

std::string File::unknown_dtype(const std::string& name) const {
  auto it = unknown_.find(name);
  return it == unknown_.end() ? std::string() : it->second;
}

const TensorView& File::at(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    auto u = unknown_.find(name);
    if (u != unknown_.end())
      throw std::invalid_argument("safetensors " + path_ + ": tensor '" + name + "' has dtype " + u->second +
                                  ", which this reader does not know");
    throw std::invalid_argument("safetensors " + path_ + ": tensor '" + name + "' is missing");
  }
  return it->second;
}

const TensorView& File::get(const std::string& name, const std::vector<SafetensorsDtype>& dtypes,
                            const std::vector<int64_t>& shape) const {
  std::string want;
  for (SafetensorsDtype d : dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
  if (unknown_.count(name))
    throw std::invalid_argument("safetensors " + path_ + ": tensor '" + name + "' has dtype " + unknown_.at(name) +
                                ", expected " + want);
  const TensorView& v = at(name);
  bool ok = false;
  for (SafetensorsDtype d : dtypes) ok = ok || d == v.dtype;
  if (!ok)
    throw std::invalid_argument("safetensors " + path_ + ": tensor '" + name + "' has dtype " + dtype_name(v.dtype) +
                                ", expected " + want);
  if (v.shape != shape)
    throw std::invalid_argument("safetensors " + path_ + ": tensor '" + name + "' has shape " + shape_str(v.shape) +
                                ", expected " + shape_str(shape));
  return v;
}

// ---- writer ----------------------------------------------------------------------------

struct Writer::Impl {
  struct Decl {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t bytes;
  };
  AtomicOutput out;
  std::FILE* f = nullptr;
  std::vector<Decl> decls;
  std::map<std::string, std::string> meta;
  bool begun = false;
  size_t cur = 0;
  uint64_t cur_done = 0;
  Impl(const std::string& path, bool overwrite) : out(path, overwrite) {}
  ~Impl() {
    if (f) std::fclose(f);
  }
  void skip_full() {
    while (cur < decls.size() && cur_done == decls[cur].bytes) {
      ++cur;
      cur_done = 0;
    }
  }
};

Writer::Writer(const std::string& path, bool overwrite) : p_(std::make_unique<Impl>(path, overwrite)) {}
Writer::~Writer() = default;

void Writer::declare(const std::string& name, SafetensorsDtype dtype, const std::vector<int64_t>& shape) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= uint64_t(d);
  declare_raw(name, dtype_name(dtype), shape, n);
}

void Writer::declare_raw(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                         uint64_t bytes) {
  if (p_->begun) throw std::logic_error("safetensors writer: declare after begin");
  for (const auto& d : p_->decls)
    if (d.name == name) throw std::logic_error("safetensors writer: tensor '" + name + "' declared twice");
  p_->decls.push_back({name, dtype, shape, bytes});
}

void Writer::set_metadata(const std::string& key, const std::string& value) { p_->meta[key] = value; }

uint64_t Writer::total_bytes() const {
  uint64_t t = 0;
  for (const auto& d : p_->decls) t += d.bytes;
  return t;
}

void Writer::begin() {
  if (p_->begun) throw std::logic_error("safetensors writer: begin twice");
  nlohmann::ordered_json j;
  if (!p_->meta.empty()) {
    nlohmann::ordered_json m;
    for (const auto& kv : p_->meta) m[kv.first] = kv.second;
    j["__metadata__"] = m;
  }
  uint64_t off = 0;
  for (const auto& d : p_->decls) {
    nlohmann::ordered_json e;
    e["dtype"] = d.dtype;
    e["shape"] = d.shape;
    e["data_offsets"] = {off, off + d.bytes};
    j[d.name] = e;
    off += d.bytes;
  }
  std::string h = j.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // the data starts 8-aligned
  p_->f = std::fopen(p_->out.temp_path().c_str(), "wb");
  if (!p_->f) throw std::runtime_error("cannot create " + p_->out.temp_path() + ": " + std::strerror(errno));
  std::setvbuf(p_->f, nullptr, _IOFBF, 1 << 20);
  uint8_t len[8];
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  if (std::fwrite(len, 1, 8, p_->f) != 8 || std::fwrite(h.data(), 1, h.size(), p_->f) != h.size())
    throw std::runtime_error("write to " + p_->out.temp_path() + " failed: " + std::strerror(errno));
  p_->begun = true;
  p_->skip_full();
}

void Writer::write(const void* data, uint64_t n) {
  if (!p_->begun) throw std::logic_error("safetensors writer: write before begin");
  const uint8_t* b = static_cast<const uint8_t*>(data);
  while (n > 0) {
    p_->skip_full();
    if (p_->cur >= p_->decls.size()) throw std::logic_error("safetensors writer: more bytes than declared");
    const auto& d = p_->decls[p_->cur];
    const uint64_t k = std::min<uint64_t>(n, d.bytes - p_->cur_done);
    if (std::fwrite(b, 1, k, p_->f) != k)
      throw std::runtime_error("write to " + p_->out.temp_path() + " failed: " + std::strerror(errno));
    count_written(k);  // K4_FAIL_AFTER_BYTES (atomic_file.hpp)
    p_->cur_done += k;
    b += k;
    n -= k;
  }
  p_->skip_full();
}

void Writer::finish() {
  if (!p_->begun) throw std::logic_error("safetensors writer: finish before begin");
  p_->skip_full();
  if (p_->cur != p_->decls.size())
    throw std::logic_error("safetensors writer: tensor '" + p_->decls[p_->cur].name + "' has " +
                           std::to_string(p_->cur_done) + " of " + std::to_string(p_->decls[p_->cur].bytes) + " bytes");
  if (std::fclose(p_->f) != 0) {
    p_->f = nullptr;
    throw std::runtime_error("closing " + p_->out.temp_path() + " failed: " + std::strerror(errno));
  }
  p_->f = nullptr;
  p_->out.commit();
}

}  // namespace k4::st
