// test_simt.cpp -- the host emulation's threads (device/simt.hpp): what the fast kernels'
// emulation rests on. Coordinates, barriers, shuffles and the MMA collective give what the GPU
// would; a hang, divergent collectives and a collective after a lane exits stop the launch
// with an error that names them. (Not in the sanitizer runs: their stacks are fibers'.)
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/exact_mma.hpp"  // K4_HOST_EMULATION: mma_s8 is simt.hpp's collective

namespace {

using namespace k4::xmma;

struct Seen {
  std::vector<int>* hits;
};
__global__ void coordinates(Seen s) {
  const unsigned id = ((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x * blockDim.y +
                      threadIdx.y * blockDim.x + threadIdx.x;
  ++(*s.hits)[id];
}

__global__ void neighbours(int* out, int exit_from) {
  __shared__ int v[256];
  const int i = int(threadIdx.x), n = int(blockDim.x);
  if (i >= exit_from) return;  // exited threads are not waited for at the barrier
  v[i] = 1000 * int(blockIdx.x) + i;
  __syncthreads();
  out[blockIdx.x * blockDim.x + i] = v[(i + 1) % (exit_from < n ? exit_from : n)];
}

int lane_value(int lane) { return lane * lane + 1; }  // no symmetry a wrong partner could hide in
__global__ void shuffles(int* out) {
  const int lane = int(threadIdx.x) % 32;
  int s = lane_value(lane);
  for (int off = 16; off > 0; off /= 2) s += k4_shfl_xor(s, off, 32);  // the butterfly: every lane the sum
  out[threadIdx.x * 3] = s;
  out[threadIdx.x * 3 + 1] = k4_shfl(lane * 10, 3, 8);  // lane 3 of each 8-lane segment
  out[threadIdx.x * 3 + 2] = k4_shfl_xor(lane_value(lane), 5, 32);
}

struct MmaIn {
  const FragA* a;
  const FragB* b;
  FragC* d;
};
__global__ void mma_kernel(MmaIn m) {
  const int l = int(threadIdx.x);
  FragC d = m.d[l];
  mma_s8(d, m.a[l], m.b[l]);
  m.d[l] = d;
}

__global__ void dyn_fill(uint8_t* out) {
  K4_DYNAMIC_SMEM(dyn);
  if (threadIdx.x == 0) out[blockIdx.x] = dyn[7], dyn[7] = 0;  // each block sees fresh 0xA5s
}

__global__ void hang(int) {
  if (threadIdx.x == 0) __syncthreads();  // lane 0 at the barrier, its warp at a shuffle
  else (void)k4_shfl_xor(1, 1, 32);
}
__global__ void divergent(int) {
  if (threadIdx.x % 2 == 0) (void)k4_shfl_xor(1, 1, 32);
  else (void)k4_shfl(1, 0, 32);
}
__global__ void after_exit(int) {
  if (threadIdx.x == 5) return;
  (void)k4_shfl_xor(1, 1, 32);
}

std::string error_of(void (*kernel)(int), const char* name) {
  try {
    k4::simt::launch(name, kernel, dim3(2), dim3(64), 0, 0);
  } catch (const std::logic_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every thread of every block runs once, with its coordinates") {
  std::vector<int> hits(3 * 2 * 2 * 40 * 2, 0);
  k4::simt::launch("coordinates", coordinates, dim3(3, 2, 2), dim3(40, 2), 0, Seen{&hits});
  for (size_t i = 0; i < hits.size(); ++i) REQUIRE_MESSAGE(hits[i] == 1, "thread " << i);
}

TEST_CASE("a barrier orders the writes before it; exited threads are not waited for") {
  for (int exit_from : {256, 200, 33}) {
    std::vector<int> out(2 * 256, -1);
    k4::simt::launch("neighbours", neighbours, dim3(2), dim3(256), 0, out.data(), exit_from);
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < exit_from; ++i) REQUIRE(out[size_t(b * 256 + i)] == 1000 * b + (i + 1) % exit_from);
  }
}

TEST_CASE("shuffles: the xor butterfly and a source lane in segments of the width") {
  std::vector<int> out(64 * 3, -1);
  k4::simt::launch("shuffles", shuffles, dim3(1), dim3(64), 0, out.data());
  int total = 0;
  for (int l = 0; l < 32; ++l) total += lane_value(l);
  for (int t = 0; t < 64; ++t) {
    CHECK(out[size_t(t * 3)] == total);
    CHECK(out[size_t(t * 3 + 1)] == (t % 32 / 8 * 8 + 3) * 10);
    CHECK(out[size_t(t * 3 + 2)] == lane_value((t % 32) ^ 5));
  }
}

TEST_CASE("the MMA collective gives each lane mma_s8_warp's fragment") {
  std::mt19937 rng(7);
  FragA a[kLanes];
  FragB b[kLanes];
  FragC d[kLanes], want[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    for (uint32_t& r : a[l].r) r = uint32_t(rng());
    for (uint32_t& r : b[l].r) r = uint32_t(rng());
    for (int32_t& r : d[l].r) r = int32_t(rng() % 1000) - 500;
    want[l] = d[l];
  }
  mma_s8_warp(want, a, b);
  k4::simt::launch("mma", mma_kernel, dim3(1), dim3(32), 0, MmaIn{a, b, d});
  int differ = 0, moved = 0;
  for (int l = 0; l < kLanes; ++l)
    for (int i = 0; i < 4; ++i) differ += d[l].r[i] != want[l].r[i], moved += want[l].r[i] != 0;
  CHECK(differ == 0);
  CHECK(moved > 100);  // not trivial
}

TEST_CASE("the dynamic shared memory is 0xA5 bytes at each block's start") {
  std::vector<uint8_t> out(3, 0);
  k4::simt::launch("dyn_fill", dyn_fill, dim3(3), dim3(32), 64, out.data());
  for (uint8_t v : out) CHECK(v == 0xA5);
}

TEST_CASE("a hang, divergent collectives and a collective after an exit are errors naming the kernel") {
  const std::string h = error_of(hang, "hang"), d = error_of(divergent, "divergent"), x = error_of(after_exit, "after_exit");
  CHECK(h.find("kernel hang, block (0, 0, 0)") != std::string::npos);
  CHECK(h.find("hang on the GPU") != std::string::npos);
  CHECK(d.find("kernel divergent") != std::string::npos);
  CHECK(d.find("different collectives") != std::string::npos);
  CHECK(x.find("kernel after_exit") != std::string::npos);
  CHECK(x.find("after a lane of it has exited") != std::string::npos);
  std::vector<int> out(64 * 3, -1);  // and the next launch runs normally
  k4::simt::launch("shuffles", shuffles, dim3(1), dim3(64), 0, out.data());
  CHECK(out[2] == lane_value(5));
}
