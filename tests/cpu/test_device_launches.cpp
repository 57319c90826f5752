// test_device_launches.cpp -- every kernel of device/ waits for the kernel before it, before it
// touches memory, so that a programmatic dependent launch (k4_launch_dependent,
// device/compat.hpp) computes what a plain launch would.
//
// A kernel launched that way may start while its predecessor in the stream still runs; only
// k4_grid_dep_start() (griddepcontrol.wait) orders it after it. A kernel that forgot it would
// race with its predecessor on some runs and not others, which a bit-exactness suite may never
// see. So the rule is checked on the sources: each `__global__` function of device/ begins its
// body with `k4_grid_dep_start();` (only `__shared__` and K4_DYNAMIC_SMEM declarations before it), unless it is a
// plain kernel: one launched by hipLaunchKernelGGL and named nowhere else but its definition
// (so no k4_launch_dependent call or kernel table can reach it).
#include <doctest/doctest.h>

#include <cctype>
#include <filesystem>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/cpu/cli_run.hpp"

namespace fs = std::filesystem;

namespace {

using k4::cli::slurp;
using k4::cli::source_root;

// The text with // and /* */ comments blanked (string literals in device/ hold no comment marks
// that matter here).
std::string strip_comments(const std::string& s) {
  std::string out = s;
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    if (out[i] == '/' && out[i + 1] == '/') {
      while (i < out.size() && out[i] != '\n') out[i++] = ' ';
    } else if (out[i] == '/' && out[i + 1] == '*') {
      for (; i + 1 < out.size() && !(out[i] == '*' && out[i + 1] == '/'); ++i)
        if (out[i] != '\n') out[i] = ' ';
      if (i + 1 < out.size()) out[i] = out[i + 1] = ' ';
    }
  }
  return out;
}

struct Kernel {
  std::string file, name;
  bool waits = false;  // the body begins with k4_grid_dep_start();
};

// The __global__ functions of one source text and whether each begins with the wait.
std::vector<Kernel> kernels_of(const std::string& file, const std::string& text) {
  static const std::regex def(R"(__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\()");
  std::vector<Kernel> out;
  for (std::sregex_iterator it(text.begin(), text.end(), def), end; it != end; ++it) {
    Kernel k{file, (*it)[1].str()};
    const size_t body = text.find('{', size_t(it->position() + it->length()));
    if (body != std::string::npos) {
      size_t at = body + 1;
      for (;;) {  // skip the __shared__ declarations
        while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
        const size_t semi = text.find(';', at);
        if (semi == std::string::npos) break;
        const std::string stmt = text.substr(at, semi - at);
        if (stmt.find("__shared__") == std::string::npos && stmt.rfind("K4_DYNAMIC_SMEM(", 0) != 0) break;
        at = semi + 1;
      }
      k.waits = text.compare(at, 20, "k4_grid_dep_start();") == 0;
    }
    out.push_back(k);
  }
  return out;
}

// Every violation of the rule in a set of sources (file -> text), as a readable line each.
std::vector<std::string> launch_violations(const std::map<std::string, std::string>& sources) {
  static const std::regex plain(R"(hipLaunchKernelGGL\s*\(\s*\(?\s*(\w+))");
  std::vector<Kernel> kernels;
  std::set<std::string> plain_launched;
  std::map<std::string, int> mentions;  // name -> whole-word occurrences in all sources
  std::vector<std::string> texts;
  for (const auto& [file, raw] : sources) {
    const std::string text = strip_comments(raw);
    for (const Kernel& k : kernels_of(file, text)) kernels.push_back(k);
    for (std::sregex_iterator it(text.begin(), text.end(), plain), end; it != end; ++it) plain_launched.insert((*it)[1].str());
    texts.push_back(text);
  }
  for (const Kernel& k : kernels) {
    const std::regex word("\\b" + k.name + "\\b");
    for (const std::string& t : texts) mentions[k.name] += int(std::distance(std::sregex_iterator(t.begin(), t.end(), word), std::sregex_iterator()));
  }
  std::vector<std::string> out;
  for (const Kernel& k : kernels) {
    if (k.waits) continue;
    if (plain_launched.count(k.name) == 0)
      out.push_back(k.file + ": kernel " + k.name + " does not begin with k4_grid_dep_start(); and is not launched by hipLaunchKernelGGL");
    else if (mentions[k.name] != 2)
      out.push_back(k.file + ": kernel " + k.name + " has no k4_grid_dep_start(); but is named " + std::to_string(mentions[k.name]) +
                    " times (its definition and one hipLaunchKernelGGL expected): a dependent launch could reach it");
  }
  return out;
}

std::map<std::string, std::string> device_sources() {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(source_root() / "device")) {
    const std::string ext = e.path().extension().string();
    if (e.path().filename() == "compat.hpp" || (ext != ".cu" && ext != ".hpp" && ext != ".cpp")) continue;
    out[fs::relative(e.path(), source_root()).string()] = slurp(e.path().string());
  }
  return out;
}

}  // namespace

TEST_SUITE("device_launches") {
TEST_CASE("every kernel of device/ waits for its predecessor before it touches memory") {
  const auto sources = device_sources();
  REQUIRE(sources.size() >= 10);
  size_t n_kernels = 0, n_waiting = 0;
  for (const auto& [file, text] : sources)
    for (const Kernel& k : kernels_of(file, strip_comments(text))) ++n_kernels, n_waiting += k.waits ? 1 : 0;
  CHECK(n_kernels >= 6);   // block_kernel, the limbs, fast o_proj, up/gate, down units, stream read
  CHECK(n_waiting >= 5);
  const auto bad = launch_violations(sources);
  for (const std::string& b : bad) MESSAGE(b);
  CHECK(bad.empty());
}

TEST_CASE("the check catches a kernel without the wait, or with it late") {
  const std::string good = "__global__ void __launch_bounds__(128) a_kernel(Args a) {\n"
                           "  extern __shared__ __align__(16) unsigned char s[];\n"
                           "  k4_grid_dep_start();  // first\n"
                           "  a.out[0] = 1;\n}\n"
                           "void launch() { k4_launch_dependent(a_kernel, g, b, 0, s, x); }\n";
  CHECK(launch_violations({{"good.cu", good}}).empty());
  // the wait after a store, or missing: reported
  const std::string late = "__global__ void b_kernel(Args a) {\n  a.out[0] = 1;\n  k4_grid_dep_start();\n}\n";
  CHECK(launch_violations({{"late.cu", late}}).size() == 1);
  const std::string none = "__global__ void c_kernel(Args a) { a.out[0] = 1; }\n"
                           "void launch() { k4_launch_dependent(c_kernel, g, b, 0, s, x); }\n";
  CHECK(launch_violations({{"none.cu", none}}).size() == 1);
  // a plain kernel is allowed, unless something else names it (a dependent launch, a table)
  const std::string plain = "__global__ void d_kernel(int* p) { p[0] = 1; }\n"
                            "void launch() { hipLaunchKernelGGL(d_kernel, g, b, 0, 0, p); }\n";
  CHECK(launch_violations({{"plain.cu", plain}}).empty());
  const std::string both = plain + "void other() { k4_launch_dependent(d_kernel, g, b, 0, s, p); }\n";
  CHECK(launch_violations({{"both.cu", both}}).size() == 1);
  // a comment does not count as the wait
  const std::string commented = "__global__ void e_kernel(Args a) {\n  // k4_grid_dep_start();\n  a.out[0] = 1;\n}\n";
  CHECK(launch_violations({{"commented.cu", commented}}).size() == 1);
}
}  // TEST_SUITE
