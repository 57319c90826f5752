// kv_pages.cpp -- the selected KV form read back (kv_pages.hpp).
#include "golden/format/kv_pages.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace k4::golden {

void expand_selected_kv(StepRank& rk, int n_pages, const std::vector<int32_t>& ids, const std::vector<uint8_t>& k,
                        const std::vector<uint8_t>& v, const std::vector<float>& ks, const std::vector<float>& vs,
                        const Config& cfg) {
  const size_t pb = size_t(cfg.page) * cfg.head_dim, n = ids.size();
  const size_t per = cfg.one_kv_scale() ? 0 : size_t(cfg.page);  // scales a page
  if (n_pages < 0 || k.size() != n * pb || v.size() != n * pb || (per && (ks.size() != n * per || vs.size() != n * per)))
    throw std::invalid_argument("selected KV pages: " + std::to_string(n) + " page ids for " + std::to_string(k.size()) + " / " +
                                std::to_string(v.size()) + " K / V bytes and " + std::to_string(ks.size()) + " / " +
                                std::to_string(vs.size()) + " scales (" + std::to_string(pb) + " bytes and " + std::to_string(per) +
                                " scales a page)");
  rk.n_pages = n_pages;
  rk.k_cache.assign(size_t(n_pages) * pb, 0);
  rk.v_cache.assign(size_t(n_pages) * pb, 0);
  if (per) {
    rk.k_scale.assign(size_t(n_pages) * per, 0.0f);
    rk.v_scale.assign(size_t(n_pages) * per, 0.0f);
  } else {
    rk.k_scale = ks;
    rk.v_scale = vs;
  }
  for (size_t i = 0; i < n; ++i) {
    const int32_t p = ids[i];
    if (p < 0 || p >= n_pages)
      throw std::invalid_argument("selected KV pages: page id " + std::to_string(p) + " (stored page " + std::to_string(i) +
                                  ") is outside the cache of " + std::to_string(n_pages) + " pages");
    std::memcpy(&rk.k_cache[size_t(p) * pb], &k[i * pb], pb);
    std::memcpy(&rk.v_cache[size_t(p) * pb], &v[i * pb], pb);
    if (per) {
      std::memcpy(&rk.k_scale[size_t(p) * per], &ks[i * per], per * sizeof(float));
      std::memcpy(&rk.v_scale[size_t(p) * per], &vs[i * per], per * sizeof(float));
    }
  }
}

}  // namespace k4::golden
