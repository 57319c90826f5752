// test_report.cpp -- the HTML report (k4 diff --html): self-contained (no script, no
// network), one section with a map and a histogram for every mismatching tensor; and
// rendered by headless Chromium (scripts/screenshot-report.sh): the PNG has the window's
// size and is not blank (decoded here with zlib: many colours, the map's background and the
// ring around the first mismatch are on screen). Without chromium the render case is
// skipped, and a message says so.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <zlib.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "tests/cpu/cli_run.hpp"
#include "golden/diff/compare.hpp"
#include "tests/cpu/test_diff_world.hpp"

namespace fs = std::filesystem;
using namespace k4;
using k4::test::DiffWorld;

namespace {

using k4::cli::k4_bin;  // tests/cpu/cli_run.hpp
using k4::cli::slurp;

int sh(const std::string& cmd) {
  const int s = std::system(cmd.c_str());
  return WIFEXITED(s) ? WEXITSTATUS(s) : -1;
}

bool have_chromium() {
  return std::system("command -v chromium > /dev/null 2>&1 || command -v chromium-browser > /dev/null 2>&1") == 0;
}

std::string script() {
  if (const char* e = std::getenv("K4_SOURCE_DIR")) return std::string(e) + "/scripts/screenshot-report.sh";
  return (fs::path(__FILE__).parent_path().parent_path().parent_path() / "scripts" / "screenshot-report.sh").string();
}

// The report of the split bit-flip fault (a dump written here, k4 replay --html).
std::string make_report(const std::string& name) {
  const DiffWorld& W = test::diff_world();
  const std::string dump = W.path(name + ".h5"), html = W.path(name + ".html");
  golden::write_dump(dump, W.cfg, W.in.shared.tokens, test::fault_split_bit_flip(W).res, {}, true);
  const int rc = sh(k4_bin() + " replay " + W.golden_path + " " + dump + " --html " + html + " --force -q > /dev/null 2>&1");
  CHECK(rc == 1);
  return html;
}

// ---- a small PNG reader: 8-bit RGB / RGBA, not interlaced ----------------------------

uint32_t be32(const unsigned char* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

struct Png {
  uint32_t w = 0, h = 0;
  int channels = 0;
  std::vector<uint8_t> px;  // h rows of w * channels bytes
};

std::string read_png(const std::string& path, Png& png) {
  const std::string f = slurp(path);
  const auto* b = reinterpret_cast<const unsigned char*>(f.data());
  if (f.size() < 33 || std::memcmp(b, "\x89PNG\r\n\x1a\n", 8) != 0) return "not a PNG";
  std::string idat;
  int depth = 0, color = 0, interlace = 0;
  for (size_t p = 8; p + 12 <= f.size();) {
    const uint32_t len = be32(b + p);
    const std::string type(f.data() + p + 4, 4);
    if (p + 12 + len > f.size()) return "truncated chunk " + type;
    const unsigned char* d = b + p + 8;
    if (type == "IHDR") {
      png.w = be32(d);
      png.h = be32(d + 4);
      depth = d[8];
      color = d[9];
      interlace = d[12];
    } else if (type == "IDAT") {
      idat.append(reinterpret_cast<const char*>(d), len);
    }
    p += 12 + len;
  }
  if (depth != 8 || (color != 2 && color != 6) || interlace != 0)
    return "unsupported PNG (depth " + std::to_string(depth) + ", colour type " + std::to_string(color) + ")";
  png.channels = color == 6 ? 4 : 3;
  const size_t stride = size_t(png.w) * png.channels;
  std::vector<uint8_t> raw(size_t(png.h) * (stride + 1));
  uLongf n = raw.size();
  if (uncompress(raw.data(), &n, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK || n != raw.size())
    return "IDAT does not inflate to " + std::to_string(raw.size()) + " bytes";
  png.px.assign(size_t(png.h) * stride, 0);
  const int bpp = png.channels;
  for (size_t y = 0; y < png.h; ++y) {
    const uint8_t ft = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &png.px[y * stride];
    const uint8_t* up = y ? &png.px[(y - 1) * stride] : nullptr;
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= size_t(bpp) ? out[x - bpp] : 0, u = up ? up[x] : 0, c = (up && x >= size_t(bpp)) ? up[x - bpp] : 0;
      int v = in[x];
      switch (ft) {
        case 0: break;
        case 1: v += a; break;
        case 2: v += u; break;
        case 3: v += (a + u) / 2; break;
        case 4: {
          const int p = a + u - c, pa = std::abs(p - a), pb = std::abs(p - u), pc = std::abs(p - c);
          v += (pa <= pb && pa <= pc) ? a : (pb <= pc ? u : c);
          break;
        }
        default: return "bad filter type " + std::to_string(ft);
      }
      out[x] = uint8_t(v);
    }
  }
  return "";
}

bool near(const uint8_t* p, int r, int g, int b, int tol) {
  return std::abs(p[0] - r) <= tol && std::abs(p[1] - g) <= tol && std::abs(p[2] - b) <= tol;
}

}  // namespace

TEST_SUITE("report") {

TEST_CASE("html report: self-contained, a map and a histogram for every mismatching tensor") {
  REQUIRE_K4();
  const std::string html = slurp(make_report("report_html"));
  REQUIRE(!html.empty());
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("http://") == std::string::npos);
  CHECK(html.find("https://") == std::string::npos);
  CHECK(html.find("src=") == std::string::npos);
  CHECK(html.find("first divergence</b>: rank 1, stage <b>split</b>, tensor <b>o</b>, element [token 2, split 1, dim 517]") !=
        std::string::npos);
  // one section a mismatching tensor, each with its map and histogram
  size_t sections = 0, maps = 0, hists = 0;
  for (size_t p = 0; (p = html.find("<section class=\"tensor\"", p)) != std::string::npos; ++p) ++sections;
  for (size_t p = 0; (p = html.find("<svg class=\"map\"", p)) != std::string::npos; ++p) ++maps;
  for (size_t p = 0; (p = html.find("<svg class=\"hist\"", p)) != std::string::npos; ++p) ++hists;
  CHECK(sections >= 10);
  CHECK(maps == sections);
  CHECK(hists == sections);
  CHECK(html.find("id=\"t-1-split-o\"") != std::string::npos);
  CHECK(html.find("this stage is wrong") != std::string::npos);
  CHECK(html.find("inherited a bad input") != std::string::npos);
}

TEST_CASE("chromium is there for the render check, or the check says it is skipped") {
  if (!have_chromium())
    MESSAGE("chromium is not installed (scripts/setup.sh --chromium): the headless render case is SKIPPED");
  CHECK(true);
}

TEST_CASE("html report renders in headless chromium: 1200x900, not blank, the mismatch map on screen" *
          doctest::skip(!have_chromium())) {
  REQUIRE_K4();
  const DiffWorld& W = test::diff_world();
  const std::string html = make_report("report_render"), png_path = W.path("report_render.png");
  REQUIRE(fs::exists(script()));
  const int rc = sh("bash " + script() + " " + html + " " + png_path + " > " + W.path("shot.log") + " 2>&1");
  INFO(slurp(W.path("shot.log")));
  REQUIRE(rc == 0);
  REQUIRE(fs::exists(png_path));
  if (const char* keep = std::getenv("K4_KEEP_SCREENSHOT")) fs::copy_file(png_path, keep, fs::copy_options::overwrite_existing);
  Png png;
  const std::string err = read_png(png_path, png);
  REQUIRE_MESSAGE(err.empty(), err);
  CHECK(png.w == 1200);
  CHECK(png.h == 900);
  std::set<uint32_t> colours;
  size_t non_white = 0, map_bg = 0, ring = 0, heat = 0;
  for (size_t i = 0; i < png.px.size(); i += size_t(png.channels)) {
    const uint8_t* p = &png.px[i];
    colours.insert(uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2]);
    if (!near(p, 255, 255, 255, 3)) ++non_white;
    if (near(p, 0xe8, 0xec, 0xf4, 3)) ++map_bg;
    if (near(p, 0x1f, 0x4f, 0xd0, 24)) ++ring;
    if (p[0] > 150 && p[1] < 120 && p[2] < 90) ++heat;
  }
  MESSAGE("screenshot: " << colours.size() << " colours, " << non_white << " non-white pixels, map background " << map_bg
                         << ", ring " << ring << ", heat " << heat);
  CHECK(colours.size() > 50);
  CHECK(non_white > size_t(png.w) * png.h / 20);
  CHECK(map_bg > 20000);  // a map is on the first screen
  CHECK(ring > 20);       // and the first mismatch is ringed on it
  CHECK(heat > 20);       // mismatch cells (and the MISMATCH badge)
}

}  // TEST_SUITE
