// kv_pages.hpp -- the selected KV form read back. A golden stores a rank's caches whole, or
// (kv_form "selected") only the pages the sparse table names, with page_ids: stored page i is
// cache page page_ids[i] (golden/format/writer.cpp, docs/golden-format.md).
#pragma once
#include <cstdint>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"

namespace k4::golden {

// rk's caches of n_pages pages, stored page i at cache page ids[i], zero bytes where nothing was
// stored; the per-key scales the same way (zero where nothing was stored), or the one scale of
// a cache as stored (Config::one_kv_scale). k and v hold ids.size() pages, the per-key scales
// as many pages' worth. The golden reader, the kernel-under-test adapter
// (device/kut/named_stage.cpp) and k4.stage.split (python/src/stages.cpp) call it after checking
// the ids their own way; std::invalid_argument if an id is outside [0, n_pages) or a size does
// not match.
void expand_selected_kv(StepRank& rk, int n_pages, const std::vector<int32_t>& ids, const std::vector<uint8_t>& k,
                        const std::vector<uint8_t>& v, const std::vector<float>& ks, const std::vector<float>& vs,
                        const Config& cfg);

}  // namespace k4::golden
