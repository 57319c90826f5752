// test_stages_gpu_fixtures.cpp -- links the CPU suite's seeded fixtures (test::random_layer,
// test::random_step) into k4_gpu_tests: the CMake target globs tests/gpu/ only. If the build
// ever adds tests/cpu/fixtures.cpp to k4_gpu_tests itself, delete this file.
#include "tests/cpu/fixtures.cpp"  // NOLINT(bugprone-suspicious-include)
