// adapter.hpp -- a k4_kut.h library made of functions with the reference stages' signatures:
// the host-memory call's named tensors to and from run_named_stage (named_stage.hpp).
#pragma once
#include <cstddef>

#include "device/kut/k4_kut.h"
#include "device/kut/named_stage.hpp"

namespace k4::kut {

// run_stage of a K4_KUT_HOST library over `fns`: 0 ok; else the message in `error`.
int run_stage_with(const StageFns& fns, k4_kut_stage_call* call, char* error, size_t error_size);

}  // namespace k4::kut
