// main.cpp -- the doctest main of k4_gpu_tests (the GPU suite; runs on the GPU machine) and of
// k4_emu_tests (its stage and golden tests on the kernels' host emulation, cmake/K4Emulation.cmake).
//
//   build-cuda/k4_gpu_tests                      everything
//   build-cuda/k4_gpu_tests -ts=gpu_compare      the comparison helper's self-tests (no GPU)
//   K4_GPU_QUICK=1 build-cuda/k4_gpu_tests       a sample of each sweep (smoke test)
//   K4_GPU_CHUNK_LOG2=26 ...                     inputs a device launch (default 2^28)
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <omp.h>

#include <cstdio>
#include <exception>

#include "device/runner.hpp"

int main(int argc, char** argv) {
  try {
    std::printf("k4_gpu_tests: device %s, %d host threads\n", k4::gpu::device_name().c_str(),
                omp_get_max_threads());
  } catch (const std::exception& e) {
    std::printf("k4_gpu_tests: no usable GPU (%s): the device tests will fail\n", e.what());
  }
  std::fflush(stdout);
  doctest::Context context(argc, argv);
  return context.run();
}
