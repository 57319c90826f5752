// layout.cpp -- k4.layout: the serving stacks' layouts of K4's buffers and their inverses
// (golden/format/serving_layout.hpp, ../shared/design/VARIANTS.md 8.5) on numpy uint8 arrays,
// for k4.Weights.from_tensors users whose buffers are shuffled. The maps are the library's;
// this file moves bytes between numpy and it.
#include <pybind11/numpy.h>

#include <cstring>

#include "golden/format/serving_layout.hpp"
#include "python/src/bind.hpp"

namespace k4::py {
namespace {

namespace L = golden::layout;

std::vector<size_t> shape_of(const pyb::array& a) {
  std::vector<size_t> s;
  for (pyb::ssize_t i = 0; i < a.ndim(); ++i) s.push_back(size_t(a.shape(i)));
  return s;
}

pyb::array_t<uint8_t> array_of(const std::vector<uint8_t>& b, const std::vector<size_t>& shape) {
  pyb::array_t<uint8_t> out(shape);
  if (!b.empty()) std::memcpy(out.mutable_data(), b.data(), b.size());
  return out;
}

// [..., N, Kb] uint8: each trailing matrix through `f`.
pyb::array_t<uint8_t> weight(const pyb::array& a, const std::string& what, bool inverse) {
  const std::vector<size_t> s = shape_of(a);
  if (s.size() < 2) throw std::invalid_argument(what + ": a [..., rows, row_bytes] uint8 array is expected, got " + std::to_string(s.size()) + " dimensions");
  const std::vector<uint8_t> b = bits_of(a, DType::U8, what);
  const size_t N = s[s.size() - 2], Kb = s.back();
  return array_of(inverse ? L::unshuffle_weight(b, N, Kb, what) : L::shuffle_weight(b, N, Kb, what), s);
}

// [R, C] or [experts, rows, C] uint8 (one [experts * rows, C] matrix).
pyb::array_t<uint8_t> scale(const pyb::array& a, const std::string& what, bool inverse) {
  const std::vector<size_t> s = shape_of(a);
  if (s.size() < 2) throw std::invalid_argument(what + ": a [..., rows, blocks] uint8 array is expected, got " + std::to_string(s.size()) + " dimensions");
  const std::vector<uint8_t> b = bits_of(a, DType::U8, what);
  const size_t C = s.back(), R = C ? b.size() / C : 0;
  return array_of(inverse ? L::unshuffle_scale(b, R, C, what) : L::shuffle_scale(b, R, C, what), s);
}

}  // namespace

void bind_layout(pyb::module_& m) {
  pyb::module_ l = m.def_submodule("layout", "the serving stacks' layouts of K4's buffers and their exact inverses (docs/python.md)");
  l.def("shuffle_weight_index", &L::shuffle_weight_index, pyb::arg("n"), pyb::arg("kb"), pyb::arg("rows"), pyb::arg("row_bytes"),
        "aiter shuffle_weight(16, 16): the offset of logical byte (n, kb) of a [rows][row_bytes] matrix");
  l.def("shuffle_scale_index", &L::shuffle_scale_index, pyb::arg("r"), pyb::arg("c"), pyb::arg("rows"), pyb::arg("cols"),
        "aiter shuffle_scale: the offset of logical scale byte (r, c) of a [rows][cols] matrix");
  l.def("kv_page_k_index", &L::kv_page_k_index, pyb::arg("t"), pyb::arg("d"), pyb::arg("head_dim"),
        "the page-16 layout: the page byte of key t's K byte d");
  l.def("kv_page_v_index", &L::kv_page_v_index, pyb::arg("t"), pyb::arg("d"), pyb::arg("head_dim"),
        "the page-16 layout: the page byte of key t's V byte d");
  l.def("unshuffle_weight", [](const pyb::array& a, const std::string& name) { return weight(a, name, true); }, pyb::arg("shuffled"),
        pyb::arg("name") = "weight", "[..., rows, row_bytes] uint8 in aiter's shuffle_weight(16, 16) order -> the logical row-major bytes");
  l.def("shuffle_weight", [](const pyb::array& a, const std::string& name) { return weight(a, name, false); }, pyb::arg("logical"),
        pyb::arg("name") = "weight", "the inverse of unshuffle_weight");
  l.def("unshuffle_scale", [](const pyb::array& a, const std::string& name) { return scale(a, name, true); }, pyb::arg("shuffled"),
        pyb::arg("name") = "scale", "E8M0 scales [..., blocks] (one [experts * rows, blocks] matrix) in aiter's shuffle_scale order -> logical");
  l.def("shuffle_scale", [](const pyb::array& a, const std::string& name) { return scale(a, name, false); }, pyb::arg("logical"),
        pyb::arg("name") = "scale", "the inverse of unshuffle_scale");
  l.def(
      "kv_to_pages",
      [](const pyb::array& a, bool v, const std::string& name) {
        const std::vector<size_t> s = shape_of(a);
        if (s.size() != 3 || s[1] != 16) throw std::invalid_argument(name + ": a [pages, 16, head_dim] uint8 array is expected");
        return array_of(L::kv_to_pages(bits_of(a, DType::U8, name), s[2], v, name), {s[0], 16 * s[2]});
      },
      pyb::arg("logical"), pyb::arg("v") = false, pyb::arg("name") = "kv",
      "logical pages [pages, 16 keys, head_dim] -> the golden's k_cache (v=False) or v_cache (v=True) [pages, page_byte]");
  l.def(
      "kv_from_pages",
      [](const pyb::array& a, size_t head_dim, bool v, const std::string& name) {
        const std::vector<size_t> s = shape_of(a);
        if (s.size() != 2 || s[1] != 16 * head_dim) throw std::invalid_argument(name + ": a [pages, 16 * head_dim] uint8 array is expected");
        return array_of(L::kv_from_pages(bits_of(a, DType::U8, name), head_dim, v, name), {s[0], 16, head_dim});
      },
      pyb::arg("pages"), pyb::arg("head_dim"), pyb::arg("v") = false, pyb::arg("name") = "kv", "the inverse of kv_to_pages");
}

}  // namespace k4::py
