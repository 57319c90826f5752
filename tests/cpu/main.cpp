// main.cpp -- the doctest main of k4_tests (the CPU suite). Test files only include
// <doctest/doctest.h> and write TEST_SUITE / TEST_CASE; see CMakeLists.txt for how ctest
// registers one entry per suite, and why long sweeps go into a suite named "exhaustive...".
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
