// fuzz_safetensors.cpp -- libFuzzer target: the safetensors reader (golden/io/safetensors.hpp)
// on arbitrary bytes.
//
// Feeds: the input as a whole .safetensors file (one tmpfs file, rewritten for every input),
// opened with st::File. When it opens, every getter runs on what it parsed: names(),
// metadata(), at() of every name and of a missing one, get() with the entry's own dtype and
// shape (must succeed) and with another dtype and another shape (must throw
// std::invalid_argument); every data byte of every tensor is read; the header's promises
// are checked (nbytes == numel * dtype size without overflow, data inside the file). Then
// Checkpoint (golden/inputs/checkpoint.hpp) opens the same file and looks up the layer's names.
// Not a finding: std::invalid_argument (the reader's bad-input error, exit 2).
// Findings: crashes, ASan / UBSan reports, any other exception (std::logic_error, a JSON
// library exception, bad_alloc), a broken promise (abort), hangs (-timeout), huge
// allocations (-rss_limit_mb / -malloc_limit_mb).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "golden/inputs/checkpoint.hpp"
#include "golden/inputs/hf_names.hpp"
#include "golden/io/safetensors.hpp"
#include "tests/fuzz/fuzz_common.hpp"

using namespace k4;

namespace {

fuzz::ScratchDir& scratch() {
  static fuzz::ScratchDir d("safetensors");
  return d;
}

void check_file(const st::File& f, uint64_t file_size) {
  volatile uint8_t sink = 0;
  for (const auto& kv : f.metadata()) sink = sink ^ uint8_t(kv.first.size() + kv.second.size());
  const std::vector<std::string> names = f.names();
  for (const std::string& n : names) {
    if (!f.has(n)) fuzz::finding("safetensors", "names() lists '" + n + "' but has() denies it");
    const st::TensorView& v = f.at(n);
    // The header's promise: nbytes = numel * dtype size (no overflow), inside the file.
    unsigned __int128 want = st::dtype_size(v.dtype);
    bool zero = false;
    for (int64_t d : v.shape) {
      if (d < 0) fuzz::finding("safetensors", "tensor '" + n + "' has a negative dimension");
      zero = zero || d == 0;
    }
    for (int64_t d : v.shape) {
      if (zero) {
        want = 0;
        break;
      }
      want *= uint64_t(d);
      if (want > (unsigned __int128)(file_size)) break;  // more than the file holds: not nbytes
    }
    if (want != v.nbytes)
      fuzz::finding("safetensors", "tensor '" + n + "' of shape " + st::shape_str(v.shape) + " holds " +
                                       std::to_string(v.nbytes) + " bytes, which is not numel * dtype size");
    if (v.numel() * st::dtype_size(v.dtype) != v.nbytes)
      fuzz::finding("safetensors", "tensor '" + n + "': numel() * dtype_size disagrees with nbytes");
    for (uint64_t i = 0; i < v.nbytes; ++i) sink = sink ^ v.data[i];
    // get() with its own dtype and shape succeeds ...
    f.get(n, {v.dtype}, v.shape);
    // ... and with another dtype or shape says so.
    const st::SafetensorsDtype other = v.dtype == st::SafetensorsDtype::U8 ? st::SafetensorsDtype::BF16 : st::SafetensorsDtype::U8;
    bool threw = false;
    try {
      f.get(n, {other}, v.shape);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    if (!threw) fuzz::finding("safetensors", "get() of '" + n + "' accepted a wrong dtype");
    std::vector<int64_t> s2 = v.shape;
    s2.push_back(1);
    threw = false;
    try {
      f.get(n, {v.dtype}, s2);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    if (!threw) fuzz::finding("safetensors", "get() of '" + n + "' accepted a wrong shape");
  }
  bool threw = false;
  try {
    f.at("\x01no such tensor");
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  if (!threw) fuzz::finding("safetensors", "at() of a missing name did not throw");
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = scratch().path("input.safetensors");
  fuzz::write_file(path, data, size);
  fuzz::expect_clean("st::File", fuzz::kInvalidArgument, [&] {
    st::File f(path);
    check_file(f, size);
  });
  fuzz::expect_clean("Checkpoint", fuzz::kInvalidArgument, [&] {
    Checkpoint ck(path);
    for (const hf::NameRow& row : hf::table()) {
      const std::string n = hf::name(row.id, 0, 0, false);
      if (!ck.has(n)) continue;
      const st::TensorView& v = ck.at(n);
      ck.get(n, {v.dtype}, v.shape);
    }
  });
  return 0;
}
