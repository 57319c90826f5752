// k4_kut_main.cpp -- k4_kut: a kernel-under-test library (device/kut/k4_kut.h) run over goldens.
//
//   k4_kut run LIB.so GOLDEN.h5... [--stages merge,oproj]
//       every golden (a case) through every stage the library supports, every rank, each on
//       the golden's own inputs; one line a case: ok, or the first divergence (case, rank,
//       stage, tensor, element) and its bits. Exit 0 every case bit-exact, 1 a divergence or a
//       library failure, 2 bad input (a library or golden that cannot be used).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <sstream>

#include "device/kut/harness.hpp"
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
    std::vector<std::string> st;
    std::stringstream ss(stages);
    for (std::string s; std::getline(ss, s, ',');)
      if (!s.empty()) st.push_back(s);
    k4::kut::Library L(lib);
    auto mem = k4::kut::host_memory();
    if (L.impl().memory != K4_KUT_HOST)
      throw std::invalid_argument("kernel library " + lib + ": wants device memory; this k4_kut is the CPU build (host memory)");
    std::printf("k4_kut: %s (%s), %zu cases\n", L.impl().name, lib.c_str(), goldens.size());
    int failed = 0;
    for (const std::string& g : goldens) {
      const k4::kut::CaseResult r = k4::kut::run_case(L, *mem, g, st);
      std::printf("%s\n", r.line().c_str());
      if (!r.ok && r.error.empty()) std::printf("      %s\n", r.detail.c_str());
      failed += r.ok ? 0 : 1;
    }
    std::printf("%zu of %zu cases bit-exact\n", goldens.size() - size_t(failed), goldens.size());
    return failed ? 1 : 0;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "k4_kut: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k4_kut: failed: %s\n", e.what());
    return 1;
  }
}
