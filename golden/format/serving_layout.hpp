// serving_layout.hpp -- the layouts of the serving stacks' K4 buffers (aiter, ATOM, vLLM:
// ../shared/design/VARIANTS.md 8.5) and their exact inverses, as index maps: for users whose
// buffers are shuffled and who hand the goldens' logical layout to k4.Weights.from_tensors
// (python: k4.layout), or who pack a logical KV cache into the golden's page layout.
//
// Every map is a permutation of byte positions: bytes are moved, never changed (E2M1 nibbles
// stay in their byte, -0 stays -0), and the inverse takes every byte back.
//
// - shuffle_weight (aiter shuffle_weight(layout=(16, 16))): a [mats][N][Kb] byte tensor (fp4
//   packed bytes or fp8 bytes; mats: experts, or 1 for w_o), each matrix on its own. Logical
//   byte (n, kb) goes to
//       ((((n/16)*(Kb/32) + kb/32)*2 + (kb/16)%2)*16 + n%16)*16 + kb%16
//   tiles of 16 rows x 32 bytes, row-group-major, each two 16 x 16-byte halves. N a multiple
//   of 16, Kb of 32. w13 per expert [1536][3072 B], w2 [6144][384 B], w_o [6144][2048 B].
// - shuffle_scale (aiter shuffle_scale, the non-interleaved branch): E8M0 scales as one [R][C]
//   matrix (R = experts * rows, C = K/32). Byte (r, c) goes to
//       (((((r/32)*(C/8) + c/8)*4 + c%4)*16 + r%16)*2 + (c/4)%2)*2 + (r/16)%2
//   R a multiple of 32, C of 8 (aiter pads to R % 256 and C % 8; no padding at K4's shapes).
// - kv_page (the page-16 "SHUFFLE" layout the goldens store, seed:L689-L716): a page of 16
//   keys of head_dim D (a multiple of 16) bytes. Logical K byte (t, d) (key t's row) goes to
//   (d/16)*256 + 16t + d%16; logical V byte (t, d) goes to 16d + t.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace k4::golden::layout {

// The offsets (within one matrix / one page) of the logical byte; the shapes checked.
size_t shuffle_weight_index(size_t n, size_t kb, size_t N, size_t Kb);
size_t shuffle_scale_index(size_t r, size_t c, size_t R, size_t C);
size_t kv_page_k_index(size_t t, size_t d, size_t D);
size_t kv_page_v_index(size_t t, size_t d, size_t D);

// Whole tensors, logical -> served and back. `bytes` holds mats (pages) of the given shape;
// std::invalid_argument names `what` and the shape that does not fit.
std::vector<uint8_t> shuffle_weight(const std::vector<uint8_t>& logical, size_t N, size_t Kb, const std::string& what);
std::vector<uint8_t> unshuffle_weight(const std::vector<uint8_t>& shuffled, size_t N, size_t Kb, const std::string& what);
std::vector<uint8_t> shuffle_scale(const std::vector<uint8_t>& logical, size_t R, size_t C, const std::string& what);
std::vector<uint8_t> unshuffle_scale(const std::vector<uint8_t>& shuffled, size_t R, size_t C, const std::string& what);
// KV: logical pages [page][16 keys][D] <-> the golden's page_byte order; v = false: K, true: V.
std::vector<uint8_t> kv_to_pages(const std::vector<uint8_t>& logical, size_t D, bool v, const std::string& what);
std::vector<uint8_t> kv_from_pages(const std::vector<uint8_t>& pages, size_t D, bool v, const std::string& what);

}  // namespace k4::golden::layout
