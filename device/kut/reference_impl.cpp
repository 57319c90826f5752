// reference_impl.cpp -- the reference model's stages as a kernel-under-test library
// (libk4_kut_reference.so): the harness's self-check (it must pass every case).
#include "device/kut/adapter.hpp"

namespace {

int supports(const char*) { return 1; }
int run(k4_kut_stage_call* call, char* error, size_t n) {
  return k4::kut::run_stage_with(k4::kut::reference_fns(), call, error, n);
}

const k4_kut_impl kImpl = {K4_KUT_ABI_VERSION, "k4 reference model", K4_KUT_HOST, &supports, &run, nullptr, nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) const k4_kut_impl* k4_kut_get(void) { return &kImpl; }
