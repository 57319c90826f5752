// numerics_kernels.hpp -- every primitive of reference/numerics/ applied elementwise on the GPU.
//
// The GPU numerics suite (tests/gpu/test_numerics_gpu.cpp) runs each primitive on the device
// over a range of inputs and compares the bits with the same primitive run on the host. Both
// sides call the apply_* dispatchers below, which call the reference headers themselves:
// nothing numeric is written twice, so a mismatch means the *compilers or the hardware*
// disagree on the shared source (contraction, flush-to-zero, approximate division, ...).
//
// This header is plain C++ for the host (g++ includes it without any GPU headers); the
// launchers are defined in numerics_kernels.cu (nvcc or hipcc). Every value crosses the API as
// raw bits (uint32_t for f32), so no host float operation touches a device result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "reference/numerics/bf16.hpp"
#include "reference/numerics/e2m1.hpp"
#include "reference/numerics/e4m3.hpp"
#include "reference/numerics/e8m0.hpp"
#include "reference/numerics/hd.hpp"
#include "reference/numerics/mma.hpp"
#include "reference/numerics/mx.hpp"
#include "reference/numerics/policy.hpp"

namespace k4::gpu {

// ------------------------------------------------------------------------- unary primitives
// One f32 input (its bits) -> one result as bits. The decoders take the low bits of the input
// as the code (their domain is tiny: 256 or 16 inputs).
enum class UnaryOp : int {
  Bf16Rne,      // bf16_bits_rne(x)                              -> u16
  E4m3Sat,      // e4m3_bits(x, Saturate)                        -> u8
  E4m3NoSat,    // e4m3_bits(x, NoSaturate)                      -> u8
  E2m1RneSat,   // e2m1_bits_rne_sat(x)                          -> u4
  Exp2,         // exp2_approx(x)                                -> f32
  Rcp,          // rcp_approx(x)                                 -> f32
  Rsq,          // rsq_approx(x)                                 -> f32
  Sigmoid,      // sigmoid_approx(x)                             -> f32
  Mx8ScaleE,    // mx8_scale_of_amax(x).e                        -> u8
  Mx8ScaleInv,  // mx8_scale_of_amax(x).inv                      -> f32
  CanonNan,     // canon_nan(x)                                  -> f32
  Bf16ToF32,    // bf16_to_f32(code & 0xFFFF)                    -> f32
  E4m3ToF32,    // e4m3_to_f32(code & 0xFF)                      -> f32
  E8m0ToF32,    // e8m0_to_f32(code & 0xFF)                      -> f32
  E2m1ToF32,    // e2m1_to_f32(code & 0xF)                       -> f32
  kCount
};

K4_HD uint32_t apply_unary(UnaryOp op, uint32_t xb) {
  const float x = f32_from_bits(xb);
  switch (op) {
    case UnaryOp::Bf16Rne: return bf16_bits_rne(x);
    case UnaryOp::E4m3Sat: return e4m3_bits(x, Fp8Overflow::Saturate);
    case UnaryOp::E4m3NoSat: return e4m3_bits(x, Fp8Overflow::NoSaturate);
    case UnaryOp::E2m1RneSat: return e2m1_bits_rne_sat(x);
    case UnaryOp::Exp2: return f32_bits(exp2_approx(x));
    case UnaryOp::Rcp: return f32_bits(rcp_approx(x));
    case UnaryOp::Rsq: return f32_bits(rsq_approx(x));
    case UnaryOp::Sigmoid: return f32_bits(sigmoid_approx(x));
    case UnaryOp::Mx8ScaleE: return mx8_scale_of_amax(x).e;
    case UnaryOp::Mx8ScaleInv: return f32_bits(mx8_scale_of_amax(x).inv);
    case UnaryOp::CanonNan: return f32_bits(canon_nan(x));
    case UnaryOp::Bf16ToF32: return f32_bits(bf16_to_f32(uint16_t(xb & 0xFFFFu)));
    case UnaryOp::E4m3ToF32: return f32_bits(e4m3_to_f32(uint8_t(xb & 0xFFu)));
    case UnaryOp::E8m0ToF32: return f32_bits(e8m0_to_f32(uint8_t(xb & 0xFFu)));
    case UnaryOp::E2m1ToF32: return f32_bits(e2m1_to_f32(uint8_t(xb & 0xFu)));
    default: return 0xDEADBEEFu;
  }
}

// ------------------------------------------------------------------------ binary primitives
enum class BinaryOp : int {
  FmaxIeee,  // fmax_ieee(a, b)                                  -> f32
  FminIeee,  // fmin_ieee(a, b)                                  -> f32
  Mx8Quant,  // mx8_quant(a, inv = b)                            -> u8
  Bf16Pair,  // bf16_pair(lo = a, hi = b)                        -> u32 (two bf16)
  kCount
};

K4_HD uint32_t apply_binary(BinaryOp op, uint32_t ab, uint32_t bb) {
  const float a = f32_from_bits(ab), b = f32_from_bits(bb);
  switch (op) {
    case BinaryOp::FmaxIeee: return f32_bits(fmax_ieee(a, b));
    case BinaryOp::FminIeee: return f32_bits(fmin_ieee(a, b));
    case BinaryOp::Mx8Quant: return mx8_quant(a, b);
    case BinaryOp::Bf16Pair: return bf16_pair(a, b);
    default: return 0xDEADBEEFu;
  }
}

// fdot2_bf16(a_pair, b_pair, c) -> f32 bits.
K4_HD uint32_t apply_fdot2(uint32_t a_pair, uint32_t b_pair, uint32_t cb) {
  return f32_bits(fdot2_bf16(a_pair, b_pair, f32_from_bits(cb)));
}

// ------------------------------------------------------------------- block-exact dot products
// One item: A and B operand bytes (kBlockA / kBlockB each, unused tails ignored), four E8M0
// scales a side and an f32 accumulator / value c. Result: f32 bits.
enum class BlockOp : int {
  DotE4m3,        // block_dot_e4m3(a[0..32), b[0..32))
  DotE2m1E4m3,    // block_dot_e2m1_e4m3(a[0..16) packed FP4, b[0..32))
  ScaleBlock,     // scale_block(c, sa[0], sb[0])
  MmaFp8K32,      // mma_fp8_k32(c, a[0..32), b[0..32))
  MmaFp8K128Unit, // mma_fp8_k128_unit(c, a[0..128), b[0..128))
  MmaF4F8K128,    // mma_f4f8_k128(c, a[0..64) packed FP4, sa[0..4), b[0..128), sb[0..4))
  MmaF8F8K128,    // mma_f8f8_k128(c, a[0..128), sa[0..4), b[0..128), sb[0..4))
  kCount
};

constexpr int kBlockA = 128;   // operand bytes an item, each side
constexpr int kBlockS = 4;     // scale bytes an item, each side

K4_HD uint32_t apply_block(BlockOp op, const uint8_t* a, const uint8_t* sa, const uint8_t* b,
                           const uint8_t* sb, uint32_t cb) {
  const float c = f32_from_bits(cb);
  switch (op) {
    case BlockOp::DotE4m3: return f32_bits(block_dot_e4m3(a, b));
    case BlockOp::DotE2m1E4m3: return f32_bits(block_dot_e2m1_e4m3(a, b));
    case BlockOp::ScaleBlock: return f32_bits(scale_block(c, sa[0], sb[0]));
    case BlockOp::MmaFp8K32: return f32_bits(mma_fp8_k32(c, a, b));
    case BlockOp::MmaFp8K128Unit: return f32_bits(mma_fp8_k128_unit(c, a, b));
    case BlockOp::MmaF4F8K128: return f32_bits(mma_f4f8_k128(c, a, sa, b, sb));
    case BlockOp::MmaF8F8K128: return f32_bits(mma_f8f8_k128(c, a, sa, b, sb));
    default: return 0xDEADBEEFu;
  }
}

// mx8_quantize_block over one 32-block of f32 bits: 32 E4M3 codes and the E8M0 scale.
K4_HD uint8_t apply_mx8_block(const uint32_t* v_bits, uint8_t* q32) {
  float v[32];
  for (int i = 0; i < 32; ++i) v[i] = f32_from_bits(v_bits[i]);
  return mx8_quantize_block(v, q32);
}

// ------------------------------------------------------------------------------ descriptions
const char* name(UnaryOp op);
const char* name(BinaryOp op);
const char* name(BlockOp op);
// True when the result is an f32: such results compare NaN-equal (policy.hpp: a NaN's payload
// is not contract until canon_nan stores it; x86 keeps an operand's, NVIDIA makes 0x7FFFFFFF).
bool result_is_f32(UnaryOp op);
bool result_is_f32(BinaryOp op);
// The number of distinct inputs of a unary op: 2^32, or 2^16 / 256 / 16 for the decoders.
uint64_t domain_size(UnaryOp op);

// ------------------------------------------------------------------- host launchers (device)
// Each runs the kernel on the current device and copies the results back; every error
// throws std::runtime_error naming the call (K4_HIP_CHECK). Host pointers may be pageable or
// from pinned_alloc (faster copies).

// out[j] = apply_unary(op, first + j) (mod 2^32) for j < n; n <= 2^31.
void unary_sweep(UnaryOp op, uint32_t first, size_t n, uint32_t* out);
// out[j] = apply_binary(op, a[j], b[j]).
void binary_map(BinaryOp op, const uint32_t* a, const uint32_t* b, size_t n, uint32_t* out);
// out[j] = apply_fdot2(a[j], b[j], c[j]).
void fdot2_map(const uint32_t* a, const uint32_t* b, const uint32_t* c, size_t n, uint32_t* out);
// out[j] = apply_block(op, a + j*kBlockA, sa + j*kBlockS, b + j*kBlockA, sb + j*kBlockS, c[j]);
// a, sa, b or sb may be nullptr when op does not read it (all its bytes are then zero).
void block_map(BlockOp op, const uint8_t* a, const uint8_t* sa, const uint8_t* b, const uint8_t* sb,
               const uint32_t* c, size_t n, uint32_t* out);
// e[j] = apply_mx8_block(v + 32*j, q + 32*j).
void mx8_block_map(const uint32_t* v, size_t nblocks, uint8_t* q, uint8_t* e);

// Page-locked host memory (hipHostMalloc) for fast copies; pinned_free(nullptr) is a no-op.
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);

}  // namespace k4::gpu
