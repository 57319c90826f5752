// tensors.cpp -- tensors between numpy and the C++ libraries: storage dtypes, the refusal of
// a float array where bits are expected, schema paths, decoding to float32 (the decoders of
// reference/numerics through golden/diff's value_of).
#include <cstring>

#include "python/src/bind.hpp"
#include "reference/numerics/e2m1.hpp"

namespace k4::py {

std::mutex& hdf5_lock() {
  static std::mutex m;
  return m;
}

void throw_if_crashed(const guard::Probe& p) {
  if (p.kind == guard::Probe::Kind::Corrupt) throw golden::FormatError(p.message);
  if (p.kind == guard::Probe::Kind::Crashed) throw std::runtime_error(p.message);
}

pyb::dtype storage_dtype(DType d) {
  switch (golden::stored_elem(d)) {
    case h5::Elem::U8: return pyb::dtype::of<uint8_t>();
    case h5::Elem::U16: return pyb::dtype::of<uint16_t>();
    case h5::Elem::I32: return pyb::dtype::of<int32_t>();
    case h5::Elem::U32: return pyb::dtype::of<uint32_t>();
  }
  return pyb::dtype::of<uint8_t>();
}

DType dtype_named(const std::string& name) {
  DType d;
  if (!golden::dtype_from_name(name, d))
    throw std::invalid_argument("dtype '" + name + "' is none of bf16, f32, i32, u8, e4m3, e8m0, e2m1x2");
  return d;
}

pyb::tuple to_python(const TensorData& t) {
  std::vector<pyb::ssize_t> shape(t.shape.begin(), t.shape.end());
  pyb::array a(storage_dtype(t.dtype), shape);
  if (size_t(a.nbytes()) != t.bytes.size()) throw std::logic_error("k4: tensor bytes do not fill its shape");
  if (!t.bytes.empty()) std::memcpy(a.mutable_data(), t.bytes.data(), t.bytes.size());
  pyb::list dims;
  for (const std::string& d : golden::split_dims(t.dims)) dims.append(d);
  return pyb::make_tuple(a, golden::dtype_name(t.dtype), dims);
}

std::vector<uint8_t> bits_of(const pyb::array& a, DType want, const std::string& what) {
  const pyb::dtype st = storage_dtype(want);
  if (!a.dtype().is(st) && !(a.dtype().kind() == st.kind() && a.dtype().itemsize() == st.itemsize()))
    throw std::invalid_argument(what + ": " + golden::dtype_name(want) + " is stored as " +
                                st.attr("name").cast<std::string>() + " bits, got a " + a.dtype().attr("name").cast<std::string>() +
                                " array (give the bits: values are never rounded here)");
  if (!(a.flags() & pyb::array::c_style)) throw std::invalid_argument(what + ": the array is not C-contiguous");
  std::vector<uint8_t> out(size_t(a.nbytes()));
  if (!out.empty()) std::memcpy(out.data(), a.data(), out.size());
  return out;
}

const golden::TensorSpec& spec_of(const std::string& path, int& rank, std::string& canonical) {
  std::string p = path;
  if (!p.empty() && p[0] == '/') p = p.substr(1);
  rank = -1;
  std::string group, name;
  const size_t last = p.rfind('/');
  if (last == std::string::npos) throw std::invalid_argument("'" + path + "' is not a schema path (/inputs/NAME or rankR/STAGE/inputs|outputs/NAME)");
  name = p.substr(last + 1);
  std::string head = p.substr(0, last);
  if (head == "inputs") {
    group = "/inputs";
    canonical = "/inputs/" + name;
  } else {
    const size_t s = head.find('/');
    const std::string r = head.substr(0, s);
    bool ok = s != std::string::npos && r.size() > 4 && r.compare(0, 4, "rank") == 0 &&
              r.find_first_not_of("0123456789", 4) == std::string::npos && r.size() < 10;
    if (!ok) throw std::invalid_argument("'" + path + "' is not a schema path (/inputs/NAME or rankR/STAGE/inputs|outputs/NAME)");
    rank = std::stoi(r.substr(4));
    group = head.substr(s + 1);
    canonical = "/" + head + "/" + name;
  }
  for (const golden::TensorSpec& t : golden::tensor_specs())
    if (group == t.group && name == t.name) return t;
  throw std::invalid_argument("'" + path + "': the schema has no tensor " + group + "/" + name +
                              " (docs/golden-format.md lists them)");
}

namespace {

// The values of bits as float32: e2m1x2 bytes give two values each (the even element first).
pyb::array_t<float> decode(const pyb::array& a, const std::string& dtype_name) {
  const DType d = dtype_named(dtype_name);
  const std::vector<uint8_t> b = bits_of(a, d, "decode");
  std::vector<pyb::ssize_t> shape(a.shape(), a.shape() + a.ndim());
  const size_t w = golden::dtype_bytes(d);
  const size_t n = b.size() / w;
  const bool pairs = d == DType::E2M1X2;
  if (pairs) {
    if (shape.empty()) shape.push_back(1);
    shape.back() *= 2;
  }
  pyb::array_t<float> out(shape);
  float* o = out.mutable_data();
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, b.data() + i * w, w);  // little-endian hosts: the low bytes
    if (pairs) {
      o[2 * i] = e2m1_to_f32(fp4_lo(uint8_t(bits)));
      o[2 * i + 1] = e2m1_to_f32(fp4_hi(uint8_t(bits)));
    } else {
      o[i] = float(golden::value_of(d, bits));
    }
  }
  return out;
}

}  // namespace

void bind_tensors(pyb::module_& m) {
  m.def("decode", &decode, pyb::arg("bits"), pyb::arg("dtype"),
        "The values of stored bits as float32 (e2m1x2: two values a byte, the last dimension doubled).");
  m.def("storage_dtype", [](const std::string& d) { return storage_dtype(dtype_named(d)); }, pyb::arg("dtype"),
        "The numpy dtype that holds a schema dtype's bits.");
  m.def("dtypes", [] {
    std::vector<std::string> v;
    for (DType d : {DType::BF16, DType::F32, DType::I32, DType::U8, DType::E4M3, DType::E8M0, DType::E2M1X2})
      v.push_back(golden::dtype_name(d));
    return v;
  });
  m.def("schema", [] {
    pyb::list rows;
    for (const golden::TensorSpec& s : golden::tensor_specs()) {
      pyb::dict r;
      r["group"] = s.group;
      r["name"] = s.name;
      r["dtype"] = golden::dtype_name(s.dtype);
      r["dims"] = s.dims;
      r["link"] = s.link;
      r["meaning"] = s.meaning;
      rows.append(r);
    }
    return rows;
  }, "The schema table (golden/format/schema.cpp): group, name, dtype, dims, link, meaning a row.");
  m.def("stage_names", [] { return golden::stage_names(); });
  m.def("dim_sizes", [](const Config& cfg, int tokens, const std::string& dims, int used_experts, int pages, int bt_width,
                        int score_width) {
    golden::DimSizes d;
    d.cfg = cfg;
    d.tokens = tokens;
    d.used_experts = used_experts;
    d.pages = pages;
    d.bt_width = bt_width;
    d.score_width = score_width;
    return d.shape(dims.c_str());
  }, pyb::arg("config"), pyb::arg("tokens"), pyb::arg("dims"), pyb::arg("used_experts") = 0, pyb::arg("pages") = 0,
     pyb::arg("bt_width") = 0, pyb::arg("score_width") = 0, "The shape of the schema's named dims (golden::DimSizes).");
  m.def("spec", [](const std::string& path) {
    int rank = -1;
    std::string canon;
    const golden::TensorSpec& s = spec_of(path, rank, canon);
    pyb::dict r;
    r["path"] = canon;
    r["rank"] = rank;
    r["group"] = s.group;
    r["name"] = s.name;
    r["dtype"] = golden::dtype_name(s.dtype);
    r["dims"] = s.dims;
    r["link"] = s.link;
    return r;
  }, pyb::arg("path"));
}

}  // namespace k4::py
