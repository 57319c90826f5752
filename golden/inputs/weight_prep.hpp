// weight_prep.hpp -- the conversions a deployment applies to the checkpoint's tensors before
// K4 reads them, bit for bit (../shared/design/VARIANTS.md §8, "Weight preparation in
// deployments"). Each rule has a name that goldens record (attribute weight_prep) and
// docs/golden-format.md lists.
//
//  o_proj "ptpc-fp8-vllm" (§8.1): on each rank's own (hidden, o_k) shard, per output row:
//    amax  = fmaxf reduction of |x| from 0 (x the f32 of the stored value);
//    scale = fmaxf(amax / 448.0f, 1.0f / (448.0f * 512.0f))   (f32 division; floor 0x36924925);
//    code  = E4M3(fmaxf(fminf(x / scale, 448), -448))          (true f32 division, RNE).
//  o_proj from MXFP8 "mxfp8-dequant" first: x = e4m3(code) * 2^(scale_byte - 127), exact in f32.
//  router gate "f32-to-bf16-rne" (§8.2): RNE on the 16 dropped bits (NaN -> 0x7FC0).
//  experts from BF16 "mxfp4-even" (§8.3, Quark / aiter _mxfp4_quant_op): per 32-block along
//    the input dimension, A = f32_from_bits((bits(amax) + 0x200000) & 0xFF800000),
//    e = floor(log2 A) - 2 clamped to [-127, 127] (A = 0: -127), scale byte e + 127,
//    code = E2M1 RNE saturating of x * 2^-e; "mxfp4-floor": the OCP rule e = floor(log2 amax) - 2.
//  Packing: byte j = code(x[2j]) | code(x[2j+1]) << 4 (the even element low).
#pragma once
#include <cstdint>
#include <string>

namespace k4::prep {

constexpr uint32_t kPtpcMinScaleBits = 0x36924925u;  // f32(1 / (448 * 512))

enum class MxScale { Even, Floor };
const char* mx_scale_name(MxScale m);               // "mxfp4-even" / "mxfp4-floor"
MxScale mx_scale_from(const std::string& s);        // "even" | "floor"

// One rank's row of n values -> n E4M3 codes; returns the row's f32 scale.
float ptpc_fp8_row(const float* x, int n, uint8_t* codes);

// One 32-block -> 32 E2M1 codes (sign in bit 3) and its E8M0 scale byte.
uint8_t mxfp4_block(const float* v, MxScale rule, uint8_t* nib32);
// A row of n values (n % 32 == 0) -> n / 2 packed bytes and n / 32 scale bytes.
void mxfp4_row(const float* x, int n, MxScale rule, uint8_t* packed, uint8_t* scales);

// An MXFP8 element: e4m3(code) * 2^(scale - 127), exact (scale 255 is NaN).
float mxfp8_value(uint8_t code, uint8_t scale);

}  // namespace k4::prep
