// test_weight_layout.cpp -- the expert weights' kernel layout (device/weight_layout.hpp): a
// permutation of bytes within each row with an exact inverse; every E2M1 code (-0 included)
// in both nibbles of every byte position survives the round trip; lane t of a quad finds the
// logical codes 8t .. 8t+7 of each of its 4 blocks in its 16 bytes.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "device/weight_layout.hpp"
#include "reference/numerics/e2m1.hpp"

using namespace k4;

TEST_SUITE("weight_layout") {
  TEST_CASE("fragment order: a permutation of each row, its own inverse") {
    for (size_t row_bytes : {64u, 384u, 3072u}) {
      std::vector<int> seen(row_bytes, 0);
      for (size_t i = 0; i < row_bytes; ++i) {
        const size_t j = fragment_order_byte(i);
        REQUIRE(j < row_bytes);
        ++seen[j];
        CHECK(fragment_order_byte(j) == i);
      }
      for (int s : seen) CHECK(s == 1);
    }
  }

  TEST_CASE("round trip of every code in both nibbles at every position, -0 included") {
    const size_t row_bytes = 384, rows = 3;
    std::vector<uint8_t> w(rows * row_bytes);
    for (int shift = 0; shift < 16; ++shift) {
      for (size_t i = 0; i < w.size(); ++i) w[i] = uint8_t(((i + shift) & 15) | (((i * 7 + shift) & 15) << 4));
      const std::vector<uint8_t> k = to_fragment_order(w, row_bytes);
      CHECK(k != w);  // it moves bytes
      CHECK(from_fragment_order(k, row_bytes) == w);
      std::vector<uint8_t> a(k), b(w);
      std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
      CHECK(a == b);  // the same multiset of bytes: nothing changed but the places
    }
    // -0 (code 8) in both nibbles keeps its bits
    std::vector<uint8_t> z(row_bytes, 0x88);
    z[5] = 0x08, z[70] = 0x80;
    CHECK(from_fragment_order(to_fragment_order(z, row_bytes), row_bytes) == z);
    CHECK(e2m1_to_int_x2(0x8) == 0);
  }

  TEST_CASE("lane t's 16 bytes are word t of blocks 4G .. 4G+3") {
    std::vector<uint8_t> w(3072);
    std::iota(w.begin(), w.end(), 0);  // byte i holds i % 256
    const std::vector<uint8_t> k = to_fragment_order(w, 3072);
    for (size_t G = 0; G < 48; ++G)
      for (size_t t = 0; t < 4; ++t)
        for (size_t j = 0; j < 4; ++j)
          for (size_t x = 0; x < 4; ++x)
            CHECK(k[G * 64 + t * 16 + j * 4 + x] == uint8_t((4 * G + j) * 16 + 4 * t + x));
    // planted: a layout that forgets the transpose fails the check above
    size_t caught = 0;
    for (size_t t = 0; t < 4; ++t)
      for (size_t j = 0; j < 4; ++j) caught += w[t * 16 + j * 4] != uint8_t(j * 16 + 4 * t);
    CHECK(caught > 0);
  }

  TEST_CASE("bad row lengths are refused") {
    std::vector<uint8_t> w(96);
    CHECK_THROWS_AS(to_fragment_order(w, 96), std::invalid_argument);
    CHECK_THROWS_AS(to_fragment_order(w, 64), std::invalid_argument);
  }
}
