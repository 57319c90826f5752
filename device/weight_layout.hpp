// weight_layout.hpp -- the expert weights (packed E2M1 rows of w13 and w2) laid out for the
// integer tensor-core kernels, and the exact inverse to the logical row-major layout.
//
// The kernels' A fragment (device/exact_mma.hpp, m16n8k32) gives lane t of a quad 8 of a
// block's 32 codes for each of its rows. A block's order of products cannot change its exact
// sum, so lane t takes the block's logical codes 8t .. 8t+7 (one 4-byte word of the 16-byte
// block: A registers 0 / 2 hold codes 8t..8t+3 / 8t+4..8t+7, and the B side is built in the same
// k order). To make that one 16-byte load a lane for 4 blocks, every 64-byte group of a row
// (4 blocks of 16 bytes, 4 words each) is stored word-transposed:
//     kernel byte 64 G + 16 t + 4 j + x  =  logical byte 64 G + 16 j + 4 t + x
// (lane t's 16 bytes are word t of blocks 4G .. 4G+3). A 4 x 4 transpose of words is its own
// inverse; nibbles and bytes are moved, never changed (-0 stays -0). Row lengths must be
// multiples of 64 bytes (hidden and inter are multiples of 128: Config::validate).
// The E8M0 scales keep the logical layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/numerics/hd.hpp"

namespace k4 {

constexpr size_t kLayoutGroup = 64;  // bytes: 4 blocks of 32 packed E2M1 codes

// The logical byte that kernel byte i of a row holds (and, the map being an involution, the
// kernel byte that logical byte i goes to).
K4_HD size_t fragment_order_byte(size_t i) {
  const size_t g = i / 64, t = (i / 16) % 4, j = (i / 4) % 4, x = i % 4;
  return g * 64 + j * 16 + t * 4 + x;
}

// rows x row_bytes, logical -> kernel order (or back: the same map).
inline std::vector<uint8_t> to_fragment_order(const std::vector<uint8_t>& in, size_t row_bytes) {
  if (row_bytes == 0 || row_bytes % kLayoutGroup != 0 || in.size() % row_bytes != 0)
    throw std::invalid_argument("to_fragment_order: " + std::to_string(in.size()) + " bytes are not rows of " +
                                std::to_string(row_bytes) + " bytes, a multiple of 64");
  std::vector<uint8_t> out(in.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = in[(i / row_bytes) * row_bytes + fragment_order_byte(i % row_bytes)];
  return out;
}
inline std::vector<uint8_t> from_fragment_order(const std::vector<uint8_t>& in, size_t row_bytes) {
  return to_fragment_order(in, row_bytes);  // an involution
}

}  // namespace k4
