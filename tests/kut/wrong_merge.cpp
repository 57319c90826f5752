// wrong_merge.cpp -- a deliberately wrong kernel under test (libk4_kut_wrong_merge.so): the
// merge stage only, the reference's but for one realistic fault: the per-token scale is
// amax / 448 (a division) where the contract has amax * f32(1 / 448) (docs/numerics.md, the
// merge quant). The two differ by an ulp for some amax values; the suite must catch it with
// the case, rank, stage merge, tensor x_scale and token (tests: ctest kut_wrong_merge,
// python/tests/test_kut.py). Compiled with K4_KUT_ON_DEVICE it is libk4_kut_wrong_merge_device.so,
// the same fault as a K4_KUT_DEVICE library (k4_device run --kut in the GPU suite; ctest
// kut_wrong_merge_device on the emulation's device memory).
#include <cmath>
#include <cstring>

#include "device/kut/adapter.hpp"
#ifdef K4_KUT_ON_DEVICE
#include "device/kut/device_memory.hpp"
#endif

namespace {

int supports(const char* stage) { return std::strcmp(stage, "merge") == 0; }

int run_host(k4_kut_stage_call* c, char* error, size_t n) {
  const int rc = k4::kut::run_stage_with(k4::kut::reference_fns(), c, error, n);
  if (rc != 0) return rc;
  k4_kut_tensor *attn = nullptr, *xs = nullptr;
  for (int i = 0; i < c->n_outputs; ++i) {
    if (std::strcmp(c->outputs[i].name, "attn") == 0) attn = &c->outputs[i];
    if (std::strcmp(c->outputs[i].name, "x_scale") == 0) xs = &c->outputs[i];
  }
  const int S = int(attn->shape[0]), OK = int(attn->shape[1]);
  const uint16_t* a = static_cast<const uint16_t*>(attn->data);
  for (int k = 0; k < S; ++k) {
    float amax = 0.0f;
    for (int i = 0; i < OK; ++i) {
      uint32_t u = uint32_t(a[size_t(k) * OK + i] & 0x7FFFu) << 16;
      float v;
      std::memcpy(&v, &u, 4);
      amax = v > amax || std::isnan(v) ? v : amax;
    }
    const float wrong = amax / 448.0f;  // the fault
    std::memcpy(static_cast<float*>(xs->data) + k, &wrong, 4);
  }
  return 0;
}

#ifdef K4_KUT_ON_DEVICE
int run(k4_kut_stage_call* c, char* error, size_t n) { return k4::kut::run_host_stage_on_device(&run_host, c, error, n); }
const k4_kut_impl kImpl = {K4_KUT_ABI_VERSION, "wrong merge (x_scale = amax / 448), device memory", K4_KUT_DEVICE, &supports, &run,
                           nullptr, nullptr};
#else
const k4_kut_impl kImpl = {K4_KUT_ABI_VERSION, "wrong merge (x_scale = amax / 448)", K4_KUT_HOST, &supports, &run_host, nullptr, nullptr};
#endif

}  // namespace

extern "C" __attribute__((visibility("default"))) const k4_kut_impl* k4_kut_get(void) { return &kImpl; }
