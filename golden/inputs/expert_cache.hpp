// expert_cache.hpp -- the most recent experts an ExpertSource built, by (rank, expert), shared
// between threads: the cache of the synthetic, checkpoint, golden and weights-file sources, so
// that an unrouted expert is never materialized and a routed one is built once while it stays.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "reference/weights.hpp"

namespace k4 {

class ExpertCache {
 public:
  explicit ExpertCache(size_t capacity) : capacity_(capacity) {}

  // The cached expert (rank, e), else build()'s, kept (the oldest dropped past the capacity).
  // build runs outside the cache's lock, so ranks build in parallel (a source whose reads need
  // a lock takes it in build); of two threads building one expert at once, the first one kept
  // is returned to both.
  template <class Build>
  std::shared_ptr<const ExpertWeights> get(int rank, int e, Build&& build) const {
    const Key key{rank, e};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto hit = find(key)) return hit;
    }
    std::shared_ptr<const ExpertWeights> ew = build();
    std::lock_guard<std::mutex> lock(mu_);
    if (auto hit = find(key)) return hit;
    if (entries_.size() >= capacity_) entries_.erase(entries_.begin());
    entries_.push_back({key, ew});
    return ew;
  }

 private:
  using Key = std::pair<int, int>;
  std::shared_ptr<const ExpertWeights> find(const Key& key) const {
    for (const auto& kv : entries_)
      if (kv.first == key) return kv.second;
    return nullptr;
  }
  size_t capacity_;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<Key, std::shared_ptr<const ExpertWeights>>> entries_;
};

}  // namespace k4
