// synth.cpp -- see synth.hpp.
#include "golden/inputs/synth.hpp"

#include <algorithm>
#include <cstring>

#include "golden/inputs/hf_names.hpp"
#include "golden/io/safetensors.hpp"
#include "golden/format/schema.hpp"
#include "reference/numerics/bf16.hpp"

namespace k4::synth {

uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

uint64_t tensor_key(uint64_t seed, const std::string& name) { return splitmix64(seed ^ fnv1a64(name)); }

namespace {

// Magnitude codes of E2M1 (0, .5, 1, 1.5, 2, 3, 4, 6) by 7 random bits: weights 20, 30,
// 24, 18, 14, 12, 6, 4 (of 128), a rough bell over the code range.
struct Fp4Table {
  uint8_t nib[256];
  uint8_t pair[65536];  // two random bytes -> the packed byte (low byte: the low nibble)
  Fp4Table() {
    const int w[8] = {20, 30, 24, 18, 14, 12, 6, 4};
    uint8_t mag[128];
    int k = 0;
    for (int c = 0; c < 8; ++c)
      for (int j = 0; j < w[c]; ++j) mag[k++] = uint8_t(c);
    for (int u = 0; u < 256; ++u) nib[u] = uint8_t(((u >> 7) << 3) | mag[u & 127]);
    for (int u = 0; u < 65536; ++u) pair[u] = uint8_t(nib[u & 0xFF] | (nib[u >> 8] << 4));
  }
};
const Fp4Table kFp4;

inline uint8_t byte_of(uint64_t w, unsigned k) { return uint8_t(w >> (8 * k)); }

}  // namespace

void fp4_packed(uint64_t key, uint64_t begin, uint64_t n, uint8_t* out) {
  // byte b: word b / 4, its bytes 2 (b % 4) (low nibble) and 2 (b % 4) + 1 (high nibble)
  auto one = [&](uint64_t b, uint64_t w) {
    const unsigned k = unsigned(b % 4) * 2;
    return uint8_t(kFp4.nib[byte_of(w, k)] | (kFp4.nib[byte_of(w, k + 1)] << 4));
  };
  uint64_t b = begin, i = 0;
  for (; i < n && b % 4 != 0; ++i, ++b) out[i] = one(b, word(key, b / 4));
  for (; i + 4 <= n; i += 4, b += 4) {  // whole words: the hot loop
    const uint64_t w = word(key, b / 4);
    for (unsigned k = 0; k < 4; ++k) out[i + k] = kFp4.pair[(w >> (16 * k)) & 0xFFFFu];
  }
  for (; i < n; ++i, ++b) out[i] = one(b, word(key, b / 4));
}

void expert_scales(uint64_t key, uint64_t begin, uint64_t n, uint8_t* out) {
  uint64_t b = begin, i = 0;
  for (; i < n && b % 8 != 0; ++i, ++b) out[i] = uint8_t(121 + byte_of(word(key, b / 8), unsigned(b % 8)) % 4);
  for (; i + 8 <= n; i += 8, b += 8) {
    const uint64_t w = word(key, b / 8);
    for (unsigned k = 0; k < 8; ++k) out[i + k] = uint8_t(121 + byte_of(w, k) % 4);
  }
  for (; i < n; ++i, ++b) out[i] = uint8_t(121 + byte_of(word(key, b / 8), unsigned(b % 8)) % 4);
}

void e4m3_codes(uint64_t key, uint64_t begin, uint64_t n, uint8_t* out) {
  uint64_t b = begin, c = ~0ull, w = 0;
  for (uint64_t i = 0; i < n; ++i, ++b) {
    if (b / 8 != c) {
      c = b / 8;
      w = word(key, c);
    }
    uint8_t v = byte_of(w, unsigned(b % 8));
    if ((v & 0x7Fu) == 0x7Fu) v = uint8_t(v ^ 1u);  // NaN code -> +-448
    out[i] = v;
  }
}

void e4m3_weights(uint64_t key, uint64_t begin, uint64_t n, uint8_t* out) {
  e4m3_codes(key, begin, n, out);
  for (uint64_t i = 0; i < n; ++i) out[i] = uint8_t((out[i] & 0x80u) | ((out[i] & 0x7Fu) % 0x58u));
}

void row_scales(uint64_t key, uint64_t begin, uint64_t n, float* out) {
  for (uint64_t i = 0; i < n; ++i) {
    const double u = double(word(key, begin + i) >> 40) * (1.0 / 16777216.0);
    out[i] = float(1e-3 * (0.5 + u));
  }
}

namespace {
double normal_of(uint64_t w) {
  double s = 0;
  for (int k = 0; k < 4; ++k) s += (double((w >> (16 * k)) & 0xFFFFu) + 0.5) * (1.0 / 65536.0);
  return (s - 2.0) * 1.7320508075688772;
}
}  // namespace

void normal_bf16(uint64_t key, double sigma, uint64_t begin, uint64_t n, uint16_t* out) {
  for (uint64_t i = 0; i < n; ++i) out[i] = bf16_bits_rne(float(sigma * normal_of(word(key, begin + i))));
}
void normal_f32(uint64_t key, double sigma, uint64_t begin, uint64_t n, float* out) {
  for (uint64_t i = 0; i < n; ++i) out[i] = float(sigma * normal_of(word(key, begin + i)));
}
void gate_f32(uint64_t key, double sigma, uint64_t begin, uint64_t n, float* out) {
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t b;
    normal_bf16(key, sigma, begin + i, 1, &b);
    // below half a bf16 ulp: the RNE bf16 copy is b again; zeros, Inf and NaN stay exact
    const bool finite_nonzero = (b & 0x7FFFu) != 0 && (b & 0x7F80u) != 0x7F80u;
    const uint32_t low = finite_nonzero ? uint32_t(word(key ^ 0xF32F32F32ull, begin + i) & 0x7FFFu) : 0u;
    out[i] = f32_from_bits((uint32_t(b) << 16) | low);
  }
}

// ---- experts ---------------------------------------------------------------------------

SyntheticExpertSource::SyntheticExpertSource(const Config& cfg, uint64_t seed, int layer)
    : cfg_(cfg), seed_(seed), layer_(layer) {}

std::shared_ptr<ExpertWeights> SyntheticExpertSource::build(int rank, int e) const {
  const Config& c = cfg_;
  if (rank < 0 || rank >= c.tp || e < 0 || e > c.n_routed)
    throw std::invalid_argument("synthetic expert(" + std::to_string(rank) + ", " + std::to_string(e) +
                                ") is outside rank 0.." + std::to_string(c.tp - 1) + ", expert 0.." +
                                std::to_string(c.n_routed));
  const bool sh = e == c.shared_expert();
  const uint64_t H = uint64_t(c.hidden), I = uint64_t(c.inter), TI = uint64_t(c.tp) * I, r = uint64_t(rank);
  auto key = [&](hf::Tensor t) { return tensor_key(seed_, hf::name(t, layer_, e, sh)); };
  auto ew = std::make_shared<ExpertWeights>();
  if (c.expert_fp8(e)) {  // MXFP8 (V7, V6.1): the same slices, one E4M3 byte an element
    ew->w13.resize(2 * I * H);
    ew->s13.resize(2 * I * H / 32);
    ew->w2.resize(H * I);
    ew->s2.resize(H * I / 32);
    e4m3_weights(key(hf::Tensor::W1), r * I * H, I * H, ew->w13.data());
    e4m3_weights(key(hf::Tensor::W3), r * I * H, I * H, ew->w13.data() + I * H);
    expert_scales(key(hf::Tensor::W1Scale), r * I * (H / 32), I * H / 32, ew->s13.data());
    expert_scales(key(hf::Tensor::W3Scale), r * I * (H / 32), I * H / 32, ew->s13.data() + I * H / 32);
    const uint64_t k2 = key(hf::Tensor::W2), k2s = key(hf::Tensor::W2Scale);
    for (uint64_t i = 0; i < H; ++i) {
      e4m3_weights(k2, i * TI + r * I, I, ew->w2.data() + i * I);
      expert_scales(k2s, i * (TI / 32) + r * (I / 32), I / 32, ew->s2.data() + i * (I / 32));
    }
    return ew;
  }
  ew->w13.resize(2 * I * H / 2);
  ew->s13.resize(2 * I * H / 32);
  ew->w2.resize(H * I / 2);
  ew->s2.resize(H * I / 32);
  // w1 (gate) and w3 (up): rows [r*I, (r+1)*I) of (TI, H): contiguous ranges
  fp4_packed(key(hf::Tensor::W1), r * I * (H / 2), I * H / 2, ew->w13.data());
  fp4_packed(key(hf::Tensor::W3), r * I * (H / 2), I * H / 2, ew->w13.data() + I * H / 2);
  expert_scales(key(hf::Tensor::W1Scale), r * I * (H / 32), I * H / 32, ew->s13.data());
  expert_scales(key(hf::Tensor::W3Scale), r * I * (H / 32), I * H / 32, ew->s13.data() + I * H / 32);
  // w2: columns [r*I, (r+1)*I) of (H, TI): a range a row
  const uint64_t k2 = key(hf::Tensor::W2), k2s = key(hf::Tensor::W2Scale);
  for (uint64_t i = 0; i < H; ++i) {
    fp4_packed(k2, i * (TI / 2) + r * (I / 2), I / 2, ew->w2.data() + i * (I / 2));
    expert_scales(k2s, i * (TI / 32) + r * (I / 32), I / 32, ew->s2.data() + i * (I / 32));
  }
  return ew;
}

std::shared_ptr<const ExpertWeights> SyntheticExpertSource::expert(int rank, int e) const {
  return cache_.get(rank, e, [&] { return build(rank, e); });
}

// ---- the layer -------------------------------------------------------------------------

namespace {
constexpr double kGateSigma = 0.02, kNormSigma = 0.1, kBiasSigma = 0.01;
}

LayerWeights synthetic_layer(const Config& cfg, uint64_t seed, int layer) {
  const Config& c = cfg;
  c.validate();
  const uint64_t H = uint64_t(c.hidden), OK = uint64_t(c.o_k()), TOK = uint64_t(c.tp) * OK, E = uint64_t(c.n_routed);
  auto key = [&](hf::Tensor t) { return tensor_key(seed, hf::name(t, layer)); };
  LayerWeights lw;
  lw.cfg = cfg;
  RankWeights base;
  base.g_post.resize(H);
  base.w_gate.resize(E * H);
  base.w_gate_f32.resize(E * H);
  base.bias.resize(E);
  base.s_o.resize(H);
  normal_bf16(key(hf::Tensor::PostNorm), kNormSigma, 0, H, base.g_post.data());
  gate_f32(key(hf::Tensor::Gate), kGateSigma, 0, E * H, base.w_gate_f32.data());  // the checkpoint's F32 gate
  for (uint64_t i = 0; i < E * H; ++i) base.w_gate[i] = bf16_bits_rne(base.w_gate_f32[i]);
  normal_f32(key(hf::Tensor::Bias), kBiasSigma, 0, E, base.bias.data());
  row_scales(key(hf::Tensor::OProjScale), 0, H, base.s_o.data());
  const uint64_t ko = key(hf::Tensor::OProj);
  for (int r = 0; r < c.tp; ++r) {
    RankWeights w = base;
    w.w_o.resize(H * OK);
    for (uint64_t i = 0; i < H; ++i) e4m3_codes(ko, i * TOK + uint64_t(r) * OK, OK, w.w_o.data() + i * OK);
    lw.ranks.push_back(std::move(w));
  }
  lw.experts = std::make_shared<SyntheticExpertSource>(cfg, seed, layer);
  return lw;
}

// ---- the checkpoint file ---------------------------------------------------------------

namespace {

enum class Gen { Fp4, ExpertScale, E4m3, E4m3Weight, RowScale, NormalBf16, NormalF32, GateF32 };
struct Item {
  std::string name;
  st::SafetensorsDtype dtype;
  std::vector<int64_t> shape;
  Gen gen;
  double sigma = 0;
  uint64_t bytes() const {
    uint64_t n = st::dtype_size(dtype);
    for (int64_t d : shape) n *= uint64_t(d);
    return n;
  }
};

std::vector<Item> items(const Config& c, int layer) {
  const int64_t H = c.hidden, TOK = int64_t(c.tp) * c.o_k(), E = c.n_routed, TI = int64_t(c.tp) * c.inter;
  using T = hf::Tensor;
  std::vector<Item> v = {
      {hf::name(T::PostNorm, layer), st::SafetensorsDtype::BF16, {H}, Gen::NormalBf16, kNormSigma},
      {hf::name(T::OProj, layer), st::SafetensorsDtype::F8_E4M3, {H, TOK}, Gen::E4m3},
      {hf::name(T::OProjScale, layer), st::SafetensorsDtype::F32, {H}, Gen::RowScale},
      {hf::name(T::Gate, layer), st::SafetensorsDtype::F32, {E, H}, Gen::GateF32, kGateSigma},
      {hf::name(T::Bias, layer), st::SafetensorsDtype::F32, {E}, Gen::NormalF32, kBiasSigma},
  };
  for (int e = 0; e <= c.n_routed; ++e) {
    const bool sh = e == c.shared_expert();
    if (c.expert_fp8(e)) {  // MXFP8: F8_E4M3 weights (the MXFP8 release's dtype), U8 E8M0 scales
      v.push_back({hf::name(T::W1, layer, e, sh), st::SafetensorsDtype::F8_E4M3, {TI, H}, Gen::E4m3Weight});
      v.push_back({hf::name(T::W1Scale, layer, e, sh), st::SafetensorsDtype::U8, {TI, H / 32}, Gen::ExpertScale});
      v.push_back({hf::name(T::W3, layer, e, sh), st::SafetensorsDtype::F8_E4M3, {TI, H}, Gen::E4m3Weight});
      v.push_back({hf::name(T::W3Scale, layer, e, sh), st::SafetensorsDtype::U8, {TI, H / 32}, Gen::ExpertScale});
      v.push_back({hf::name(T::W2, layer, e, sh), st::SafetensorsDtype::F8_E4M3, {H, TI}, Gen::E4m3Weight});
      v.push_back({hf::name(T::W2Scale, layer, e, sh), st::SafetensorsDtype::U8, {H, TI / 32}, Gen::ExpertScale});
      continue;
    }
    v.push_back({hf::name(T::W1, layer, e, sh), st::SafetensorsDtype::U8, {TI, H / 2}, Gen::Fp4});
    v.push_back({hf::name(T::W1Scale, layer, e, sh), st::SafetensorsDtype::U8, {TI, H / 32}, Gen::ExpertScale});
    v.push_back({hf::name(T::W3, layer, e, sh), st::SafetensorsDtype::U8, {TI, H / 2}, Gen::Fp4});
    v.push_back({hf::name(T::W3Scale, layer, e, sh), st::SafetensorsDtype::U8, {TI, H / 32}, Gen::ExpertScale});
    v.push_back({hf::name(T::W2, layer, e, sh), st::SafetensorsDtype::U8, {H, TI / 2}, Gen::Fp4});
    v.push_back({hf::name(T::W2Scale, layer, e, sh), st::SafetensorsDtype::U8, {H, TI / 32}, Gen::ExpertScale});
  }
  return v;
}

// Elements [begin, begin + n) of one item into out (n * element size bytes).
void generate(const Item& it, uint64_t key, uint64_t begin, uint64_t n, uint8_t* out) {
  switch (it.gen) {
    case Gen::Fp4: fp4_packed(key, begin, n, out); break;
    case Gen::ExpertScale: expert_scales(key, begin, n, out); break;
    case Gen::E4m3: e4m3_codes(key, begin, n, out); break;
    case Gen::E4m3Weight: e4m3_weights(key, begin, n, out); break;
    case Gen::RowScale: row_scales(key, begin, n, reinterpret_cast<float*>(out)); break;
    case Gen::NormalBf16: normal_bf16(key, it.sigma, begin, n, reinterpret_cast<uint16_t*>(out)); break;
    case Gen::NormalF32: normal_f32(key, it.sigma, begin, n, reinterpret_cast<float*>(out)); break;
    case Gen::GateF32: gate_f32(key, it.sigma, begin, n, reinterpret_cast<float*>(out)); break;
  }
}

}  // namespace

uint64_t checkpoint_bytes(const Config& cfg) {
  uint64_t t = 0;
  for (const Item& it : items(cfg, 0)) t += it.bytes();
  return t;
}

void write_checkpoint(const std::string& path, const Config& cfg, uint64_t seed, int layer, bool overwrite,
                      const std::function<void(uint64_t, uint64_t)>& progress) {
  cfg.validate();
  st::Writer w(path, overwrite);
  const std::vector<Item> all = items(cfg, layer);
  for (const Item& it : all) w.declare(it.name, it.dtype, it.shape);
  w.set_metadata("format", "k4-synthetic");
  w.set_metadata("seed", std::to_string(seed));
  w.set_metadata("layer", std::to_string(layer));
  w.set_metadata("config", golden::config_to_json(cfg));
  w.begin();
  const uint64_t total = w.total_bytes();
  uint64_t done = 0;
  constexpr uint64_t kChunk = 1u << 24;  // 16 MiB in memory at a time
  constexpr uint64_t kPiece = 1u << 18;
  std::vector<uint8_t> buf(kChunk);
  for (const Item& it : all) {
    const uint64_t key = tensor_key(seed, it.name);
    const uint64_t esz = st::dtype_size(it.dtype), elems = it.bytes() / esz;
    const uint64_t per_chunk = kChunk / esz;
    for (uint64_t e0 = 0; e0 < elems; e0 += per_chunk) {
      const uint64_t n = std::min(per_chunk, elems - e0);
      const int64_t pieces = int64_t((n + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static)
      for (int64_t p = 0; p < pieces; ++p) {  // disjoint pieces: the same bytes for any thread count
        const uint64_t b = uint64_t(p) * kPiece, m = std::min<uint64_t>(kPiece, n - b);
        generate(it, key, e0 + b, m, buf.data() + b * esz);
      }
      w.write(buf.data(), n * esz);
      done += n * esz;
      if (progress) progress(done, total);
    }
  }
  w.finish();
}

}  // namespace k4::synth
