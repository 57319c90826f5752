// test_numerics_gpu.cpp -- every primitive of reference/numerics/ on the GPU, bit for bit
// against the same primitive on the host.
//
// Unary primitives: all 2^32 f32 inputs (the decoders: all their codes), in device chunks of
// 2^K4_GPU_CHUNK_LOG2 (default 28), each compared on the host with OpenMP. Binary ones, the
// bf16 dot2, the block-exact dots / MMAs and the MXFP8 block quantizer: seeded random inputs
// mixed with adversarial ones (specials, ties, cancellation, NaN codes, extreme scales), and
// scale_block over every pair of E8M0 scales. The suite "gpu_compare" shows that the
// comparison itself can fail: planted one-bit errors are caught and reported.
//
// Every test prints one summary line; a failing one prints its first mismatches (index, input,
// device and host bits, decoded values, ULP distance).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/gpu/numerics_kernels.hpp"
#include "tests/gpu/compare.hpp"

namespace {

using namespace k4;
using namespace k4::gpu;
using namespace k4::gputest;

// ----------------------------------------------------------------------------- settings
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::atoi(v) : fallback;
}
bool quick() { return env_int("K4_GPU_QUICK", 0) != 0; }
size_t chunk_elems() {
  int lg = env_int("K4_GPU_CHUNK_LOG2", 28);
  lg = lg < 16 ? 16 : (lg > 30 ? 30 : lg);
  return size_t(1) << lg;
}
// Random-input counts: full, or a sample with K4_GPU_QUICK.
size_t count(size_t full) { return quick() ? (full >> 6 > 4096 ? full >> 6 : 4096) : full; }

struct Timer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double s() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

// Page-locked host array (fast device copies).
template <class T>
struct Pinned {
  explicit Pinned(size_t n) : n(n), p(static_cast<T*>(pinned_alloc(n * sizeof(T)))) {}
  ~Pinned() { pinned_free(p); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  size_t n;
  T* p;
};

void print(const std::string& s) {
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
}

std::string f32_desc(uint32_t b) { return hex32(b) + " (" + f32_text(b) + ")"; }

// --------------------------------------------------------------------------- random inputs
// Counter-based: item i of a seed is the same for any thread count.
uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
struct Rng {
  uint64_t s;
  Rng(uint64_t seed, uint64_t i) : s(splitmix(seed * 0xD1B54A32D192ED03ull + i)) {}
  uint64_t next() { return s = splitmix(s); }
  uint32_t u32() { return uint32_t(next() >> 32); }
  uint32_t below(uint32_t n) { return uint32_t((uint64_t(u32()) * n) >> 32); }
  bool one_in(uint32_t n) { return below(n) == 0; }
};

const uint32_t kSpecialF32[] = {
    0x00000000u, 0x80000000u, 0x3F800000u, 0xBF800000u, 0x00000001u, 0x80000001u, 0x007FFFFFu, 0x807FFFFFu,
    0x00800000u, 0x80800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
    0x7F800001u, 0xFFFFFFFFu, 0x7FFFFFFFu, 0x43E00000u /*448*/, 0x43E80000u /*464*/, 0x43E80001u, 0xC3E80000u,
    0x43DFFFFFu, 0x3A800000u /*2^-10*/, 0x3B000000u /*2^-9*/, 0x3E800000u /*.25*/, 0x3F400000u /*.75*/,
    0x3FA00000u /*1.25*/, 0x40A00000u /*5*/, 0x40C00000u /*6*/, 0x3F808000u /*bf16 tie*/, 0x3F818000u,
    0x7F7F8000u, 0x00400000u /*2^-127*/, 0x3B124925u /*~1/448*/, 0x42FE0000u, 0xC2FE0000u, 0x43480000u /*200*/,
    0xC3480000u, 0x42FC0000u /*126*/, 0xC3150000u /*-149*/, 0xC2FC0000u, 0x3FB8AA3Bu /*log2 e*/};
constexpr int kNumSpecial = int(sizeof(kSpecialF32) / sizeof(kSpecialF32[0]));

// A mix of uniform bits, specials, moderate values and rounding ties of every format here.
uint32_t gen_f32(Rng& r) {
  switch (r.below(6)) {
    case 0: return r.u32();
    case 1: return kSpecialF32[r.below(kNumSpecial)];
    case 2: {  // moderate: |x| in [2^-20, 2^20)
      const uint32_t e = 127 - 20 + r.below(40);
      return (r.u32() & 0x80000000u) | (e << 23) | (r.u32() & 0x7FFFFFu);
    }
    case 3: {  // a tie at a random bit position: ...1 followed by zeros
      const uint32_t e = 127 - 30 + r.below(60);
      const uint32_t k = r.below(23);
      const uint32_t m = ((r.u32() & 0x7FFFFFu) >> (k + 1) << (k + 1)) | (1u << k);
      return (r.u32() & 0x80000000u) | (e << 23) | m;
    }
    case 4: {  // near a power of two (exactly one, or one ulp off)
      const uint32_t e = 1 + r.below(254);
      uint32_t b = (r.u32() & 0x80000000u) | (e << 23);
      if (r.one_in(2)) b += r.one_in(2) ? 1u : 0xFFFFFFFFu;
      return b;
    }
    default: {  // subnormal or tiny
      return (r.u32() & 0x80000000u) | (r.u32() >> (9 + r.below(23)));
    }
  }
}

// A bf16 half: mostly moderate, with specials and random bits.
uint16_t gen_bf16(Rng& r) {
  switch (r.below(5)) {
    case 0: return uint16_t(r.u32());
    case 1: return uint16_t(gen_f32(r) >> 16);
    default: {
      const uint32_t e = 127 - 8 + r.below(16);
      return uint16_t(((r.u32() & 1u) << 15) | (e << 7) | (r.u32() & 0x7Fu));
    }
  }
}

// -------------------------------------------------------------------------- unary sweeps
void sweep_unary(UnaryOp op) {
  Timer t;
  const uint64_t domain = domain_size(op);
  const size_t chunk = size_t(domain < chunk_elems() ? domain : chunk_elems());
  // Quick mode: a window of 2^20 inputs in every chunk, at an offset that moves from chunk to
  // chunk (every sign and a spread of exponents).
  const size_t per_chunk = quick() ? (chunk < (size_t(1) << 20) ? chunk : (size_t(1) << 20)) : chunk;
  const Mode mode = result_is_f32(op) ? Mode::F32NanEqual : Mode::Bits;
  Pinned<uint32_t> dev(per_chunk);
  CompareResult all;
  uint64_t k = 0;
  for (uint64_t start = 0; start < domain; start += chunk, ++k) {
    const uint64_t offset = per_chunk < chunk ? ((k * 37) % (chunk / per_chunk)) * per_chunk : 0;
    const uint64_t lo = start + offset;
    const size_t n = size_t(domain - lo < per_chunk ? domain - lo : per_chunk);
    const uint32_t first = uint32_t(lo);
    unary_sweep(op, first, n, dev.p);
    all.merge(compare_bits(dev.p, n, lo, mode, [&](size_t j) { return apply_unary(op, first + uint32_t(j)); }));
  }
  const std::string rep = report(std::string(name(op)), all, mode, [](uint64_t i) { return "x=" + f32_desc(uint32_t(i)); });
  print(rep.substr(0, rep.find('\n')) + "  [" + std::to_string(t.s()).substr(0, 5) + " s]\n");
  CHECK_MESSAGE(all.mismatches == 0, rep);
  CHECK(all.checked == (quick() ? all.checked : domain));
  CHECK_MESSAGE(all.nonzero > 0, "all-zero device results: the test would prove nothing");
  CHECK_MESSAGE(all.varied, "constant device results: the test would prove nothing");
}

// ----------------------------------------------------------------- binary ops and fdot2
struct BinaryInputs {
  std::vector<uint32_t> a, b;
};

BinaryInputs make_binary(BinaryOp op, size_t n, uint64_t seed) {
  BinaryInputs in{std::vector<uint32_t>(n), std::vector<uint32_t>(n)};
#pragma omp parallel for schedule(static)
  for (int64_t si = 0; si < int64_t(n); ++si) {
    const size_t i = size_t(si);
    Rng r(seed, i);
    uint32_t a = gen_f32(r), b = gen_f32(r);
    if (op == BinaryOp::FmaxIeee || op == BinaryOp::FminIeee) {
      switch (r.below(5)) {
        case 0: b = a; break;
        case 1: b = a ^ 0x80000000u; break;  // +-0 and +-x
        case 2: b = a + (r.one_in(2) ? 1u : 0xFFFFFFFFu); break;
        default: break;
      }
    } else if (op == BinaryOp::Mx8Quant) {
      // inv as mx8_scale makes it: rcp(2^(e-127)); a: E4M3 codes and midpoints at that scale.
      const uint32_t e = r.one_in(8) ? 1 + r.below(254) : 127 - 30 + r.below(61);
      const float inv = rcp_approx(f32_from_bits(e << 23));
      b = f32_bits(inv);
      if (r.below(3) != 0) {
        const uint8_t code = uint8_t(r.below(0x7F));  // 0 .. 0x7E
        double v = e4m3_to_f32(code);
        if (r.one_in(2)) v = 0.5 * (v + double(e4m3_to_f32(uint8_t(code + 1 <= 0x7E ? code + 1 : code))));
        if (r.one_in(8)) v = 448.0 + double(r.below(64));  // past the clamp
        if (r.one_in(2)) v = -v;
        a = f32_bits(float(v * pow2_f64(int(e) - 127)));
      }
    }
    in.a[i] = a;
    in.b[i] = b;
  }
  return in;
}

void check_binary(BinaryOp op) {
  Timer t;
  const size_t n = count(size_t(1) << 24);
  const BinaryInputs in = make_binary(op, n, 1000 + uint64_t(op));
  std::vector<uint32_t> dev(n);
  binary_map(op, in.a.data(), in.b.data(), n, dev.data());
  const Mode mode = result_is_f32(op) ? Mode::F32NanEqual : Mode::Bits;
  const CompareResult r =
      compare_bits(dev.data(), n, 0, mode, [&](size_t j) { return apply_binary(op, in.a[j], in.b[j]); });
  const std::string rep = report(std::string(name(op)) + " (random + adversarial pairs)", r, mode, [&](uint64_t i) {
    return "a=" + f32_desc(in.a[i]) + " b=" + f32_desc(in.b[i]);
  });
  print(rep.substr(0, rep.find('\n')) + "  [" + std::to_string(t.s()).substr(0, 5) + " s]\n");
  CHECK_MESSAGE(r.mismatches == 0, rep);
  CHECK(r.nonzero > 0);
  CHECK(r.varied);
  if (mode == Mode::F32NanEqual) {
    CHECK(r.classes.nan > 0);
    CHECK(r.classes.zero > 0);
  }
}

void check_fdot2(uint64_t seed) {
  Timer t;
  const size_t n = count(size_t(1) << 24);
  std::vector<uint32_t> a(n), b(n), c(n);
#pragma omp parallel for schedule(static)
  for (int64_t si = 0; si < int64_t(n); ++si) {
    const size_t i = size_t(si);
    Rng r(seed, i);
    a[i] = uint32_t(gen_bf16(r)) | (uint32_t(gen_bf16(r)) << 16);
    b[i] = uint32_t(gen_bf16(r)) | (uint32_t(gen_bf16(r)) << 16);
    switch (r.below(4)) {
      case 0: c[i] = gen_f32(r); break;
      case 1: c[i] = r.one_in(2) ? 0u : 0x80000000u; break;
      default: {  // cancellation: c near -(a.lo*b.lo + a.hi*b.hi), a few ulps off
        const double s = double(bf16_pair_lo(a[i])) * double(bf16_pair_lo(b[i])) +
                         double(bf16_pair_hi(a[i])) * double(bf16_pair_hi(b[i]));
        uint32_t cb = f32_bits(float(-s));
        if (!r.one_in(3)) cb += r.below(5) - 2;
        c[i] = cb;
      }
    }
  }
  std::vector<uint32_t> dev(n);
  fdot2_map(a.data(), b.data(), c.data(), n, dev.data());
  const CompareResult r = compare_bits(dev.data(), n, 0, Mode::F32NanEqual,
                                       [&](size_t j) { return apply_fdot2(a[j], b[j], c[j]); });
  const std::string rep = report("fdot2_bf16 (seed " + std::to_string(seed) + ")", r, Mode::F32NanEqual, [&](uint64_t i) {
    return "a=" + hex32(a[i]) + " b=" + hex32(b[i]) + " c=" + f32_desc(c[i]);
  });
  print(rep.substr(0, rep.find('\n')) + "  [" + std::to_string(t.s()).substr(0, 5) + " s]\n");
  CHECK_MESSAGE(r.mismatches == 0, rep);
  CHECK(r.classes.zero > 0);
  CHECK(r.classes.normal > 0);
  CHECK(r.classes.nan > 0);
}

// --------------------------------------------------------------------------- block inputs
struct BlockInputs {
  size_t n = 0;
  std::vector<uint8_t> a, b, sa, sb;
  std::vector<uint32_t> c;
};

uint8_t e4m3_random(Rng& r) {
  uint8_t v = uint8_t(r.u32());
  if (e4m3_is_nan(v) && !r.one_in(16)) v ^= 1u;  // NaN codes rare but present
  return v;
}

uint8_t scale_random(Rng& r) {
  static const uint8_t kEdge[] = {0, 1, 2, 126, 127, 128, 253, 254};  // 255 (NaN) only from the uniform draw
  const uint32_t k = r.below(10);
  if (k < 6) return uint8_t(127 - 16 + r.below(33));
  if (k < 8) return uint8_t(r.u32());
  return kEdge[r.below(sizeof kEdge)];
}

// One item: a, b (kBlockA bytes each), sa, sb (kBlockS each), c. Each 32-block gets a mode.
void fill_item(Rng& r, uint8_t* a, uint8_t* b, uint8_t* sa, uint8_t* sb, uint32_t& c) {
  for (int blk = 0; blk < kBlockA / 32; ++blk) {
    uint8_t* x = a + 32 * blk;
    uint8_t* y = b + 32 * blk;
    for (int k = 0; k < 32; ++k) { x[k] = e4m3_random(r); y[k] = e4m3_random(r); }
    switch (r.below(9)) {
      case 0: break;  // random codes
      case 1:         // every product at the largest magnitude
        for (int k = 0; k < 32; ++k) { x[k] = uint8_t(0x7Eu | (r.u32() & 0x80u)); y[k] = uint8_t(0x7Eu | (r.u32() & 0x80u)); }
        break;
      case 2:  // exact cancellation in pairs (sum +0), sometimes one element off
        for (int k = 0; k < 32; k += 2) { x[k + 1] = uint8_t(x[k] ^ 0x80u); y[k + 1] = y[k]; }
        for (int k = 0; k < 32; ++k) { if (e4m3_is_nan(x[k])) x[k] = 0; if (e4m3_is_nan(y[k])) y[k] = 0; }
        if (r.one_in(2)) x[r.below(32)] ^= 1u;
        break;
      case 3:  // subnormal codes only
        for (int k = 0; k < 32; ++k) { x[k] &= 0x87u; y[k] &= 0x87u; }
        break;
      case 4:  // one large product among small ones: the sum needs rounding
        for (int k = 0; k < 32; ++k) { x[k] &= 0x9Fu; y[k] &= 0x9Fu; }
        x[r.below(32)] = uint8_t(0x60u + r.below(0x1F)); y[r.below(32)] = uint8_t(0x60u + r.below(0x1F));
        break;
      case 5:  // sparse: +-0 with a few nonzero
        for (int k = 0; k < 32; ++k) { x[k] = uint8_t(r.u32() & 0x80u); y[k] = uint8_t(r.u32() & 0x80u); }
        for (int k = 0; k < 3; ++k) { x[r.below(32)] = e4m3_random(r); y[r.below(32)] = e4m3_random(r); }
        break;
      case 6:  // a NaN code somewhere (a third of the time: NaN must not drown the rest)
        if (r.one_in(3)) (r.one_in(2) ? x : y)[r.below(32)] = r.one_in(2) ? 0x7Fu : 0xFFu;
        break;
      case 7: {  // exact ties: 2^34 + k * 2^10 (k = 1, 3 tie; 2 exact), perhaps + 2^0 (no tie)
        for (int k = 0; k < 32; ++k) { x[k] = 0; y[k] = 0; }
        const uint8_t s = uint8_t(r.u32() & 0x80u);
        x[0] = uint8_t(0x78u | s); y[0] = 0x78u;  // 256 * 256 = 2^34 * 2^-18
        const int k = 1 + int(r.below(3));
        for (int i = 1; i <= k; ++i) { x[i] = uint8_t(0x18u | s); y[i] = 0x18u; }  // 2^10 * 2^-18 each
        if (r.one_in(2)) { x[10] = uint8_t(0x01u | s); y[10] = 0x01u; }             // 2^0 * 2^-18
        break;
      }
      default: {  // E2M1-shaped a (every nibble, -0 included), E4M3 b near the top
        for (int k = 0; k < 32; ++k) { x[k] = uint8_t(r.u32()); y[k] = uint8_t(0x68u + r.below(0x16)) | uint8_t(r.u32() & 0x80u); }
        break;
      }
    }
  }
  for (int k = 0; k < kBlockS; ++k) { sa[k] = scale_random(r); sb[k] = scale_random(r); }
  switch (r.below(10)) {
    case 0: case 1: case 2: case 3: c = 0u; break;
    case 4: c = 0x80000000u; break;
    case 5: c = kSpecialF32[r.below(kNumSpecial)]; break;
    case 6: c = r.u32(); break;
    default: c = gen_f32(r); break;
  }
  if (r.one_in(32)) {  // an all-zero item (+-0 codes and accumulator): the result is +-0
    for (int k = 0; k < kBlockA; ++k) { a[k] = uint8_t(r.u32() & 0x80u); b[k] = uint8_t(r.u32() & 0x80u); }
    c = r.one_in(2) ? 0u : 0x80000000u;
  }
}

BlockInputs make_blocks(size_t n, uint64_t seed) {
  BlockInputs in;
  in.n = n;
  in.a.resize(n * kBlockA);
  in.b.resize(n * kBlockA);
  in.sa.resize(n * kBlockS);
  in.sb.resize(n * kBlockS);
  in.c.resize(n);
#pragma omp parallel for schedule(static)
  for (int64_t si = 0; si < int64_t(n); ++si) {
    const size_t i = size_t(si);
    Rng r(seed, i);
    fill_item(r, &in.a[i * kBlockA], &in.b[i * kBlockA], &in.sa[i * kBlockS], &in.sb[i * kBlockS], in.c[i]);
  }
  return in;
}

const BlockInputs& shared_blocks() {
  static const BlockInputs in = make_blocks(count(size_t(1) << 21), 77);
  return in;
}

std::string block_desc(const BlockInputs& in, uint64_t i) {
  std::string s = "a=";
  char buf[4];
  for (int k = 0; k < kBlockA; ++k) { std::snprintf(buf, sizeof buf, "%02x", in.a[i * kBlockA + k]); s += buf; }
  s += " b=";
  for (int k = 0; k < kBlockA; ++k) { std::snprintf(buf, sizeof buf, "%02x", in.b[i * kBlockA + k]); s += buf; }
  s += " sa=";
  for (int k = 0; k < kBlockS; ++k) s += std::to_string(in.sa[i * kBlockS + k]) + (k + 1 < kBlockS ? "," : "");
  s += " sb=";
  for (int k = 0; k < kBlockS; ++k) s += std::to_string(in.sb[i * kBlockS + k]) + (k + 1 < kBlockS ? "," : "");
  return s + " c=" + f32_desc(in.c[i]);
}

CompareResult run_block(BlockOp op, const BlockInputs& in, const std::string& what, bool a_b_used = true) {
  Timer t;
  std::vector<uint32_t> dev(in.n);
  block_map(op, a_b_used ? in.a.data() : nullptr, in.sa.data(), a_b_used ? in.b.data() : nullptr, in.sb.data(),
            in.c.data(), in.n, dev.data());
  static const uint8_t kZeros[kBlockA] = {};
  const CompareResult r = compare_bits(dev.data(), in.n, 0, Mode::F32NanEqual, [&](size_t j) {
    const uint8_t* a = a_b_used ? &in.a[j * kBlockA] : kZeros;
    const uint8_t* b = a_b_used ? &in.b[j * kBlockA] : kZeros;
    return apply_block(op, a, &in.sa[j * kBlockS], b, &in.sb[j * kBlockS], in.c[j]);
  });
  const std::string rep = report(what, r, Mode::F32NanEqual, [&](uint64_t i) { return block_desc(in, i); });
  print(rep.substr(0, rep.find('\n')) + "  [" + std::to_string(t.s()).substr(0, 5) + " s]\n");
  CHECK_MESSAGE(r.mismatches == 0, rep);
  CHECK(r.classes.zero > 0);
  CHECK(r.classes.normal > 0);
  CHECK(r.classes.nan > 0);
  return r;
}

}  // namespace

// =================================================================================== tests
TEST_SUITE("gpu_numerics") {
  TEST_CASE("bf16_bits_rne: all 2^32 inputs") { sweep_unary(UnaryOp::Bf16Rne); }
  TEST_CASE("e4m3_bits(Saturate): all 2^32 inputs") { sweep_unary(UnaryOp::E4m3Sat); }
  TEST_CASE("e4m3_bits(NoSaturate): all 2^32 inputs") { sweep_unary(UnaryOp::E4m3NoSat); }
  TEST_CASE("e2m1_bits_rne_sat: all 2^32 inputs") { sweep_unary(UnaryOp::E2m1RneSat); }
  TEST_CASE("exp2_approx: all 2^32 inputs") { sweep_unary(UnaryOp::Exp2); }
  TEST_CASE("rcp_approx: all 2^32 inputs") { sweep_unary(UnaryOp::Rcp); }
  TEST_CASE("rsq_approx: all 2^32 inputs") { sweep_unary(UnaryOp::Rsq); }
  TEST_CASE("sigmoid_approx: all 2^32 inputs") { sweep_unary(UnaryOp::Sigmoid); }
  TEST_CASE("mx8_scale_of_amax (e): all 2^32 inputs") { sweep_unary(UnaryOp::Mx8ScaleE); }
  TEST_CASE("mx8_scale_of_amax (inv): all 2^32 inputs") { sweep_unary(UnaryOp::Mx8ScaleInv); }
  TEST_CASE("canon_nan: all 2^32 inputs") { sweep_unary(UnaryOp::CanonNan); }
  TEST_CASE("decoders: every bf16, E4M3, E8M0 and E2M1 code") {
    sweep_unary(UnaryOp::Bf16ToF32);
    sweep_unary(UnaryOp::E4m3ToF32);
    sweep_unary(UnaryOp::E8m0ToF32);
    sweep_unary(UnaryOp::E2m1ToF32);
  }

  TEST_CASE("fmax_ieee: random and adversarial pairs") { check_binary(BinaryOp::FmaxIeee); }
  TEST_CASE("fmin_ieee: random and adversarial pairs") { check_binary(BinaryOp::FminIeee); }
  TEST_CASE("mx8_quant: codes, midpoints and clamps at random scales") { check_binary(BinaryOp::Mx8Quant); }
  TEST_CASE("bf16_pair: random pairs") { check_binary(BinaryOp::Bf16Pair); }

  TEST_CASE("fdot2_bf16: random triples with cancellation") {
    check_fdot2(1);
    check_fdot2(2);
  }

  TEST_CASE("block_dot_e4m3: random and adversarial blocks") { run_block(BlockOp::DotE4m3, shared_blocks(), "block_dot_e4m3"); }
  TEST_CASE("block_dot_e2m1_e4m3: random and adversarial blocks") {
    run_block(BlockOp::DotE2m1E4m3, shared_blocks(), "block_dot_e2m1_e4m3");
  }
  TEST_CASE("mma_fp8_k32: random and adversarial blocks") { run_block(BlockOp::MmaFp8K32, shared_blocks(), "mma_fp8_k32"); }
  TEST_CASE("mma_fp8_k128_unit: random and adversarial blocks") {
    run_block(BlockOp::MmaFp8K128Unit, shared_blocks(), "mma_fp8_k128_unit");
  }
  TEST_CASE("mma_f4f8_k128: random and adversarial blocks and scales") {
    const CompareResult r = run_block(BlockOp::MmaF4F8K128, shared_blocks(), "mma_f4f8_k128");
    CHECK(r.classes.inf > 0);
  }
  TEST_CASE("mma_f8f8_k128: random and adversarial blocks and scales") {
    const CompareResult r = run_block(BlockOp::MmaF8F8K128, shared_blocks(), "mma_f8f8_k128");
    CHECK(r.classes.inf > 0);
  }

  TEST_CASE("scale_block: every pair of E8M0 scales on special and random values") {
    // Values: the specials, then seeded random ones; each with all 65536 (sa, sb).
    std::vector<uint32_t> values(kSpecialF32, kSpecialF32 + kNumSpecial);
    Rng r(5, 0);
    while (values.size() < (quick() ? 48u : 64u)) values.push_back(gen_f32(r));
    if (quick()) values.resize(48);
    BlockInputs in;
    in.n = values.size() * 65536;
    in.sa.resize(in.n * kBlockS);
    in.sb.resize(in.n * kBlockS);
    in.c.resize(in.n);
    for (size_t v = 0; v < values.size(); ++v)
      for (uint32_t s = 0; s < 65536; ++s) {
        const size_t i = v * 65536 + s;
        in.sa[i * kBlockS] = uint8_t(s >> 8);
        in.sb[i * kBlockS] = uint8_t(s & 0xFFu);
        in.c[i] = values[v];
      }
    const CompareResult res = run_block(BlockOp::ScaleBlock, in, "scale_block (all scale pairs)", false);
    CHECK(res.classes.inf > 0);
    CHECK(res.classes.subnormal > 0);
  }

  TEST_CASE("mx8_quantize_block: random and adversarial 32-blocks") {
    Timer t;
    const size_t nb = count(size_t(1) << 20);
    std::vector<uint32_t> v(nb * 32);
#pragma omp parallel for schedule(static)
    for (int64_t sj = 0; sj < int64_t(nb); ++sj) {
      const size_t j = size_t(sj);
      Rng r(9, j);
      uint32_t* x = &v[j * 32];
      const uint32_t s = 127 - 27 + r.below(51);  // the block's scale exponent
      const double scale = pow2_f64(int(s) - 127);
      switch (r.below(8)) {
        case 0: for (int k = 0; k < 32; ++k) x[k] = gen_f32(r); break;
        case 1:  // one exponent, random mantissas
          for (int k = 0; k < 32; ++k) x[k] = (r.u32() & 0x80000000u) | ((s - r.below(8)) << 23) | (r.u32() & 0x7FFFFFu);
          break;
        case 2:  // an outlier
          for (int k = 0; k < 32; ++k) x[k] = (r.u32() & 0x80000000u) | ((s - r.below(8)) << 23) | (r.u32() & 0x7FFFFFu);
          x[r.below(32)] = ((s + 1 + r.below(20)) << 23) | (r.u32() & 0x7FFFFFu);
          break;
        case 3: for (int k = 0; k < 32; ++k) x[k] = r.u32() & 0x80000000u; break;  // +-0
        case 4:  // NaN or Inf in one place
          for (int k = 0; k < 32; ++k) x[k] = gen_f32(r) & 0xBFFFFFFFu;
          x[r.below(32)] = r.one_in(2) ? 0x7FC00000u : (r.one_in(2) ? 0x7F800000u : 0xFF800000u);
          break;
        case 5:  // subnormal only
          for (int k = 0; k < 32; ++k) x[k] = (r.u32() & 0x80000000u) | (r.u32() & 0x7FFFFFu);
          break;
        default: {  // amax exactly 448 * 2^(s-127) (or an ulp past it); others at E4M3 codes / midpoints
          for (int k = 0; k < 32; ++k) {
            const uint8_t code = uint8_t(r.below(0x7E));
            double q = e4m3_to_f32(code);
            if (r.one_in(2)) q = 0.5 * (q + double(e4m3_to_f32(uint8_t(code + 1))));
            x[k] = f32_bits(float((r.one_in(2) ? -q : q) * scale));
          }
          x[r.below(32)] = f32_bits(float(448.0 * scale)) + (r.one_in(2) ? 1u : 0u);
          break;
        }
      }
    }
    std::vector<uint8_t> dq(nb * 32), de(nb), hq(nb * 32), he(nb);
    mx8_block_map(v.data(), nb, dq.data(), de.data());
#pragma omp parallel for schedule(static)
    for (int64_t sj = 0; sj < int64_t(nb); ++sj) he[size_t(sj)] = apply_mx8_block(&v[size_t(sj) * 32], &hq[size_t(sj) * 32]);
    // Codes compared four a word, scales one a word.
    std::vector<uint32_t> dqw(nb * 8), dew(nb);
    __builtin_memcpy(dqw.data(), dq.data(), nb * 32);
    for (size_t j = 0; j < nb; ++j) dew[j] = de[j];
    const CompareResult rq = compare_bits(dqw.data(), nb * 8, 0, Mode::Bits, [&](size_t w) {
      uint32_t x;
      __builtin_memcpy(&x, &hq[w * 4], 4);
      return x;
    });
    const CompareResult re = compare_bits(dew.data(), nb, 0, Mode::Bits, [&](size_t j) { return uint32_t(he[j]); });
    auto desc = [&](uint64_t blk) {
      std::string s = "block";
      for (int k = 0; k < 32; ++k) s += " " + hex32(v[blk * 32 + k]);
      return s;
    };
    const std::string rep = report("mx8_quantize_block codes (4 a word)", rq, Mode::Bits, [&](uint64_t w) { return desc(w / 8); }) +
                            report("mx8_quantize_block scales", re, Mode::Bits, desc);
    print(rep.substr(0, rep.find('\n')) + "\n" + "mx8_quantize_block scales: " + std::to_string(re.mismatches) +
          " mismatches  [" + std::to_string(t.s()).substr(0, 5) + " s]\n");
    CHECK_MESSAGE(rq.mismatches == 0, rep);
    CHECK_MESSAGE(re.mismatches == 0, rep);
    CHECK(rq.nonzero > 0);
    CHECK(re.varied);
  }

  TEST_CASE("a planted one-bit error on either side is caught and reported") {
    const uint32_t first = 0x3F000000u;  // exp2 of [0.5, 2): normal results
    const size_t n = size_t(1) << 20;
    std::vector<uint32_t> dev(n);
    unary_sweep(UnaryOp::Exp2, first, n, dev.data());
    auto host = [&](size_t j) { return apply_unary(UnaryOp::Exp2, first + uint32_t(j)); };

    const CompareResult clean = compare_bits(dev.data(), n, first, Mode::F32NanEqual, host);
    REQUIRE(clean.mismatches == 0);

    // Host side: one result with its last bit flipped.
    const CompareResult h = compare_bits(dev.data(), n, first, Mode::F32NanEqual,
                                         [&](size_t j) { return host(j) ^ (j == 4242 ? 1u : 0u); });
    CHECK(h.mismatches == 1);
    REQUIRE(h.first.size() == 1);
    CHECK(h.first[0].index == uint64_t(first) + 4242);
    CHECK((h.first[0].device ^ h.first[0].host) == 1u);
    CHECK(ulp_distance(h.first[0].device, h.first[0].host) == 1);
    const std::string rep = report("planted", h, Mode::F32NanEqual, [](uint64_t i) { return "x=" + f32_desc(uint32_t(i)); });
    CHECK(rep.find("1 mismatches") != std::string::npos);
    CHECK(rep.find(hex32(h.first[0].device)) != std::string::npos);
    CHECK(rep.find("1 ulp") != std::string::npos);

    // Device side: one result with a mantissa bit flipped.
    dev[777] ^= 0x00400000u;
    const CompareResult d = compare_bits(dev.data(), n, first, Mode::F32NanEqual, host);
    CHECK(d.mismatches == 1);
    REQUIRE(d.first.size() == 1);
    CHECK(d.first[0].index == uint64_t(first) + 777);
    CHECK(d.first[0].device == (host(777) ^ 0x00400000u));
  }
}

TEST_SUITE("gpu_compare") {
  TEST_CASE("NaN payloads compare equal in F32NanEqual only; NaN vs number never") {
    const std::vector<uint32_t> dev = {0x7FC00000u, 0x7FFFFFFFu, 0x3F800000u, 0x00000000u};
    const std::vector<uint32_t> host = {0x7FFFFFFFu, 0x7FC00000u, 0x7FC00000u, 0x80000000u};
    const CompareResult f = compare_bits(dev.data(), dev.size(), 0, Mode::F32NanEqual, [&](size_t j) { return host[j]; });
    CHECK(f.mismatches == 2);  // 1 vs NaN, +0 vs -0
    CHECK(f.nan_payload_diffs == 2);
    const CompareResult b = compare_bits(dev.data(), dev.size(), 0, Mode::Bits, [&](size_t j) { return host[j]; });
    CHECK(b.mismatches == 4);
    CHECK(ulp_distance(0x00000000u, 0x80000000u) == 1);
    CHECK(ulp_distance(0x3F800000u, 0x3F800002u) == 2);
    CHECK(ulp_distance(0x00000001u, 0x80000001u) == 3);
  }

  TEST_CASE("the first mismatches are the lowest indices, over threads and chunks") {
    const size_t n = 1000000;
    std::vector<uint32_t> dev(n, 7u);
    auto host = [](size_t j) { return j % 1000 == 999 ? 8u : 7u; };
    CompareResult all = compare_bits(dev.data(), n / 2, 0, Mode::Bits, host);
    const CompareResult second =
        compare_bits(dev.data() + n / 2, n / 2, n / 2, Mode::Bits, [&](size_t j) { return host(j + n / 2); });
    CompareResult rev = second;
    rev.merge(all);
    all.merge(second);
    for (const CompareResult* r : {&all, &rev}) {
      CHECK(r->checked == n);
      CHECK(r->mismatches == 1000);
      REQUIRE(r->first.size() == 8);
      for (size_t k = 0; k < 8; ++k) CHECK(r->first[k].index == 999 + 1000 * k);
    }
    CHECK(all.nonzero == n);
    CHECK(!all.varied);  // constant: the suites' "can it fail" checks would flag it
  }
}
