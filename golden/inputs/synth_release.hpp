// synth_release.hpp -- a synthetic checkpoint directory in a published release's layout
// (`k4 synth --layout bf16|mxfp8|mxfp4`; ../shared/design/CHECKPOINTS.md): config.json with
// text_config, model.safetensors.index.json and four shards
//   1: vision and dense layers 0..2 (mlp.gate_proj / up_proj / down_proj) and one tensor
//      of a dtype no reader here knows (F8_E4M3FNUZ)
//   2: layer 3's attention tensors K4 never reads, its norm, o_proj, gate, bias, experts of
//      the first half
//   3: layer 3's other experts and the shared expert
//   4: layer 4 (small size only; the full size writes layers 0..3 of its 60)
// Names: `language_model.model.layers.{L}.`, the shared expert as shared_experts.gate_proj /
// up_proj / down_proj, scales weight_scale_inv (mxfp8) or weight_scale (mxfp4).
// Values: the same for every layout (keys from the k4 names, golden/inputs/synth.hpp):
//  - experts: synthetic MXFP4 codes and scales whose every 32-block holds a magnitude of 4 or
//    6 (its first element is made 4 where none is), so that MXFP4 -> BF16 -> MXFP4 by either
//    scale rule gives the codes back: the bf16 layout stores their exact values, the mxfp4
//    layout the codes, the mxfp8 layout E4M3 codes of the same values with their scales;
//  - o_proj BF16 N(0, 0.02) (rows i % 97 == 5 times 2^-12: the scale floor binds), for the
//    mxfp8 layout as E4M3 with E8M0 1x32 scales (synthetic codes, scales 2^-12 .. 2^-9);
//  - router gate F32 N(0, 0.02), norm weight BF16 N(0, 0.1), bias F32 N(0, 0.01).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "reference/config.hpp"

namespace k4::synth {

enum class Layout { Bf16, Mxfp8, Mxfp4 };
Layout layout_from(const std::string& s);  // "bf16" | "mxfp8" | "mxfp4"
const char* layout_name(Layout l);

struct ReleaseOptions {
  Layout layout = Layout::Mxfp4;
  bool full = false;   // full: minimax-m3-tp4's shapes, 60 layers in config.json (0..3 written)
  int tp = -1;         // -1: 4 full, 2 small
  uint64_t seed = 1;
};

// The model shape the directory describes (what its config.json gives back).
Config release_config(const ReleaseOptions& o);

// Writes DIR (a temporary directory renamed onto DIR when complete; an existing DIR is
// refused unless overwrite). progress(done, total) in bytes.
void write_release(const std::string& dir, const ReleaseOptions& o, bool overwrite,
                   const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace k4::synth
