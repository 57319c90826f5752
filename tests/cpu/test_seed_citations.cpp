// test_seed_citations.cpp -- every seed citation in reference/, device/ and docs/numerics.md
// points at what it names.
//
// The one citation form is `name (seed:Lnnn)` or `name (seed:Lnnn-Lmmm)`: `name` (optionally
// in backticks) is an identifier of the seed, and it must stand as a whole word within
// kSlack lines of the first cited line. Anything else that looks like a seed line number (a
// bare `seed:L`, an `Lnnn` outside a citation, `seed lines 286-640`) is refused, so a
// citation cannot escape the check by its spelling. The seed is the vendored copy
// docs/seed/001_abb1f7ec88a03be0.txt (a fresh clone has no ../shared); when ../shared is
// there, the copy must be byte-identical to it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cpu/cli_run.hpp"

namespace fs = std::filesystem;

namespace {

constexpr int kSlack = 3;  // "at the cited line, within a few lines"
const char* const kSeedName = "001_abb1f7ec88a03be0.txt";

using k4::cli::slurp;
using k4::cli::source_root;

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream s(text);
  for (std::string line; std::getline(s, line);) out.push_back(line);
  return out;
}

bool has_word(const std::string& line, const std::string& word) {
  for (size_t at = line.find(word); at != std::string::npos; at = line.find(word, at + 1)) {
    const auto ident = [](char c) { return std::isalnum((unsigned char)c) || c == '_'; };
    const bool starts = at == 0 || !ident(line[at - 1]);
    const bool ends = at + word.size() == line.size() || !ident(line[at + word.size()]);
    if (starts && ends) return true;
  }
  return false;
}

struct Citation {
  std::string name;
  int first = 0, last = 0;  // seed lines, 1-based
};

const std::regex& citation_re() {
  static const std::regex re(R"(`?([A-Za-z_][A-Za-z0-9_.]*)`? \(seed:L([0-9]+)(?:-L([0-9]+))?\))");
  return re;
}

// What is left of a line once its citations are taken out and still looks like a seed line
// number: a bare seed:Lnnn, an Lnn (two digits or more: "L2" is the cache), a range Ln-Lm,
// "seed 946-1160", "seed lines 286-640".
const std::regex& stray_re() {
  static const std::regex re(R"(seed:L?[0-9]|\bL[0-9]{2,}\b|\bL[0-9]+-L[0-9]+\b|\bseed( lines?)? [0-9]{2,})");
  return re;
}

// The problems of one line of `where` (empty: its citations hold).
std::vector<std::string> check_line(const std::string& line, const std::string& where,
                                    const std::vector<std::string>& seed, int* n_cited) {
  std::vector<std::string> bad;
  const int n = int(seed.size());
  for (std::sregex_iterator it(line.begin(), line.end(), citation_re()), end; it != end; ++it) {
    const std::smatch& m = *it;
    Citation c{m[1].str(), std::stoi(m[2].str()), m[3].matched ? std::stoi(m[3].str()) : std::stoi(m[2].str())};
    ++*n_cited;
    if (c.first < 1 || c.last < c.first || c.last > n) {
      bad.push_back(where + ": " + m.str() + ": lines outside the seed's 1.." + std::to_string(n) + " or reversed");
      continue;
    }
    bool found = false;
    for (int l = std::max(1, c.first - kSlack); l <= std::min(n, c.first + kSlack) && !found; ++l)
      found = has_word(seed[l - 1], c.name);
    if (!found)
      bad.push_back(where + ": " + m.str() + ": '" + c.name + "' is not in seed lines " +
                    std::to_string(std::max(1, c.first - kSlack)) + ".." +
                    std::to_string(std::min(n, c.first + kSlack)) + " (seed:L" + std::to_string(c.first) +
                    ": '" + seed[c.first - 1] + "')");
  }
  const std::string rest = std::regex_replace(line, citation_re(), "");
  std::smatch s;
  if (std::regex_search(rest, s, stray_re()))
    bad.push_back(where + ": '" + s.str() + "' is not a citation the test can check: write name (seed:Lnnn)");
  return bad;
}

std::vector<std::string> check_text(const std::string& text, const std::string& file,
                                    const std::vector<std::string>& seed, int* n_cited) {
  std::vector<std::string> bad;
  const std::vector<std::string> lines = split_lines(text);
  for (size_t i = 0; i < lines.size(); ++i)
    for (auto& b : check_line(lines[i], file + ":" + std::to_string(i + 1), seed, n_cited)) bad.push_back(b);
  return bad;
}

std::vector<std::string> vendored_seed() { return split_lines(slurp(source_root() / "docs/seed" / kSeedName)); }

// The files whose citations are checked, relative to the source tree.
std::vector<fs::path> cited_files() {
  std::vector<fs::path> out;
  for (const char* tree : {"reference", "device"})
    for (const auto& e : fs::recursive_directory_iterator(source_root() / tree))
      if (e.is_regular_file()) out.push_back(fs::relative(e.path(), source_root()));
  out.push_back("docs/numerics.md");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_SUITE("seed_citations") {
  TEST_CASE("the vendored seed is the seed") {
    const std::vector<std::string> seed = vendored_seed();
    REQUIRE(seed.size() > 2000);
    CHECK(seed[1175].rfind("def route_top4(", 0) == 0);  // a known line, so the numbering is grep -n's
    const fs::path shared = source_root().parent_path() / "shared" / "seeds" / kSeedName;
    if (fs::exists(shared))
      CHECK_MESSAGE(slurp(shared) == slurp(source_root() / "docs/seed" / kSeedName),
                    "docs/seed/ differs from ", shared.string(), ": copy it again");
    else
      MESSAGE("no ", shared.string(), " beside the tree: the vendored copy is used as it is");
  }

  TEST_CASE("the checker catches a wrong line, a wrong name and an uncheckable form") {
    const std::vector<std::string> seed = vendored_seed();
    int n = 0;
    CHECK(check_line("top-4 routing: route_top4 (seed:L1176-L1209)", "ok", seed, &n).empty());
    CHECK(check_line("`route_top4` (seed:L1178)", "ok", seed, &n).empty());  // within the slack
    CHECK(n == 2);
    CHECK(check_line("route_top4 (seed:L1494-L1536)", "drifted", seed, &n).size() == 1);
    CHECK(check_line("route_top4 (seed:L1181)", "past the slack", seed, &n).size() == 1);
    CHECK(check_line("route_top (seed:L1176)", "part of a word", seed, &n).size() == 1);
    CHECK(check_line("route_top4 (seed:L1176-L99999)", "past the end", seed, &n).size() == 1);
    CHECK(check_line("sig (seed:L1469)", "the sigmoid drifted", seed, &n).size() == 1);
    CHECK(check_line("the L2 cache, L1 and L2 flushed", "not a seed line", seed, &n).empty());
    for (const char* uncheckable : {"the rule (seed:L1465)", "seed:L1465", "(seed route_top4, L1494-L1536)",
                                    "(seed lines 286-640: step_rows)", "(seed 946-1160)",
                                    "route_top4 (seed:L1176, L1190)", "(L1-L2600)"})
      CHECK_MESSAGE(!check_line(uncheckable, "planted", seed, &n).empty(), uncheckable);
    // A file: the line of the wrong one is named.
    const auto bad = check_text("ok: route_top4 (seed:L1176)\nwrong: route_top4 (seed:L1494)\n", "f.cpp", seed, &n);
    REQUIRE(bad.size() == 1);
    CHECK(bad[0].rfind("f.cpp:2: ", 0) == 0);
  }

  TEST_CASE("every citation in reference/, device/ and docs/numerics.md holds") {
    const std::vector<std::string> seed = vendored_seed();
    int n_cited = 0;
    std::vector<std::string> bad;
    for (const fs::path& f : cited_files())
      for (auto& b : check_text(slurp(source_root() / f), f.string(), seed, &n_cited)) bad.push_back(b);
    for (const std::string& b : bad) FAIL_CHECK(b);
    CHECK(n_cited > 150);  // the trees do cite: a walk that found nothing cannot pass
    MESSAGE(n_cited, " citations checked");
  }
}
