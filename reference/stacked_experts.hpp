// stacked_experts.hpp -- the experts of one rank given as the golden's stacked moe/inputs
// tensors, served by id: what runs the moe stage on named tensors (k4.stage.moe in Python,
// the kernel-under-test harness) hands to experts_up_gate / experts_down.
//
// w13 .. s2 hold one equal slab per entry of expert_ids, in that order; under moe.shared_fp8
// (V6.1) the MXFP8 shared expert is not a slab of the stacks but has tables of its own,
// sh_w13 .. sh_s2, as the golden stores it (docs/golden-format.md).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "reference/weights.hpp"

namespace k4 {

class StackedExperts : public ExpertSource {
 public:
  // take(name) -> std::vector<uint8_t>: the named input ("w13", ..., "sh_s2"); who names the
  // caller in the error for an expert that is routed to but not given
  template <class Take>
  StackedExperts(const Config& cfg, const std::vector<int32_t>& ids, Take take, std::string who) : who_(std::move(who)) {
    const std::vector<uint8_t> w13 = take("w13"), s13 = take("s13"), w2 = take("w2"), s2 = take("s2");
    const size_t n = ids.size();
    auto slab = [n](const std::vector<uint8_t>& all, size_t i) {
      const size_t per = all.size() / n;
      return std::vector<uint8_t>(all.begin() + long(i * per), all.begin() + long((i + 1) * per));
    };
    for (size_t i = 0; i < n; ++i) {
      auto e = std::make_shared<ExpertWeights>();
      e->w13 = slab(w13, i), e->s13 = slab(s13, i), e->w2 = slab(w2, i), e->s2 = slab(s2, i);
      by_id_[ids[i]] = std::move(e);
    }
    if (cfg.variant.shared_fp8) {
      auto e = std::make_shared<ExpertWeights>();
      e->w13 = take("sh_w13"), e->s13 = take("sh_s13"), e->w2 = take("sh_w2"), e->s2 = take("sh_s2");
      by_id_[cfg.shared_expert()] = std::move(e);
    }
  }

  std::shared_ptr<const ExpertWeights> expert(int, int e) const override {
    auto it = by_id_.find(e);
    if (it == by_id_.end()) throw std::invalid_argument(who_ + ": expert " + std::to_string(e) + " is routed to but not in expert_ids");
    return it->second;
  }

 private:
  std::string who_;
  std::map<int, std::shared_ptr<const ExpertWeights>> by_id_;
};

}  // namespace k4
