// exact_mma_cases.hpp -- block tiles for the integer tensor-core dots (device/exact_mma.hpp):
// the cases, the model's answer and the fragments a warp loads, shared by the CPU suite (the
// host emulation of the fragments, tests/cpu/test_exact_mma.cpp) and the GPU suite (the
// mma.sync itself, tests/gpu/test_exact_mma_gpu.cpp). Plain C++.
//
// A tile is one m16n8k32 problem: 16 A rows x 8 B columns of one 32-element block each, every
// row with its E8M0 scale, every column with its own; its 128 outputs are the model's block
// values scale_block(block_dot(row, column), sa, sb) (reference/numerics/mma.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "device/exact_mma.hpp"
#include "reference/numerics/mma.hpp"

namespace k4::xmma {

enum class Pair : int { F4F8 = 0, F8F8 = 1 };  // A = E2M1 or E4M3; B is E4M3

struct Tile {
  uint8_t a[16][32];  // codes: E2M1 in the low nibble, or E4M3
  uint8_t sa[16];
  uint8_t b[8][32];  // E4M3 codes, column by column
  uint8_t sb[8];
};

// The model's block value (bits) of row r, column c.
inline uint32_t model_value(Pair p, const Tile& t, int r, int c) {
  float v;
  if (p == Pair::F4F8) {
    uint8_t w16[16];
    for (int i = 0; i < 16; ++i) w16[i] = uint8_t((t.a[r][2 * i] & 0xF) | (t.a[r][2 * i + 1] & 0xF) << 4);
    v = block_dot_e2m1_e4m3(w16, t.b[c]);
  } else {
    v = block_dot_e4m3(t.a[r], t.b[c]);
  }
  return f32_bits(scale_block(v, t.sa[r], t.sb[c]));
}

// A block's NaN flag as the kernel derives it from the codes (E2M1 has no NaN).
K4_HD bool row_nan(Pair p, const uint8_t* a32) {
  if (p == Pair::F4F8) return false;
  for (int k = 0; k < 32; ++k)
    if (e4m3_is_nan(a32[k])) return true;
  return false;
}
K4_HD bool col_nan(const uint8_t* b32) {
  for (int k = 0; k < 32; ++k)
    if (e4m3_is_nan(b32[k])) return true;
  return false;
}

// Lane l's fragments of the tile: A (1 for E2M1, 3 limbs for E4M3) and the 3 B limbs.
K4_HD void lane_frags(Pair p, const Tile& t, int l, FragA a[3], FragB b[3]) {
  for (int m = 0; m < 3; ++m) {
    for (int i = 0; i < 4; ++i) {
      int8_t v[4];
      for (int j = 0; j < 4; ++j) {
        const uint8_t code = t.a[a_row(l, i)][a_k(l, i, j)];
        v[j] = p == Pair::F4F8 ? (m == 0 ? e2m1_s8(code) : int8_t(0)) : e4m3_limbs(code).d[m];
      }
      a[m].r[i] = pack4(v[0], v[1], v[2], v[3]);
    }
    for (int i = 0; i < 2; ++i) {
      int8_t v[4];
      for (int j = 0; j < 4; ++j) v[j] = e4m3_limbs(t.b[b_col(l)][b_k(l, i, j)]).d[m];
      b[m].r[i] = pack4(v[0], v[1], v[2], v[3]);
    }
  }
}

// Lane l's 4 outputs from its limb products d[i][j] (A limb i x B limb j; E2M1 uses i = 0):
// the limb combination and finish_block, as the GPU kernel does them. out128[r * 8 + c]: bits.
K4_HD void lane_outputs(Pair p, const Tile& t, int l, const FragC d[3][3], uint32_t* out128) {
  for (int i = 0; i < 4; ++i) {
    const int r = c_row(l, i), c = c_col(l, i);
    const bool nan = row_nan(p, t.a[r]) || col_nan(t.b[c]);
    float v;
    if (p == Pair::F4F8) {
      const int32_t D[3] = {d[0][0].r[i], d[0][1].r[i], d[0][2].r[i]};
      v = finish_block32(combine_f4f8(D), 10, t.sa[r], t.sb[c], nan);
    } else {
      int32_t D[3][3];
      for (int x = 0; x < 3; ++x)
        for (int y = 0; y < 3; ++y) D[x][y] = d[x][y].r[i];
      v = finish_block64(combine_f8f8(D), 18, t.sa[r], t.sb[c], nan);
    }
    out128[r * 8 + c] = f32_bits(v);
  }
}

// The host emulation of the whole tile: fragments, the MMAs of mma_s8_warp, then
// lane_outputs -- the GPU kernel's steps, lane by lane. out[r][c]: bits.
inline void emulate_tile(Pair p, const Tile& t, uint32_t out[16][8]) {
  FragA a[3][kLanes];
  FragB b[3][kLanes];
  for (int l = 0; l < kLanes; ++l) {
    FragA la[3];
    FragB lb[3];
    lane_frags(p, t, l, la, lb);
    for (int m = 0; m < 3; ++m) a[m][l] = la[m], b[m][l] = lb[m];
  }
  FragC d[3][3][kLanes] = {};
  const int na = p == Pair::F4F8 ? 1 : 3;
  for (int i = 0; i < na; ++i)
    for (int j = 0; j < 3; ++j) mma_s8_warp(d[i][j], a[i], b[j]);
  for (int l = 0; l < kLanes; ++l) {
    FragC dl[3][3];
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) dl[i][j] = d[i][j][l];
    lane_outputs(p, t, l, dl, &out[0][0]);
  }
}

// ---- the cases
struct Rng {
  uint64_t s;
  uint64_t next() {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint8_t byte() { return uint8_t(next()); }
};

// E8M0 values that sit on the edges of the exact path: the smallest, the f32 subnormal and
// overflow boundaries of the scaled block, unity, the largest finite, NaN.
constexpr uint8_t kEdgeScales[] = {0, 1, 2, 10, 11, 12, 100, 126, 127, 128, 200, 227, 228, 229, 253, 254, 255};

inline uint8_t random_scale(Rng& r) {
  const uint64_t x = r.next();
  if (x % 4 == 0) return kEdgeScales[(x >> 8) % sizeof kEdgeScales];
  return uint8_t(107 + (x >> 8) % 40);  // the common range around 1
}

// Random codes (E4M3 NaN codes 0x7F / 0xFF about once a tile), random and edge scales.
inline Tile random_tile(Pair p, Rng& r) {
  Tile t;
  for (auto& row : t.a)
    for (auto& v : row) {
      v = p == Pair::F4F8 ? uint8_t(r.byte() & 0xF) : r.byte();
      if (p == Pair::F8F8 && e4m3_is_nan(v) && r.next() % 8) v ^= 1;  // fewer NaN rows
    }
  for (auto& col : t.b)
    for (auto& v : col) {
      v = r.byte();
      if (e4m3_is_nan(v) && r.next() % 8) v ^= 1;
    }
  for (auto& s : t.sa) s = random_scale(r);
  for (auto& s : t.sb) s = random_scale(r);
  return t;
}

// Every code in every lane position: tile (code, pos) puts `code` at k = pos of every B
// column (and of every A row, as an E4M3 code or its low nibble), the rest random, so each
// code passes through every register byte of every lane's fragments.
inline Tile code_at_tile(Pair p, Rng& r, uint8_t code, int pos) {
  Tile t = random_tile(p, r);
  for (auto& row : t.a) row[pos] = p == Pair::F4F8 ? uint8_t(code & 0xF) : code;
  for (auto& col : t.b) col[pos] = code;
  return t;
}

// Specials: all +-0 (a zero block is +0), all +-448 with alternating signs (cancellation),
// all at the maximum magnitude (the largest sums), a single NaN element, and every E8M0 pair
// of kEdgeScales over such blocks. One tile a kind: rows / columns vary the pattern.
inline std::vector<Tile> special_tiles(Pair p, Rng& r) {
  std::vector<Tile> v;
  const uint8_t max_a = p == Pair::F4F8 ? 0x7 : 0x7E, neg = p == Pair::F4F8 ? 0x8 : 0x80;
  for (int kind = 0; kind < 6; ++kind) {
    Tile t = random_tile(p, r);
    for (int i = 0; i < 16; ++i)
      for (int k = 0; k < 32; ++k) {
        uint8_t& a = t.a[i][k];
        switch (kind) {
          case 0: a = (i + k) % 2 ? neg : 0; break;                            // +-0
          case 1: a = uint8_t(max_a | ((k + i) % 2 ? neg : 0)); break;           // cancel
          case 2: a = uint8_t(max_a | (i % 2 ? neg : 0)); break;                 // largest
          case 3: a = uint8_t(i % 3 == 0 ? max_a : (i % 3 == 1 ? neg | max_a : 1)); break;
          default: break;
        }
      }
    for (int c = 0; c < 8; ++c)
      for (int k = 0; k < 32; ++k) {
        uint8_t& b = t.b[c][k];
        switch (kind) {
          case 0: b = (c + k) % 2 ? 0x80 : 0; break;
          case 1: b = uint8_t(0x7E | (c % 2 ? 0x80 : 0)); break;
          case 2: b = uint8_t(0x7E | (c % 2 ? 0x80 : 0)); break;
          case 3: b = uint8_t(c % 2 ? 0x01 : 0x81); break;  // the smallest subnormal
          case 4: b = k == c ? uint8_t(c % 2 ? 0xFF : 0x7F) : b; break;  // one NaN element
          default: break;
        }
      }
    v.push_back(t);
  }
  // every pair of edge scales over blocks that give large, small and zero sums
  const size_t n = sizeof kEdgeScales;
  for (size_t i = 0; i < n; i += 1) {
    Tile base = v[size_t(i % 4)];
    for (int rr = 0; rr < 16; ++rr) base.sa[rr] = kEdgeScales[i];
    for (size_t j0 = 0; j0 < n; j0 += 8) {
      Tile t = base;
      for (int c = 0; c < 8; ++c) t.sb[c] = kEdgeScales[(j0 + size_t(c)) % n];
      v.push_back(t);
    }
  }
  return v;
}

// The suite's whole set of tiles for one pair (the GPU and the CPU run the same list).
inline std::vector<Tile> all_tiles(Pair p, int n_random, uint64_t seed) {
  Rng r{seed ^ (p == Pair::F4F8 ? 0x4F4Full : 0x8F8Full)};
  std::vector<Tile> v = special_tiles(p, r);
  for (int code = 0; code < 256; ++code)  // B is E4M3 in both pairs; A takes the low nibble
    for (int pos = 0; pos < 32; ++pos) v.push_back(code_at_tile(p, r, uint8_t(code), pos));
  for (int i = 0; i < n_random; ++i) v.push_back(random_tile(p, r));
  return v;
}

}  // namespace k4::xmma
