// numerics_kernels.cu -- the kernels and host launchers of numerics_kernels.hpp.
//
// One thread an element (grid-stride); each kernel calls the same apply_* dispatcher the
// host reference calls. Built with nvcc (--fmad=false, IEEE division and square root, no
// flush-to-zero) and with hipcc (-ffp-contract=off).
#include "device/compat.hpp"
#include "tests/gpu/numerics_kernels.hpp"

#include <algorithm>

namespace k4::gpu {
namespace {

constexpr int kThreads = 256;

// A grid of at most 65536 blocks; the kernels stride over the rest.
dim3 grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return dim3(unsigned(std::min<size_t>(std::max<size_t>(blocks, 1), 65536)));
}

__global__ void unary_kernel(int op, uint32_t first, uint64_t n, uint32_t* out) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t j = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride)
    out[j] = apply_unary(UnaryOp(op), uint32_t(first + uint32_t(j)));
}

__global__ void binary_kernel(int op, const uint32_t* a, const uint32_t* b, uint64_t n, uint32_t* out) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t j = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride)
    out[j] = apply_binary(BinaryOp(op), a[j], b[j]);
}

__global__ void fdot2_kernel(const uint32_t* a, const uint32_t* b, const uint32_t* c, uint64_t n, uint32_t* out) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t j = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride)
    out[j] = apply_fdot2(a[j], b[j], c[j]);
}

// sa_ / sb_ strides are 0 for an operand the caller left out (nullptr: all zero bytes).
__global__ void block_kernel(int op, const uint8_t* a, uint64_t a_stride, const uint8_t* sa, uint64_t sa_stride,
                             const uint8_t* b, uint64_t b_stride, const uint8_t* sb, uint64_t sb_stride,
                             const uint32_t* c, uint64_t n, uint32_t* out) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t j = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride)
    out[j] = apply_block(BlockOp(op), a + j * a_stride, sa + j * sa_stride, b + j * b_stride, sb + j * sb_stride, c[j]);
}

__global__ void mx8_block_kernel(const uint32_t* v, uint64_t nblocks, uint8_t* q, uint8_t* e) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t j = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < nblocks; j += stride)
    e[j] = apply_mx8_block(v + 32 * j, q + 32 * j);
}

template <class T>
DeviceBuffer<T> to_device(const T* host, size_t n) {
  DeviceBuffer<T> d(n);
  d.upload(host, n);
  return d;
}

void finish() {
  K4_HIP_CHECK_LAUNCH();
  K4_HIP_CHECK(hipDeviceSynchronize());
}

}  // namespace

void unary_sweep(UnaryOp op, uint32_t first, size_t n, uint32_t* out) {
  if (n == 0) return;
  if (n > (size_t(1) << 31)) throw std::invalid_argument("unary_sweep: n > 2^31");
  DeviceBuffer<uint32_t> d(n);
  hipLaunchKernelGGL(unary_kernel, grid_for(n), dim3(kThreads), 0, 0, int(op), first, uint64_t(n), d.get());
  finish();
  d.download(out, n);
}

void binary_map(BinaryOp op, const uint32_t* a, const uint32_t* b, size_t n, uint32_t* out) {
  if (n == 0) return;
  auto da = to_device(a, n), db = to_device(b, n);
  DeviceBuffer<uint32_t> d(n);
  hipLaunchKernelGGL(binary_kernel, grid_for(n), dim3(kThreads), 0, 0, int(op), da.get(), db.get(), uint64_t(n), d.get());
  finish();
  d.download(out, n);
}

void fdot2_map(const uint32_t* a, const uint32_t* b, const uint32_t* c, size_t n, uint32_t* out) {
  if (n == 0) return;
  auto da = to_device(a, n), db = to_device(b, n), dc = to_device(c, n);
  DeviceBuffer<uint32_t> d(n);
  hipLaunchKernelGGL(fdot2_kernel, grid_for(n), dim3(kThreads), 0, 0, da.get(), db.get(), dc.get(), uint64_t(n), d.get());
  finish();
  d.download(out, n);
}

void block_map(BlockOp op, const uint8_t* a, const uint8_t* sa, const uint8_t* b, const uint8_t* sb,
               const uint32_t* c, size_t n, uint32_t* out) {
  if (n == 0) return;
  // One zero item stands in for every operand the caller left out (stride 0).
  DeviceBuffer<uint8_t> zeros(kBlockA);
  K4_HIP_CHECK(hipMemset(zeros.get(), 0, kBlockA));
  auto operand = [&](const uint8_t* host, size_t per_item, uint64_t& stride) {
    stride = host != nullptr ? per_item : 0;
    return host != nullptr ? to_device(host, n * per_item) : DeviceBuffer<uint8_t>();
  };
  uint64_t as = 0, bs = 0, sas = 0, sbs = 0;
  auto da = operand(a, kBlockA, as), db = operand(b, kBlockA, bs);
  auto dsa = operand(sa, kBlockS, sas), dsb = operand(sb, kBlockS, sbs);
  auto ptr = [&](const DeviceBuffer<uint8_t>& d, uint64_t stride) -> const uint8_t* {
    return stride != 0 ? d.get() : zeros.get();
  };
  auto dc = to_device(c, n);
  DeviceBuffer<uint32_t> d(n);
  hipLaunchKernelGGL(block_kernel, grid_for(n), dim3(kThreads), 0, 0, int(op), ptr(da, as), as, ptr(dsa, sas), sas,
                     ptr(db, bs), bs, ptr(dsb, sbs), sbs, dc.get(), uint64_t(n), d.get());
  finish();
  d.download(out, n);
}

void mx8_block_map(const uint32_t* v, size_t nblocks, uint8_t* q, uint8_t* e) {
  if (nblocks == 0) return;
  auto dv = to_device(v, nblocks * 32);
  DeviceBuffer<uint8_t> dq(nblocks * 32), de(nblocks);
  hipLaunchKernelGGL(mx8_block_kernel, grid_for(nblocks), dim3(kThreads), 0, 0, dv.get(), uint64_t(nblocks), dq.get(),
                     de.get());
  finish();
  dq.download(q, nblocks * 32);
  de.download(e, nblocks);
}

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  K4_HIP_CHECK(hipHostMalloc(&p, bytes > 0 ? bytes : 1, hipHostMallocDefault));
  return p;
}

void pinned_free(void* p) {
  if (p != nullptr) K4_HIP_CHECK(hipHostFree(p));
}

const char* name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Bf16Rne: return "bf16_bits_rne";
    case UnaryOp::E4m3Sat: return "e4m3_bits(Saturate)";
    case UnaryOp::E4m3NoSat: return "e4m3_bits(NoSaturate)";
    case UnaryOp::E2m1RneSat: return "e2m1_bits_rne_sat";
    case UnaryOp::Exp2: return "exp2_approx";
    case UnaryOp::Rcp: return "rcp_approx";
    case UnaryOp::Rsq: return "rsq_approx";
    case UnaryOp::Sigmoid: return "sigmoid_approx";
    case UnaryOp::Mx8ScaleE: return "mx8_scale_of_amax.e";
    case UnaryOp::Mx8ScaleInv: return "mx8_scale_of_amax.inv";
    case UnaryOp::CanonNan: return "canon_nan";
    case UnaryOp::Bf16ToF32: return "bf16_to_f32";
    case UnaryOp::E4m3ToF32: return "e4m3_to_f32";
    case UnaryOp::E8m0ToF32: return "e8m0_to_f32";
    case UnaryOp::E2m1ToF32: return "e2m1_to_f32";
    default: return "?";
  }
}

const char* name(BinaryOp op) {
  switch (op) {
    case BinaryOp::FmaxIeee: return "fmax_ieee";
    case BinaryOp::FminIeee: return "fmin_ieee";
    case BinaryOp::Mx8Quant: return "mx8_quant";
    case BinaryOp::Bf16Pair: return "bf16_pair";
    default: return "?";
  }
}

const char* name(BlockOp op) {
  switch (op) {
    case BlockOp::DotE4m3: return "block_dot_e4m3";
    case BlockOp::DotE2m1E4m3: return "block_dot_e2m1_e4m3";
    case BlockOp::ScaleBlock: return "scale_block";
    case BlockOp::MmaFp8K32: return "mma_fp8_k32";
    case BlockOp::MmaFp8K128Unit: return "mma_fp8_k128_unit";
    case BlockOp::MmaF4F8K128: return "mma_f4f8_k128";
    case BlockOp::MmaF8F8K128: return "mma_f8f8_k128";
    default: return "?";
  }
}

bool result_is_f32(UnaryOp op) {
  switch (op) {
    case UnaryOp::Bf16Rne:
    case UnaryOp::E4m3Sat:
    case UnaryOp::E4m3NoSat:
    case UnaryOp::E2m1RneSat:
    case UnaryOp::Mx8ScaleE: return false;
    default: return true;
  }
}

bool result_is_f32(BinaryOp op) { return op == BinaryOp::FmaxIeee || op == BinaryOp::FminIeee; }

uint64_t domain_size(UnaryOp op) {
  switch (op) {
    case UnaryOp::Bf16ToF32: return uint64_t(1) << 16;
    case UnaryOp::E4m3ToF32:
    case UnaryOp::E8m0ToF32: return 256;
    case UnaryOp::E2m1ToF32: return 16;
    default: return uint64_t(1) << 32;
  }
}

}  // namespace k4::gpu
