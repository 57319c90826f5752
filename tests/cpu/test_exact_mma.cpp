// test_exact_mma.cpp -- the integer tensor-core block dots (device/exact_mma.hpp) on the CPU:
// the operand decodes (E2M1 -> s8, the PRMT pair P + Q, E4M3 -> 3 balanced limbs) over every
// code, the exact scaling over every E8M0 pair, and the host emulation of the m16n8k32
// fragments (mma_s8_warp: the PTX index maps) on the GPU suite's tiles, bit for bit against
// the model (reference/numerics/mma.hpp). Planted errors show each check can fail. The GPU
// runs the same tiles through mma.sync (tests/gpu/test_exact_mma_gpu.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "device/exact_mma.hpp"
#include "tests/gpu/exact_mma_cases.hpp"

namespace {

using namespace k4;
using namespace k4::xmma;

// Mismatching outputs of `tiles` between the emulation and the model.
size_t tile_mismatches(Pair p, const std::vector<Tile>& tiles, size_t* nonzero = nullptr) {
  size_t bad = 0, nz = 0;
  for (size_t n = 0; n < tiles.size(); ++n) {
    uint32_t out[16][8];
    emulate_tile(p, tiles[n], out);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 8; ++c) {
        const uint32_t want = model_value(p, tiles[n], r, c);
        nz += (want & 0x7FFFFFFFu) != 0;
        if (out[r][c] != want && bad++ < 5)
          std::printf("  tile %zu row %d col %d: emulated 0x%08x, model 0x%08x\n", n, r, c, out[r][c], want);
      }
  }
  if (nonzero) *nonzero = nz;
  return bad;
}

struct W2 {  // uint2 on the device
  uint32_t x, y;
};
W2 words_at(const uint8_t* codes) {  // 8 codes as two little-endian words
  W2 w;
  std::memcpy(&w.x, codes, 4), std::memcpy(&w.y, codes + 4, 4);
  return w;
}

// The tile as oproj_fast.cu and split.cu's tensor-core body compute it: lane (g, t) loads codes
// 8t .. 8t + 7 of rows g, g + 8 and of column g, decodes them through the limb table (a_limbs,
// b_limbs), the 9 MMAs go into 5 accumulators by limb weight, sum_f8f8, the NaN flags from the
// lanes' words OR-ed over the quad; `swap_b` plants B's two registers swapped.
size_t loaded_f8f8_mismatches(const std::vector<Tile>& tiles, bool swap_b, size_t* nonzero) {
  uint32_t dec[256];
  for (int c = 0; c < 256; ++c) dec[c] = limbs_entry(uint8_t(c));
  size_t bad = 0, nz = 0;
  for (const Tile& t : tiles) {
    FragA a[3][kLanes];
    FragB b[3][kLanes];
    bool row_flag[16] = {}, col_flag[8] = {};
    for (int l = 0; l < kLanes; ++l) {
      const int g = l / 4, tt = l % 4;
      const W2 lo = words_at(&t.a[g][8 * tt]), hi = words_at(&t.a[g + 8][8 * tt]), bv = words_at(&t.b[g][8 * tt]);
      FragA la[3];
      FragB lb[3];
      a_limbs(la, lo, hi, dec);
      b_limbs(lb, bv, dec);
      for (int m = 0; m < 3; ++m) {
        a[m][l] = la[m], b[m][l] = lb[m];
        if (swap_b) std::swap(b[m][l].r[0], b[m][l].r[1]);
      }
      row_flag[g] = row_flag[g] || any_nan4(lo.x) || any_nan4(lo.y);
      row_flag[g + 8] = row_flag[g + 8] || any_nan4(hi.x) || any_nan4(hi.y);
      col_flag[g] = col_flag[g] || any_nan4(bv.x) || any_nan4(bv.y);
    }
    FragC E[5][kLanes] = {};
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) mma_s8_warp(E[i + j], a[i], b[j]);
    for (int l = 0; l < kLanes; ++l)
      for (int r = 0; r < 4; ++r) {
        FragC e[5];
        for (int n = 0; n < 5; ++n) e[n] = E[n][l];
        const int row = c_row(l, r), col = c_col(l, r);
        const uint32_t got = f32_bits(finish_block64(sum_f8f8(e, r), 18, t.sa[row], t.sb[col], row_flag[row] || col_flag[col]));
        const uint32_t want = model_value(Pair::F8F8, t, row, col);
        nz += (want & 0x7FFFFFFFu) != 0;
        if (got != want && bad++ < 5 && !swap_b)
          std::printf("  row %d col %d: loaded-order tile 0x%08x, model 0x%08x\n", row, col, got, want);
      }
  }
  if (nonzero) *nonzero = nz;
  return bad;
}

}  // namespace

TEST_SUITE("exact_mma") {
  TEST_CASE("E2M1 -> s8 and the PRMT pair decode, every code in every byte") {
    int bad = 0;
    for (int pos = 0; pos < 4; ++pos)
      for (uint32_t c = 0; c < 16; ++c) {
        const uint32_t codes = (0x3A51u & ~(0xFu << (4 * pos))) | c << (4 * pos);
        uint32_t p, q;
        e2m1_pq4(codes, p, q);
        for (int j = 0; j < 4; ++j) {
          const int want = e2m1_s8(uint8_t(codes >> (4 * j)));
          bad += int(byte_of(p, j)) + int(byte_of(q, j)) != want;
        }
      }
    CHECK(bad == 0);
    // the upper 16 bits (4 more codes of a word, as a_pq passes them) do not change the decode
    int upper = 0, planted = 0;
    for (uint32_t c = 0; c < 65536; c += 97) {
      uint32_t p0, q0, p1, q1, p2, q2;
      e2m1_pq4(c, p0, q0);
      e2m1_pq4(c | (c * 0x9E37u + 0x5A5Au) << 16, p1, q1);
      e2m1_pq4(c ^ 1u, p2, q2);  // planted: one bit of the low half, which must show
      upper += p0 != p1 || q0 != q1;
      planted += p0 != p2 || q0 != q2;
    }
    CHECK(upper == 0);
    CHECK(planted == (65536 + 96) / 97);
    CHECK(e2m1_s8(0x8) == 0);  // -0
    CHECK(e2m1_s8(0x7) == 12);
    CHECK(e2m1_s8(0xF) == -12);
    // planted: a TP table with one bit flipped is caught
    const uint32_t bad_tp = kTpLo ^ 0x100u;
    int caught = 0;
    for (uint32_t c = 0; c < 16; ++c) {
      const uint32_t p = prmt(bad_tp, kTpHi, c), q = prmt(kTqLo, kTqHi, c ^ 0x8u);
      caught += int(byte_of(p, 0)) + int(byte_of(q, 0)) != e2m1_s8(uint8_t(c));
    }
    CHECK(caught > 0);
  }

  TEST_CASE("E4M3 -> three balanced radix-128 limbs, every code") {
    for (int c = 0; c < 256; ++c) {
      const Limbs l = e4m3_limbs(uint8_t(c));
      const int32_t want = e4m3_is_nan(uint8_t(c)) ? 0 : e4m3_to_int_x512(uint8_t(c));
      CHECK(int32_t(l.d[0]) + 128 * int32_t(l.d[1]) + 16384 * int32_t(l.d[2]) == want);
      CHECK((l.d[0] >= -64 && l.d[0] <= 63 && l.d[1] >= -64 && l.d[1] <= 63 && l.d[2] >= -14 && l.d[2] <= 14));
    }
    CHECK(e4m3_limbs(0x80).d[0] == 0);  // -0
    CHECK(e4m3_to_int_x512(0x7E) == 229376);
  }

  TEST_CASE("exact scaling: every E8M0 pair on large, small, odd and zero sums") {
    const int32_t sums[] = {0, 1, -1, 3, 0x7FFFFF, -0x1000001, 88080384, -88080384, 0x5555555, 12345};
    size_t bad = 0, n = 0;
    for (int32_t S : sums)
      for (int sa = 0; sa < 256; ++sa)
        for (int sb = 0; sb < 256; ++sb) {
          const float got = finish_block32(S, 10, uint8_t(sa), uint8_t(sb), false);
          const float want = scale_block(round_block_sum(S, 10), uint8_t(sa), uint8_t(sb));
          bad += f32_bits(got) != f32_bits(want), ++n;
          const int64_t S64 = int64_t(S) * 4099 * 4099;  // up to 2^41
          const float got64 = finish_block64(S64, 18, uint8_t(sa), uint8_t(sb), false);
          const float want64 = scale_block(round_block_sum(S64, 18), uint8_t(sa), uint8_t(sb));
          bad += f32_bits(got64) != f32_bits(want64), ++n;
        }
    CHECK(bad == 0);
    CHECK(n == 2u * 10 * 65536);
    CHECK(is_nan(finish_block32(0, 10, 127, 127, true)));
    CHECK(f32_bits(finish_block32(0, 10, 254, 254, false)) == 0u);  // a zero block is +0
    // planted: scaling in one f32 product (no split) differs from the model somewhere
    size_t caught = 0;
    for (int sa = 0; sa < 255; ++sa)
      for (int sb = 0; sb < 255; ++sb) {
        const float naive = float(0x5555555) * pow2_f32(std::max(-149, std::min(127, sa + sb - 264)));
        caught += f32_bits(naive) != f32_bits(scale_block(round_block_sum(0x5555555, 10), uint8_t(sa), uint8_t(sb)));
      }
    CHECK(caught > 0);
  }

  // The fast stage-5 kernels' block value (b_factor, sa_factor, block_fast below sa 228,
  // block_edge above) against the model, every E8M0 pair, NaN blocks too.
  TEST_CASE("the fast kernels' E2M1 x E4M3 block value: every E8M0 pair on large, small, odd and zero sums") {
    const int32_t sums[] = {0, 1, -1, 3, 0x7FFFFF, -0x1000001, 88080384, -88080384, 0x5555555, -0x7FFFFFF};
    const auto fast_value = [](int32_t S, int sa, int sb, bool nan, int max_sa) {
      const float s = float(S), fb = b_factor(uint8_t(sb), nan);
      return sa <= max_sa ? block_fast(s, sa_factor(uint8_t(sa)), fb) : block_edge(s, uint8_t(sa), fb, uint8_t(sb));
    };
    size_t bad = 0, n = 0, nonzero = 0, subnormal = 0;
    for (int32_t S : sums)
      for (int sa = 0; sa < 256; ++sa)
        for (int sb = 0; sb < 256; ++sb)
          for (bool nan : {false, true}) {
            const float got = fast_value(S, sa, sb, nan, kBlockFastMaxSa);
            const float want = nan ? f32_from_bits(kCanonicalNan) : scale_block(round_block_sum(S, 10), uint8_t(sa), uint8_t(sb));
            bad += is_nan(want) ? !is_nan(got) : f32_bits(got) != f32_bits(want);
            ++n, nonzero += !is_nan(want) && want != 0.0f;
            subnormal += !is_nan(want) && want != 0.0f && std::fabs(want) < 1.17549435e-38f;
          }
    CHECK(bad == 0);
    CHECK(n == 2u * 10 * 65536);
    CHECK(nonzero > n / 4);
    CHECK(subnormal > 0);
    for (int sa = 0; sa <= kBlockFastMaxSa; ++sa)  // sa_factor is pow2_f32(sa - 127), the subnormal 2^-127 included
      CHECK(f32_bits(sa_factor(uint8_t(sa))) == f32_bits(pow2_f32(sa - 127)));
    // planted: block_fast one scale further (sa 228) overflows where the model does not
    size_t caught = 0;
    for (int32_t S : sums)
      for (int sb = 0; sb < 256; ++sb)
        caught += f32_bits(fast_value(S, 228, sb, false, 228)) != f32_bits(scale_block(round_block_sum(S, 10), 228, uint8_t(sb)));
    CHECK(caught > 0);
  }

  TEST_CASE("host emulation of the m16n8k32 fragments: E2M1 x E4M3 tiles") {
    const std::vector<Tile> tiles = all_tiles(Pair::F4F8, 200, 1);
    size_t nonzero = 0;
    CHECK(tile_mismatches(Pair::F4F8, tiles, &nonzero) == 0);
    CHECK(nonzero > tiles.size() * 64);  // the outputs are not trivially zero
    std::printf("exact_mma F4F8: %zu tiles (%zu outputs) bit-exact in emulation\n", tiles.size(), tiles.size() * 128);
  }

  TEST_CASE("host emulation of the m16n8k32 fragments: E4M3 x E4M3 tiles") {
    const std::vector<Tile> tiles = all_tiles(Pair::F8F8, 200, 2);
    size_t nonzero = 0;
    CHECK(tile_mismatches(Pair::F8F8, tiles, &nonzero) == 0);
    CHECK(nonzero > tiles.size() * 64);
    std::printf("exact_mma F8F8: %zu tiles (%zu outputs) bit-exact in emulation\n", tiles.size(), tiles.size() * 128);
  }

  TEST_CASE("E4M3 x E4M3 from codes decoded as they load: the 8t k order and 5 accumulators") {
    // every E4M3 code at every k position of A and of B, the special tiles, 200 random
    const std::vector<Tile> tiles = all_tiles(Pair::F8F8, 200, 3);
    size_t nonzero = 0;
    CHECK(loaded_f8f8_mismatches(tiles, false, &nonzero) == 0);
    CHECK(nonzero > tiles.size() * 64);
    // planted: B's registers swapped (codes 8t .. 8t + 3 against A's 8t + 4 .. 8t + 7)
    CHECK(loaded_f8f8_mismatches(tiles, true, nullptr) > 0);
    // byte_perm's host form: the 4 selectors the decode uses, every byte
    for (uint32_t sel : {0x5140u, 0x0062u, 0x5410u, 0x7632u}) {
      const uint32_t x = 0x03020100u, y = 0x07060504u, p = byte_perm(x, y, sel);
      for (int i = 0; i < 4; ++i) CHECK(((p >> (8 * i)) & 0xFFu) == ((sel >> (4 * i)) & 7u));
    }
    std::printf("exact_mma F8F8 as loaded: %zu tiles (%zu outputs) bit-exact in emulation\n", tiles.size(), tiles.size() * 128);
  }

  TEST_CASE("planted: a wrong fragment map or limb weight is caught") {
    Rng r{7};
    std::vector<Tile> tiles;
    for (int i = 0; i < 4; ++i) tiles.push_back(random_tile(Pair::F8F8, r));
    // a B fragment with its two registers swapped (k 0..15 <-> 16..31)
    size_t caught = 0;
    for (const Tile& t : tiles) {
      FragA a[3][kLanes];
      FragB b[3][kLanes];
      for (int l = 0; l < kLanes; ++l) {
        FragA la[3];
        FragB lb[3];
        lane_frags(Pair::F8F8, t, l, la, lb);
        for (int m = 0; m < 3; ++m) a[m][l] = la[m], b[m][l] = lb[m], std::swap(b[m][l].r[0], b[m][l].r[1]);
      }
      FragC d[3][3][kLanes] = {};
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) mma_s8_warp(d[i][j], a[i], b[j]);
      for (int l = 0; l < kLanes; ++l)
        for (int i = 0; i < 4; ++i) {
          int32_t D[3][3];
          for (int x = 0; x < 3; ++x)
            for (int y = 0; y < 3; ++y) D[x][y] = d[x][y][l].r[i];
          const int rr = c_row(l, i), c = c_col(l, i);
          const float v = finish_block64(combine_f8f8(D), 18, t.sa[rr], t.sb[c], row_nan(Pair::F8F8, t.a[rr]) || col_nan(t.b[c]));
          caught += f32_bits(v) != model_value(Pair::F8F8, t, rr, c);
        }
    }
    CHECK(caught > 0);
    // a limb weight of 127 instead of 128
    size_t caught2 = 0;
    for (int c = 0; c < 256; ++c) {
      const Limbs l = e4m3_limbs(uint8_t(c));
      caught2 += int32_t(l.d[0]) + 127 * int32_t(l.d[1]) + 16384 * int32_t(l.d[2]) !=
                 (e4m3_is_nan(uint8_t(c)) ? 0 : e4m3_to_int_x512(uint8_t(c)));
    }
    CHECK(caught2 > 0);
  }
}
