// unload_check.cpp -- k4_kut_unload_check LIB GOLDEN...: the harness's cases of LIB (as k4_kut
// run), then, with the kut::Library gone, 300 ms for what LIB left running (a thread in its
// code: tests/kut/resident_thread.cpp) before the exit. Exit 0 when every case was bit-exact
// and LIB is still loaded; a harness that unmapped LIB dies of SIGSEGV in the wait (the
// k4_device run --kut defect of gpu-suite step 1c). ctest kut_library_stays_loaded.
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "device/kut/harness.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: k4_kut_unload_check LIB GOLDEN...\n");
    return 2;
  }
  const std::string lib = argv[1];
  int rc = 0;
  try {
    const k4::kut::Library L(lib);
    auto mem = k4::kut::host_memory();
    rc = k4::kut::run_cases("k4_kut_unload_check", L, *mem, "host memory", std::vector<std::string>(argv + 2, argv + argc), "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k4_kut_unload_check: %s\n", e.what());
    return 2;
  }
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!h) {
    std::printf("the library was unloaded with the kut::Library\n");
    return 1;
  }
  dlclose(h);
  std::printf("the library stays loaded after the kut::Library (its thread ran on for 300 ms)\n");
  return rc;
}
