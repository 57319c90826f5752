// harness.cpp -- the kernel-under-test harness (harness.hpp): a golden's stage inputs into
// the library's memory, its outputs back, compared with the golden's bit for bit.
#include "device/kut/harness.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "golden/diff/compare.hpp"
#include "golden/format/schema.hpp"
#include "golden/io/hdf5.hpp"

namespace k4::kut {
namespace {

class HostMemory : public Memory {
 public:
  void* alloc(size_t bytes) override { return ::operator new(std::max<size_t>(bytes, 1)); }
  void release(void* p) override { ::operator delete(p); }
  void to_device(void* d, const void* s, size_t n) override { if (n) std::memcpy(d, s, n); }
  void to_host(void* d, const void* s, size_t n) override { if (n) std::memcpy(d, s, n); }
};

// A buffer in the library's memory, released at scope end.
struct Buffer {
  Memory* mem = nullptr;
  void* p = nullptr;
  Buffer(Memory& m, size_t n) : mem(&m), p(m.alloc(n)) {}
  Buffer(Buffer&& o) noexcept : mem(o.mem), p(o.p) { o.p = nullptr; }
  Buffer(const Buffer&) = delete;
  ~Buffer() { if (p) mem->release(p); }
};

std::vector<uint8_t> storage_bytes(const golden::RawTensor& t) {
  const size_t w = golden::dtype_bytes(t.dtype);
  std::vector<uint8_t> b(t.bits.size() * w);
  for (size_t i = 0; i < t.bits.size(); ++i) std::memcpy(&b[i * w], &t.bits[i], w);  // little-endian
  return b;
}

golden::RawTensor from_bytes(const golden::RawTensor& like, const std::vector<uint8_t>& b) {
  golden::RawTensor t = like;
  const size_t w = golden::dtype_bytes(t.dtype);
  for (size_t i = 0; i < t.bits.size(); ++i) {
    uint32_t v = 0;
    std::memcpy(&v, &b[i * w], w);
    t.bits[i] = v;
  }
  return t;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// One tensor handed to the library: its descriptor, its name and dims kept alive, its buffer.
struct Slot {
  std::string name, dims;
  golden::RawTensor raw;
  std::unique_ptr<Buffer> buf;
  k4_kut_tensor t{};
};

void describe(Slot& s, Memory& mem, bool fill_input) {
  const std::vector<uint8_t> bytes = storage_bytes(s.raw);
  s.dims = join(s.raw.dims);
  s.buf = std::make_unique<Buffer>(mem, bytes.size());
  if (fill_input) {
    mem.to_device(s.buf->p, bytes.data(), bytes.size());
  } else {  // an output: 0xA5 everywhere, so that an element left unwritten is caught
    const std::vector<uint8_t> poison(bytes.size(), 0xA5);
    mem.to_device(s.buf->p, poison.data(), poison.size());
  }
  s.t.name = s.name.c_str();
  golden::DType d = s.raw.dtype;
  s.t.dtype = int(d);  // enum k4_kut_dtype follows golden::DType's order
  s.t.ndim = int(s.raw.shape.size());
  if (s.t.ndim > 4) throw std::logic_error("kut: a tensor of more than 4 dimensions");
  for (int i = 0; i < s.t.ndim; ++i) s.t.shape[i] = int64_t(s.raw.shape[size_t(i)]);
  s.t.dims = s.dims.c_str();
  s.t.data = s.buf->p;
  s.t.bytes = bytes.size();
}

static_assert(int(golden::DType::BF16) == K4_KUT_BF16 && int(golden::DType::F32) == K4_KUT_F32 &&
                  int(golden::DType::I32) == K4_KUT_I32 && int(golden::DType::U8) == K4_KUT_U8 &&
                  int(golden::DType::E4M3) == K4_KUT_E4M3 && int(golden::DType::E8M0) == K4_KUT_E8M0 &&
                  int(golden::DType::E2M1X2) == K4_KUT_E2M1X2,
              "k4_kut_dtype follows golden::DType");

golden::RawTensor read(const golden::DumpReader& g, const std::string& path, golden::DType d) {
  golden::RawTensor t;
  std::string why;
  if (g.read(path, d, {}, t, why) != golden::TensorDiff::Status::Match) throw golden::FormatError(g.path() + ": " + path + ": " + why);
  return t;
}

int file_q_len(const std::string& path) {
  h5::File f(path, h5::File::Mode::ReadOnly);
  const h5::Group root = f.root();
  if (!root.exists("inputs")) return 1;
  const h5::Group g = root.open_group("inputs");
  return g.has_attr("q_len") && g.attr_kind("q_len") == "int" ? int(g.attr_int("q_len")) : 1;
}

std::string base_name(const std::string& p) {
  const size_t s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

}  // namespace

std::unique_ptr<Memory> host_memory() { return std::make_unique<HostMemory>(); }

// RTLD_NODELETE: a kernel library is never unmapped, not even by the dlclose below. What it
// started stays in its code until the process ends: the threads of its OpenMP pool (the
// libgomp.so.1 it brings; a program with the static libgomp.a, k4_device, holds no other
// reference to that one, so dlclose unmapped it under its threads, which were still spinning
// in it: SIGSEGV in k4_device after the last case, gpu-suite step 1c), the exit handlers of its
// own static CUDA / HIP runtime, anything a user's library registers. They end with the process,
// in the order exit() runs them, as for the libraries a program links. (Python's ctypes never
// unloads a library either.)
Library::Library(const std::string& path) : path_(path) {
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle_) throw std::invalid_argument("kernel library " + path + ": cannot be loaded (" + dlerror() + ")");
  auto get = reinterpret_cast<k4_kut_get_fn>(dlsym(handle_, "k4_kut_get"));
  if (!get) throw std::invalid_argument("kernel library " + path + ": exports no k4_kut_get (device/kut/k4_kut.h)");
  impl_ = get();
  if (!impl_) throw std::invalid_argument("kernel library " + path + ": k4_kut_get returned NULL");
  if (impl_->abi_version != K4_KUT_ABI_VERSION)
    throw std::invalid_argument("kernel library " + path + ": ABI version " + std::to_string(impl_->abi_version) + ", this harness is " +
                                std::to_string(K4_KUT_ABI_VERSION));
  if (!impl_->supports || !impl_->run_stage) throw std::invalid_argument("kernel library " + path + ": supports or run_stage is NULL");
}

Library::~Library() {
  if (handle_) dlclose(handle_);  // drops our reference; RTLD_NODELETE keeps the code mapped
}

std::string CaseResult::line() const {
  if (!error.empty()) return "ERROR " + name + ": " + error;
  if (ok) return "ok    " + name + " (" + std::to_string(tensors) + " tensors bit-exact)";
  return "FAIL  " + name + ": rank " + std::to_string(rank) + ", stage " + stage + ", tensor " + tensor + ", element " + element;
}

CaseResult run_case(const Library& lib, Memory& mem, const std::string& golden_path, const std::vector<std::string>& stages) {
  CaseResult res;
  res.name = base_name(golden_path);
  const golden::DumpReader g(golden_path, "golden");
  const std::string cfg_json = g.root_attr_string("config");
  const int tp = int(g.root_attr_int("tp")), tokens = int(g.root_attr_int("tokens")), q_len = file_q_len(golden_path);
  const Config cfg = golden::config_from_json(cfg_json, "golden " + golden_path);
  const k4_kut_impl& impl = lib.impl();
  for (const std::string& stage : golden::stage_names()) {
    if (!stages.empty() && std::find(stages.begin(), stages.end(), stage) == stages.end()) continue;
    if (!impl.supports(stage.c_str())) continue;
    for (int r = 0; r < tp; ++r) {
      const std::string pre = "/rank" + std::to_string(r) + "/" + stage;
      std::vector<Slot> ins, outs;
      ins.reserve(32), outs.reserve(32);
      for (const golden::TensorSpec& s : golden::tensor_specs()) {
        const std::string group = s.group;
        if (group == stage + "/inputs") {
          const std::string p = pre + "/inputs/" + s.name;
          if (!g.has_dataset(p)) continue;  // page_ids: the selected KV form only
          ins.emplace_back();
          ins.back().name = s.name;
          ins.back().raw = read(g, p, golden::spec_dtype(s, cfg));  // moe.experts = mxfp8: E4M3 w13 / w2
          describe(ins.back(), mem, true);
        } else if (group == stage + "/outputs" &&
                   !((stage == "oproj" && (std::string(s.name) == "a" || std::string(s.name) == "h_mid")) ||
                     (stage == "moe" && std::string(s.name) == "ar_out"))) {
          outs.emplace_back();
          outs.back().name = s.name;
          outs.back().raw = read(g, pre + "/outputs/" + s.name, golden::spec_dtype(s, cfg));
          describe(outs.back(), mem, false);
        }
      }
      std::vector<k4_kut_tensor> in_t, out_t;
      for (Slot& s : ins) in_t.push_back(s.t);
      for (Slot& s : outs) out_t.push_back(s.t);
      k4_kut_stage_call call{};
      call.stage = stage.c_str();
      call.rank = r, call.tp = tp, call.tokens = tokens, call.q_len = q_len;
      call.config_json = cfg_json.c_str();
      call.inputs = in_t.data(), call.n_inputs = int(in_t.size());
      call.outputs = out_t.data(), call.n_outputs = int(out_t.size());
      call.stream = mem.stream();
      char err[512] = "";
      if (impl.prepare && impl.prepare(&call, err, sizeof err) != 0) {
        res.ok = false, res.rank = r, res.stage = stage, res.error = "rank " + std::to_string(r) + " " + stage + ": prepare: " + err;
        return res;
      }
      const int rc = impl.run_stage(&call, err, sizeof err);
      if (impl.release && call.user) impl.release(call.user);
      if (rc != 0) {
        res.ok = false, res.rank = r, res.stage = stage;
        res.error = "rank " + std::to_string(r) + " " + stage + ": " + (err[0] ? err : "run_stage returned " + std::to_string(rc));
        return res;
      }
      for (Slot& s : outs) {
        std::vector<uint8_t> got(s.t.bytes);
        mem.to_host(got.data(), s.buf->p, got.size());
        golden::TensorDiff td;
        td.name = s.name;
        td.dtype = s.raw.dtype;
        td.dims = s.raw.dims;
        td.shape = s.raw.shape;
        td.elements = s.raw.elements();
        golden::diff_tensor(td, s.raw, from_bytes(s.raw, got), 1);
        if (td.mismatches == 0) {
          ++res.tensors;
          continue;
        }
        const golden::Mismatch& m = td.first.at(0);
        res.ok = false, res.rank = r, res.stage = stage, res.tensor = s.name;
        res.element = golden::index_text(m.index, s.raw.dims) + " (flat " + std::to_string(m.flat) + ")";
        res.detail = "golden " + golden::bits_hex(td.dtype, m.ref) + " " + golden::value_text(td.dtype, m.ref) + ", kernel " +
                     golden::bits_hex(td.dtype, m.got) + " " + golden::value_text(td.dtype, m.got) + ", " + m.dist.str() + "; " +
                     std::to_string(td.mismatches) + " of " + std::to_string(td.elements) + " elements differ";
        return res;
      }
    }
  }
  return res;
}

int run_cases(const std::string& tool, const Library& lib, Memory& mem, const std::string& memory,
              const std::vector<std::string>& goldens, const std::string& stages) {
  std::vector<std::string> st;
  std::stringstream ss(stages);
  for (std::string s; std::getline(ss, s, ',');)
    if (!s.empty()) st.push_back(s);
  std::printf("%s: %s (%s, %s), %zu cases\n", tool.c_str(), lib.impl().name, lib.path().c_str(), memory.c_str(), goldens.size());
  int failed = 0;
  for (const std::string& g : goldens) {
    const CaseResult r = run_case(lib, mem, g, st);
    std::printf("%s\n", r.line().c_str());
    if (!r.ok && r.error.empty()) std::printf("      %s\n", r.detail.c_str());
    std::fflush(stdout);
    failed += r.ok ? 0 : 1;
  }
  std::printf("%zu of %zu cases bit-exact\n", goldens.size() - size_t(failed), goldens.size());
  return failed ? 1 : 0;
}

}  // namespace k4::kut
