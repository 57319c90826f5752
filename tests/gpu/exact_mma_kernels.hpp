// exact_mma_kernels.hpp -- the GPU side of the exact tensor-core dot tests: the tiles of
// tests/gpu/exact_mma_cases.hpp through device/exact_mma.hpp on the device, one warp a tile.
// Plain C++ (the launcher is in exact_mma_kernels.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tests/gpu/exact_mma_cases.hpp"

namespace k4::gpu {

// out[n * 128 + r * 8 + c]: the bits of tile n's block value (row r, column c). gather: the
// shuffle form mma_s8_gather (AMD's path) instead of mma_s8 (mma.sync on NVIDIA).
void exact_mma_tiles(xmma::Pair p, bool gather, const xmma::Tile* tiles, size_t n, uint32_t* out);
// The PRMT pair decode on the device for every 16-bit selector (4 E2M1 codes): p[i], q[i].
void e2m1_pq_all(uint32_t* p, uint32_t* q);

}  // namespace k4::gpu
