// serving_layout.cpp -- the serving stacks' layouts as index maps (serving_layout.hpp).
#include "golden/format/serving_layout.hpp"

#include <stdexcept>

namespace k4::golden::layout {
namespace {

constexpr size_t kPageKeys = 16;

void need(bool ok, const std::string& what, const std::string& why) {
  if (!ok) throw std::invalid_argument(what + ": " + why);
}

void check_weight(size_t N, size_t Kb, const std::string& what) {
  need(N > 0 && N % 16 == 0 && Kb > 0 && Kb % 32 == 0, what,
       "shuffle_weight(16, 16) needs rows a multiple of 16 and row bytes a multiple of 32, got [" + std::to_string(N) + "][" +
           std::to_string(Kb) + "]");
}
void check_scale(size_t R, size_t C, const std::string& what) {
  need(R > 0 && R % 32 == 0 && C > 0 && C % 8 == 0, what,
       "shuffle_scale needs rows a multiple of 32 and columns a multiple of 8, got [" + std::to_string(R) + "][" + std::to_string(C) + "]");
}
void check_page(size_t D, const std::string& what) {
  need(D > 0 && D % 16 == 0, what, "the page-16 layout needs head_dim a multiple of 16, got " + std::to_string(D));
}

// The maps, unchecked (the public functions check the shape once).
size_t weight_at(size_t n, size_t kb, size_t Kb) { return ((((n / 16) * (Kb / 32) + kb / 32) * 2 + (kb / 16) % 2) * 16 + n % 16) * 16 + kb % 16; }
size_t scale_at(size_t r, size_t c, size_t C) {
  return (((((r / 32) * (C / 8) + c / 8) * 4 + c % 4) * 16 + r % 16) * 2 + (c / 4) % 2) * 2 + (r / 16) % 2;
}
size_t k_at(size_t t, size_t d) { return (d / 16) * 256 + 16 * t + d % 16; }
size_t v_at(size_t t, size_t d) { return 16 * d + t; }

void need_inside(size_t i, size_t j, size_t rows, size_t cols, const char* what) {
  if (i >= rows || j >= cols)
    throw std::invalid_argument(std::string(what) + ": (" + std::to_string(i) + ", " + std::to_string(j) + ") is outside [" +
                                std::to_string(rows) + "][" + std::to_string(cols) + "]");
}

// Applies a per-matrix map to every matrix of `in`: out[map(i)] = in[i] (forward) or
// out[i] = in[map(i)] (inverse).
template <class Map>
std::vector<uint8_t> permute(const std::vector<uint8_t>& in, size_t rows, size_t cols, Map map, bool inverse, const std::string& what) {
  const size_t per = rows * cols;
  need(in.size() % per == 0, what, std::to_string(in.size()) + " bytes are not whole [" + std::to_string(rows) + "][" + std::to_string(cols) + "] matrices");
  std::vector<uint8_t> out(in.size());
  for (size_t base = 0; base < in.size(); base += per)
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) {
        const size_t logical = base + r * cols + c, served = base + map(r, c);
        if (inverse) out[logical] = in[served];
        else out[served] = in[logical];
      }
  return out;
}

}  // namespace

size_t shuffle_weight_index(size_t n, size_t kb, size_t N, size_t Kb) {
  check_weight(N, Kb, "shuffle_weight_index");
  need_inside(n, kb, N, Kb, "shuffle_weight_index");
  return weight_at(n, kb, Kb);
}

size_t shuffle_scale_index(size_t r, size_t c, size_t R, size_t C) {
  check_scale(R, C, "shuffle_scale_index");
  need_inside(r, c, R, C, "shuffle_scale_index");
  return scale_at(r, c, C);
}

size_t kv_page_k_index(size_t t, size_t d, size_t D) {
  check_page(D, "kv_page_k_index");
  need_inside(t, d, kPageKeys, D, "kv_page_k_index");
  return k_at(t, d);
}

size_t kv_page_v_index(size_t t, size_t d, size_t D) {
  check_page(D, "kv_page_v_index");
  need_inside(t, d, kPageKeys, D, "kv_page_v_index");
  return v_at(t, d);
}

namespace {

// The whole-tensor functions: the shape checked once, then the map over every matrix (page).
std::vector<uint8_t> weights(const std::vector<uint8_t>& in, size_t N, size_t Kb, bool inverse, const std::string& what) {
  check_weight(N, Kb, what);
  return permute(in, N, Kb, [&](size_t n, size_t kb) { return weight_at(n, kb, Kb); }, inverse, what);
}
std::vector<uint8_t> scales(const std::vector<uint8_t>& in, size_t R, size_t C, bool inverse, const std::string& what) {
  check_scale(R, C, what);
  return permute(in, R, C, [&](size_t r, size_t c) { return scale_at(r, c, C); }, inverse, what);
}
std::vector<uint8_t> pages(const std::vector<uint8_t>& in, size_t D, bool v, bool inverse, const std::string& what) {
  check_page(D, what);
  return permute(in, kPageKeys, D, [&](size_t t, size_t d) { return v ? v_at(t, d) : k_at(t, d); }, inverse, what);
}

}  // namespace

std::vector<uint8_t> shuffle_weight(const std::vector<uint8_t>& in, size_t N, size_t Kb, const std::string& what) { return weights(in, N, Kb, false, what); }
std::vector<uint8_t> unshuffle_weight(const std::vector<uint8_t>& in, size_t N, size_t Kb, const std::string& what) { return weights(in, N, Kb, true, what); }
std::vector<uint8_t> shuffle_scale(const std::vector<uint8_t>& in, size_t R, size_t C, const std::string& what) { return scales(in, R, C, false, what); }
std::vector<uint8_t> unshuffle_scale(const std::vector<uint8_t>& in, size_t R, size_t C, const std::string& what) { return scales(in, R, C, true, what); }
std::vector<uint8_t> kv_to_pages(const std::vector<uint8_t>& in, size_t D, bool v, const std::string& what) { return pages(in, D, v, false, what); }
std::vector<uint8_t> kv_from_pages(const std::vector<uint8_t>& in, size_t D, bool v, const std::string& what) { return pages(in, D, v, true, what); }

}  // namespace k4::golden::layout
