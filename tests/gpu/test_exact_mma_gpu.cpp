// test_exact_mma_gpu.cpp -- the integer tensor-core block dots (device/exact_mma.hpp) on the
// GPU: every tile of tests/gpu/exact_mma_cases.hpp (the specials: +-0, +-448, the largest
// sums, subnormal codes, NaN elements, every pair of edge E8M0 scales incl. 0, 254 and the NaN
// 0xFF; every E4M3 code -- and every E2M1 code as its low nibble -- at every k position, so in
// every lane and register byte of the fragments; seeded random tiles) through mma.sync and
// through the shuffle fallback, bit for bit against the model (reference/numerics/mma.hpp).
// Suite "gpu_exact_mma" (scripts/gpu-suite.sh runs it; K4_GPU_QUICK=1 takes fewer randoms).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tests/gpu/exact_mma_kernels.hpp"

namespace {

using namespace k4;
using namespace k4::xmma;

struct Count {
  size_t bad = 0, nonzero = 0, outputs = 0;
};

Count compare(Pair p, const std::vector<Tile>& tiles, const std::vector<uint32_t>& got, const char* what) {
  Count c;
  for (size_t n = 0; n < tiles.size(); ++n)
    for (int r = 0; r < 16; ++r)
      for (int col = 0; col < 8; ++col) {
        const uint32_t want = model_value(p, tiles[n], r, col), g = got[n * 128 + size_t(r) * 8 + size_t(col)];
        ++c.outputs;
        c.nonzero += (want & 0x7FFFFFFFu) != 0;
        if (g != want && c.bad++ < 8)
          std::printf("  MISMATCH %s tile %zu row %d col %d: device 0x%08x (%g), model 0x%08x (%g), sa %u sb %u\n", what,
                      n, r, col, g, double(f32_from_bits(g)), want, double(f32_from_bits(want)), tiles[n].sa[r],
                      tiles[n].sb[col]);
      }
  return c;
}

void run_pair(Pair p, const char* name) {
  const bool quick = std::getenv("K4_GPU_QUICK") && *std::getenv("K4_GPU_QUICK") == '1';
  const std::vector<Tile> tiles = all_tiles(p, quick ? 2000 : 50000, 11);
  std::vector<uint32_t> out(tiles.size() * 128);
  for (int gather = 0; gather < 2; ++gather) {
    const char* what = gather ? "gather" : "mma.sync";
    k4::gpu::exact_mma_tiles(p, gather != 0, tiles.data(), tiles.size(), out.data());
    const Count c = compare(p, tiles, out, what);
    std::printf("gpu_exact_mma %s %s: %zu tiles, %zu outputs (%zu nonzero), %zu mismatches\n", name, what,
                tiles.size(), c.outputs, c.nonzero, c.bad);
    CHECK(c.bad == 0);
    CHECK(c.nonzero > c.outputs / 2);  // not trivially zero
    // the comparison can fail: one flipped bit in the device's output is caught
    std::vector<uint32_t> planted = out;
    planted[12345 % planted.size()] ^= 1u;
    CHECK(compare(p, tiles, planted, "planted (expected)").bad == c.bad + 1);
  }
}

}  // namespace

TEST_SUITE("gpu_exact_mma") {
  TEST_CASE("the PRMT pair decode of E2M1 on the device: P + Q = 2 x E2M1, every 4 codes, upper codes ignored") {
    std::vector<uint32_t> p(65536), q(65536);
    k4::gpu::e2m1_pq_all(p.data(), q.data());
    size_t bad = 0;
    for (uint32_t i = 0; i < 65536; ++i)
      for (int j = 0; j < 4; ++j) bad += int(byte_of(p[i], j)) + int(byte_of(q[i], j)) != e2m1_s8(uint8_t(i >> (4 * j)));
    std::printf("gpu_exact_mma PRMT pair decode: 65536 selectors, %zu wrong bytes\n", bad);
    CHECK(bad == 0);
  }

  TEST_CASE("E2M1 x E4M3 tiles on mma.sync s8: bit-exact") { run_pair(Pair::F4F8, "E2M1xE4M3"); }
  TEST_CASE("E4M3 x E4M3 tiles on mma.sync s8: bit-exact") { run_pair(Pair::F8F8, "E4M3xE4M3"); }
}
