// k4_kut_main.cpp -- k4_kut: a kernel-under-test library (device/kut/k4_kut.h) run over goldens.
//
//   k4_kut run LIB.so GOLDEN.h5... [--stages merge,oproj]
//       every golden (a case) through every stage the library supports, every rank, each on
//       the golden's own inputs; one line a case: ok, or the first divergence (case, rank,
//       stage, tensor, element) and its bits. Exit 0 every case bit-exact, 1 a divergence or a
//       library failure, 2 bad input (a library or golden that cannot be used).
//       A K4_KUT_DEVICE library gets the host emulation's device memory (device_memory.hpp)
//       where the build has it; on the GPU: k4_device run --kut LIB GOLDEN...
#include <CLI/CLI.hpp>

#include <cstdio>

#include "device/kut/harness.hpp"
#ifdef K4_KUT_EMULATED_DEVICE
#include "device/kut/device_memory.hpp"
#endif
#include "golden/format/schema.hpp"

int main(int argc, char** argv) {
  CLI::App app{"k4_kut -- a K4 implementation (a shared library, device/kut/k4_kut.h) against the reference's goldens"};
  app.require_subcommand(1);
  CLI::App* run = app.add_subcommand("run", "run LIB over GOLDEN files, stage by stage, rank by rank");
  std::string lib, stages;
  std::vector<std::string> goldens;
  run->add_option("LIB", lib, "the kernel-under-test shared library")->required();
  run->add_option("GOLDEN", goldens, "goldens (k4 golden), one case each")->required();
  run->add_option("--stages", stages, "comma-separated stages to test (default: every stage the library supports)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    k4::kut::Library L(lib);
    if (L.impl().memory == K4_KUT_DEVICE) {
#ifdef K4_KUT_EMULATED_DEVICE
      auto mem = k4::kut::device_memory();  // the host emulation's device memory: the same harness path as k4_device run --kut
      return k4::kut::run_cases("k4_kut", L, *mem, "device memory of the host emulation", goldens, stages);
#else
      throw std::invalid_argument("kernel library " + lib + ": wants device memory; this k4_kut has host memory only (k4_device run --kut)");
#endif
    }
    auto mem = k4::kut::host_memory();
    return k4::kut::run_cases("k4_kut", L, *mem, "host memory", goldens, stages);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "k4_kut: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k4_kut: failed: %s\n", e.what());
    return 1;
  }
}
