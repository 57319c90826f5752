// exact_mma_kernels.cu -- one warp a tile: the lane's fragments, the limb MMAs, the lane's four
// block values (tests/gpu/exact_mma_cases.hpp's lane_frags and lane_outputs, the same code
// the host emulation runs around its mma_s8_warp).
#include "tests/gpu/exact_mma_kernels.hpp"

#include "device/compat.hpp"

namespace k4::gpu {
namespace {

using namespace k4::xmma;

__global__ void __launch_bounds__(128) tile_kernel(int pair, int gather, const Tile* tiles, size_t n, uint32_t* out) {
  const size_t w = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int l = int(threadIdx.x) % kLanes;
  if (w >= n) return;  // a whole warp (tiles are warp-aligned)
  const Pair p = Pair(pair);
  const Tile& t = tiles[w];
  FragA a[3];
  FragB b[3];
  lane_frags(p, t, l, a, b);
  FragC d[3][3] = {};
  const int na = p == Pair::F4F8 ? 1 : 3;
  for (int i = 0; i < na; ++i)
    for (int j = 0; j < 3; ++j) {
      if (gather) mma_s8_gather(d[i][j], a[i], b[j]);
      else mma_s8(d[i][j], a[i], b[j]);
    }
  lane_outputs(p, t, l, d, out + w * 128);
}

// Selector i with other codes above it (moe_fast.cu's a_pq passes whole words): the decode must
// read the low 16 bits only.
__global__ void pq_kernel(uint32_t* p, uint32_t* q) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 65536u) e2m1_pq4(i | (i * 0x9E37u + 0x5A5Au) << 16, p[i], q[i]);
}

}  // namespace

void e2m1_pq_all(uint32_t* p, uint32_t* q) {
  DeviceBuffer<uint32_t> dp(65536), dq(65536);
  hipLaunchKernelGGL(pq_kernel, dim3(256), dim3(256), 0, 0, dp.get(), dq.get());
  K4_HIP_CHECK(hipGetLastError());
  K4_HIP_CHECK(hipDeviceSynchronize());
  K4_HIP_CHECK(hipMemcpy(p, dp.get(), 65536 * sizeof(uint32_t), hipMemcpyDeviceToHost));
  K4_HIP_CHECK(hipMemcpy(q, dq.get(), 65536 * sizeof(uint32_t), hipMemcpyDeviceToHost));
}

void exact_mma_tiles(Pair p, bool gather, const Tile* tiles, size_t n, uint32_t* out) {
  if (n == 0) return;
  DeviceBuffer<Tile> d_tiles(n);
  DeviceBuffer<uint32_t> d_out(n * 128);
  d_tiles.upload(tiles, n);
  K4_HIP_CHECK(hipMemset(d_out.get(), 0xA5, n * 128 * sizeof(uint32_t)));  // poison
  const unsigned threads = 128, blocks = unsigned((n * kLanes + threads - 1) / threads);
  hipLaunchKernelGGL(tile_kernel, dim3(blocks), dim3(threads), 0, 0, int(p), gather ? 1 : 0, d_tiles.get(), n,
                     d_out.get());
  K4_HIP_CHECK(hipGetLastError());
  K4_HIP_CHECK(hipDeviceSynchronize());
  K4_HIP_CHECK(hipMemcpy(out, d_out.get(), n * 128 * sizeof(uint32_t), hipMemcpyDeviceToHost));
}

}  // namespace k4::gpu
