// resident_thread.cpp -- a kernel under test that leaves a thread running in its own code
// (libk4_kut_resident_thread.so), as an OpenMP pool does: the merge stage, the reference's
// (every case bit-exact), and on its first call a detached thread that ticks in this library
// until the process ends. The harness must not unmap such a library when it is done with it
// (kut::Library's RTLD_NODELETE): the thread would run on into unmapped code. That was the
// SIGSEGV of k4_device run --kut with the wrong merge on the H200, whose reference merge left
// the threads of the libgomp.so.1 that the library brings, the only reference to it in a
// program with the static libgomp.a. Test: ctest kut_library_stays_loaded (tests/kut/unload_check.cpp).
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "device/kut/adapter.hpp"

namespace {

std::atomic<long> g_ticks{0};

int supports(const char* stage) { return std::strcmp(stage, "merge") == 0; }

int run(k4_kut_stage_call* c, char* error, size_t n) {
  static const bool started = [] {
    std::thread([] {
      for (;;) {  // this loop's code is the library's
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        g_ticks.fetch_add(1, std::memory_order_relaxed);
      }
    }).detach();
    return true;
  }();
  (void)started;
  return k4::kut::run_stage_with(k4::kut::reference_fns(), c, error, n);
}

const k4_kut_impl kImpl = {K4_KUT_ABI_VERSION, "reference merge with a resident thread", K4_KUT_HOST, &supports, &run, nullptr, nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) const k4_kut_impl* k4_kut_get(void) { return &kImpl; }
