// compare.hpp -- bit comparison of device results with host results, for the GPU suites.
//
// compare_bits(dev, n, base, mode, host) runs host(j) for every j < n on the host (OpenMP)
// and compares its bits with dev[j]: it counts mismatches and keeps the first few (lowest
// index), which report() prints as hex bits on both sides, decoded values and the ULP
// distance. Results of several chunks merge() in chunk order.
//
// Mode::Bits compares every bit. Mode::F32NanEqual treats the words as f32 and any two NaNs
// as equal (counted apart as nan_payload_diffs): a NaN's payload is no contract until
// canon_nan stores it (policy.hpp). A NaN against a non-NaN is a mismatch in both modes.
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace k4::gputest {

enum class Mode { Bits, F32NanEqual };

struct Mismatch {
  uint64_t index;   // global index (base + j)
  uint32_t device;
  uint32_t host;
};

// f32 classes of the device results: the "can this test fail" evidence (an all-zero output
// proves nothing).
struct Classes {
  uint64_t zero = 0, subnormal = 0, normal = 0, inf = 0, nan = 0;
  void merge(const Classes& o) { zero += o.zero; subnormal += o.subnormal; normal += o.normal; inf += o.inf; nan += o.nan; }
};

struct CompareResult {
  uint64_t checked = 0;
  uint64_t mismatches = 0;
  uint64_t nan_payload_diffs = 0;  // both NaN, different bits (F32NanEqual only)
  uint64_t nonzero = 0;            // device words != 0
  bool varied = false;             // the device words are not all the same
  uint32_t first_word = 0;         // the device word of the first element checked
  Classes classes;                 // of the device words read as f32
  std::vector<Mismatch> first;     // the lowest-index mismatches, at most keep

  void merge(const CompareResult& o, size_t keep = 8) {
    if (o.checked > 0) {
      if (checked == 0) first_word = o.first_word;
      else varied = varied || o.first_word != first_word;
    }
    varied = varied || o.varied;
    checked += o.checked;
    mismatches += o.mismatches;
    nan_payload_diffs += o.nan_payload_diffs;
    nonzero += o.nonzero;
    classes.merge(o.classes);
    first.insert(first.end(), o.first.begin(), o.first.end());
    std::sort(first.begin(), first.end(), [](const Mismatch& a, const Mismatch& b) { return a.index < b.index; });
    if (first.size() > keep) first.resize(keep);
  }
};

inline bool f32_bits_nan(uint32_t b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }

// Distance in units in the last place between two f32 bit patterns (ordered as integers:
// -0 and +0 are one apart). For NaNs it is meaningless and reported as such.
inline uint64_t ulp_distance(uint32_t a, uint32_t b) {
  auto ord = [](uint32_t x) -> int64_t {
    return (x & 0x80000000u) ? -int64_t(x & 0x7FFFFFFFu) - 1 : int64_t(x);
  };
  const int64_t d = ord(a) - ord(b);
  return uint64_t(d < 0 ? -d : d);
}

// host(j) -> the expected word of element j (0 <= j < n); called from OpenMP threads.
template <class HostFn>
CompareResult compare_bits(const uint32_t* dev, size_t n, uint64_t base, Mode mode, const HostFn& host,
                           size_t keep = 8) {
  CompareResult total;
  if (n == 0) return total;
  const uint32_t w0 = dev[0];
#pragma omp parallel
  {
    CompareResult local;
    uint64_t cls[5] = {0, 0, 0, 0, 0};  // zero, subnormal, normal, inf, nan
    uint64_t nonzero = 0;
    bool varied = false;
#pragma omp for schedule(static) nowait
    for (int64_t sj = 0; sj < int64_t(n); ++sj) {
      const size_t j = size_t(sj);
      const uint32_t d = dev[j];
      const uint32_t h = host(j);
      const uint32_t e = (d >> 23) & 0xFFu;
      const bool m0 = (d & 0x7FFFFFu) == 0;
      ++cls[e == 0 ? (m0 ? 0 : 1) : (e == 0xFFu ? (m0 ? 3 : 4) : 2)];
      nonzero += d != 0;
      varied |= d != w0;
      if (d == h) continue;
      if (mode == Mode::F32NanEqual && f32_bits_nan(d) && f32_bits_nan(h)) {
        ++local.nan_payload_diffs;
        continue;
      }
      ++local.mismatches;
      if (local.first.size() < keep) local.first.push_back(Mismatch{base + j, d, h});
    }
    local.classes = Classes{cls[0], cls[1], cls[2], cls[3], cls[4]};
    local.nonzero = nonzero;
    local.varied = varied;
#pragma omp critical(k4_compare_merge)
    total.merge(local, keep);  // local.checked is 0: counts and mismatches only
  }
  total.checked = n;
  total.first_word = w0;
  return total;
}

inline std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

inline std::string f32_text(uint32_t b) {
  float f;
  __builtin_memcpy(&f, &b, 4);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", double(f));
  return buf;
}

// describe(index) -> the input of that element, for the report (e.g. "x=0x3f800000 (1)").
inline std::string report(const std::string& what, const CompareResult& r, Mode mode,
                          const std::function<std::string(uint64_t)>& describe) {
  std::string s = what + ": " + std::to_string(r.checked) + " checked, " + std::to_string(r.mismatches) +
                  " mismatches";
  if (mode == Mode::F32NanEqual) s += ", " + std::to_string(r.nan_payload_diffs) + " NaN-payload-only differences";
  s += "; device results: " + std::to_string(r.nonzero) + " nonzero";
  if (mode == Mode::F32NanEqual) {
    const Classes& c = r.classes;
    s += " (f32: " + std::to_string(c.zero) + " zero, " + std::to_string(c.subnormal) + " subnormal, " +
         std::to_string(c.normal) + " normal, " + std::to_string(c.inf) + " inf, " + std::to_string(c.nan) + " nan)";
  }
  s += "\n";
  for (const Mismatch& m : r.first) {
    s += "  [" + std::to_string(m.index) + "] " + describe(m.index) + ": device " + hex32(m.device) + " host " +
         hex32(m.host);
    if (mode == Mode::F32NanEqual) {
      s += " (" + f32_text(m.device) + " vs " + f32_text(m.host) + ", ";
      s += (f32_bits_nan(m.device) || f32_bits_nan(m.host)) ? std::string("NaN") : std::to_string(ulp_distance(m.device, m.host)) + " ulp";
      s += ")";
    } else {
      s += " (xor " + hex32(m.device ^ m.host) + ")";
    }
    s += "\n";
  }
  if (r.mismatches > r.first.size()) s += "  ... " + std::to_string(r.mismatches - r.first.size()) + " more\n";
  return s;
}

}  // namespace k4::gputest
