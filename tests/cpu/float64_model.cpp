// float64_model.cpp -- the plain float64 model of K4's stages and the bounded comparisons.
// Contract and the list of bounds in float64_model.hpp. Nothing here calls reference/numerics:
// every format is decoded by value, every stage recomputed in double (Eigen for the products).
#include "tests/cpu/float64_model.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <tuple>

#include "tests/cpu/fixtures.hpp"

namespace k4::f64 {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kTiny = 0x1p-133;  // below half a bf16 subnormal quantum: underflow slack

// Relative errors of the seed's f32 constants against the real numbers they stand for.
const double kLog2eF = double(float(1.4426950408889634));
const double kErrLog2e = std::fabs(kLog2eF - 1.4426950408889634074) / 1.4426950408889634074;
const double kErr448 = std::fabs(double(float(1.0 / 448.0)) * 448.0 - 1.0);

uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

std::string hex(uint64_t v, int w) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%0*llx", w, (unsigned long long)v);
  return b;
}

// The 127 non-negative finite E4M3 values, ascending (code c has value kE4m3Pos[c]).
struct E4m3Values {
  double v[127];
  E4m3Values() {
    for (int c = 0; c < 127; ++c) v[c] = e4m3(uint8_t(c));
  }
};
const E4m3Values& e4m3_values() {
  static const E4m3Values t;
  return t;
}

// Decode tables (filled once from the by-value decoders below): the stage loops decode
// millions of codes.
struct Tables {
  double e4m3[256], e2m1[16], e8m0[256];
  Tables();
};
const Tables& tables() {
  static const Tables t;
  return t;
}
// Eigen's OpenMP-parallel products cost more than they save on these small shapes (and spin
// against the model's threads): the checks run them serially.
void serial_eigen() {
  static const bool once = (Eigen::setNbThreads(1), true);
  (void)once;
}

double dec8(uint8_t c) { return tables().e4m3[c]; }
double dec4(uint8_t nib) { return tables().e2m1[nib & 15]; }
double decs(uint8_t c) { return tables().e8m0[c]; }

}  // namespace

// ---- formats by value ----------------------------------------------------------------------

double bf16(uint16_t bits) { return double(float_of(uint32_t(bits) << 16)); }

double e4m3(uint8_t code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return kNaN;
  const double mag = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

double e2m1(uint8_t nib) {
  const int s = (nib >> 3) & 1, e = (nib >> 1) & 3, m = nib & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + m / 2.0, e - 1);
  return s ? -mag : mag;
}

double e8m0(uint8_t code) { return code == 0xFF ? kNaN : std::ldexp(1.0, int(code) - 127); }

uint8_t e4m3_nearest(double x, bool saturate) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  if (a > 464.0) return saturate ? uint8_t(sign | 0x7E) : uint8_t(sign | 0x7F);
  if (a >= 448.0) return uint8_t(sign | 0x7E);  // 448 .. 464 (the tie goes to 448, code even)
  const double* v = e4m3_values().v;
  int hi = int(std::lower_bound(v, v + 127, a) - v);  // first value >= a
  if (v[hi] == a) return uint8_t(sign | hi);
  const int lo = hi - 1;
  const double dl = a - v[lo], dh = v[hi] - a;
  const int c = dl < dh ? lo : (dh < dl ? hi : (lo % 2 == 0 ? lo : hi));
  return uint8_t(sign | c);
}

uint16_t bf16_nearest(double x) {
  if (std::isnan(x)) return 0x7FC0;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a == 0.0) return sign;
  int ex;
  std::frexp(a, &ex);  // a in [2^(ex-1), 2^ex)
  const double q = std::ldexp(1.0, std::max(ex - 1, -126) - 7);  // the bf16 quantum there
  const double v = std::nearbyint(a / q) * q;                     // ties to even
  if (v >= std::ldexp(1.0, 128)) return uint16_t(sign | 0x7F80);
  return uint16_t(sign | (bits_of(float(v)) >> 16));
}

// ---- comparisons ---------------------------------------------------------------------------

Tables::Tables() {
  for (int c = 0; c < 256; ++c) e4m3[c] = f64::e4m3(uint8_t(c)), e8m0[c] = f64::e8m0(uint8_t(c));
  for (int c = 0; c < 16; ++c) e2m1[c] = f64::e2m1(uint8_t(c));
}

void Cmp::near(size_t i, double got, double want, double bound) {
  ++n;
  if (std::isnan(got)) ++nan;
  else if (got != 0.0) ++nonzero;
  bool ok;
  double err = 0.0;
  if (std::isnan(want)) ok = std::isnan(got);
  else if (std::isnan(got)) ok = false;
  else if (std::isinf(want) || std::isinf(got)) ok = got == want;
  else {
    err = std::fabs(got - want);
    ok = err <= bound;
    if (bound > 0) sum_bound += bound, sum_want += std::fabs(want);  // the bounded (inexact) compares
    const double ratio = bound > 0 ? err / bound : (err == 0 ? 0.0 : HUGE_VAL);
    if (ratio > max_ratio || n == 1) {
      if (ratio >= max_ratio) max_ratio = ratio, worst = i, worst_bound = bound, worst_want = want, worst_got = got;
    }
    max_err = std::max(max_err, err);
  }
  if (!ok) {
    if (first_bad.size() < 6) {
      char b[240];
      std::snprintf(b, sizeof b, "%s[%zu]: got %.9g want %.9g (err %.3g > bound %.3g)", name.c_str(), i, got, want,
                    std::fabs(got - want), bound);
      first_bad.push_back(b);
    }
    ++bad;
  }
}

std::string Cmp::summary() const {
  char b[400];
  std::snprintf(b, sizeof b, "%-18s n=%-8zu bad=%-4zu nonzero=%5.1f%% nan=%zu%s max_err=%.3g max_err/bound=%.3g mean bound/|value|=%.2g (worst at %zu: got %.6g want %.6g bound %.3g)",
                name.c_str(), n, bad, n ? 100.0 * double(nonzero) / double(n) : 0.0, nan,
                skipped ? (" skipped(overflow)=" + std::to_string(skipped)).c_str() : "", max_err, max_ratio, mean_rel_bound(),
                worst, worst_got, worst_want, worst_bound);
  std::string s = b;
  for (const std::string& f : first_bad) s += "\n    " + f;
  return s;
}

void Cmp::merge(const Cmp& o) {
  if (o.max_ratio >= max_ratio && o.n)
    max_ratio = o.max_ratio, worst = o.worst, worst_bound = o.worst_bound, worst_want = o.worst_want, worst_got = o.worst_got;
  n += o.n, bad += o.bad, nonzero += o.nonzero, nan += o.nan, skipped += o.skipped;
  sum_bound += o.sum_bound, sum_want += o.sum_want;
  max_err = std::max(max_err, o.max_err);
  for (const std::string& f : o.first_bad)
    if (first_bad.size() < 6) first_bad.push_back(f);
}

void merge_into(Report& into, const Report& r) {
  for (const Cmp& c : r) {
    bool done = false;
    for (Cmp& d : into)
      if (d.name == c.name) d.merge(c), done = true;
    if (!done) into.push_back(c);
  }
}

bool all_ok(const Report& r) {
  for (const Cmp& c : r)
    if (!c.ok()) return false;
  return true;
}

std::string describe(const Report& r) {
  std::string s;
  for (const Cmp& c : r) s += c.summary() + "\n";
  return s;
}

const Cmp* find(const Report& r, const std::string& name) {
  for (const Cmp& c : r)
    if (c.name == name) return &c;
  return nullptr;
}

namespace {

template <class T>
std::string mismatches_of(const std::string& what, const std::vector<T>& a, const std::vector<T>& b, int max_report) {
  if (a.size() != b.size()) return what + ": sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + "\n";
  std::string s;
  size_t count = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    uint64_t x = 0, y = 0;
    std::memcpy(&x, &a[i], sizeof(T));
    std::memcpy(&y, &b[i], sizeof(T));
    if (x != y) {
      if (int(count) < max_report) s += what + "[" + std::to_string(i) + "]: " + hex(x, 2 * sizeof(T)) + " vs " + hex(y, 2 * sizeof(T)) + "\n";
      ++count;
    }
  }
  if (count) s += what + ": " + std::to_string(count) + " of " + std::to_string(a.size()) + " differ\n";
  return s;
}

}  // namespace

std::string first_mismatches(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int max_report) {
  return mismatches_of("bits", got, want, max_report);
}

std::string diff_step(const StepResult& a, const StepResult& b) {
  if (a.ranks.size() != b.ranks.size()) return "rank counts differ\n";
  std::string s;
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    const RankResult &x = a.ranks[r], &y = b.ranks[r];
    const std::string p = "rank" + std::to_string(r) + ".";
    s += mismatches_of(p + "index.sparse_table", x.index.sparse_table, y.index.sparse_table, 2);
    s += mismatches_of(p + "index.blocks", x.index.blocks, y.index.blocks, 2);
    s += mismatches_of(p + "index.n_ctx", x.index.n_ctx, y.index.n_ctx, 2);
    s += mismatches_of(p + "index.long_row", x.index.long_row, y.index.long_row, 2);
    s += mismatches_of(p + "split.q8", x.split.q8, y.split.q8, 2);
    s += mismatches_of(p + "split.o", x.split.o, y.split.o, 2);
    s += mismatches_of(p + "split.m", x.split.m, y.split.m, 2);
    s += mismatches_of(p + "split.l", x.split.l, y.split.l, 2);
    s += mismatches_of(p + "merge.attn", x.merge.attn, y.merge.attn, 2);
    s += mismatches_of(p + "merge.attn8", x.merge.attn8, y.merge.attn8, 2);
    s += mismatches_of(p + "merge.x_scale", x.merge.x_scale, y.merge.x_scale, 2);
    s += mismatches_of(p + "oproj.partial", x.oproj.partial, y.oproj.partial, 2);
    s += mismatches_of(p + "a", x.a, y.a, 2);
    s += mismatches_of(p + "h_mid", x.h_mid, y.h_mid, 2);
    s += mismatches_of(p + "router.xn", x.router.xn, y.router.xn, 2);
    s += mismatches_of(p + "router.xn8", x.router.xn8, y.router.xn8, 2);
    s += mismatches_of(p + "router.xsc", x.router.xsc, y.router.xsc, 2);
    s += mismatches_of(p + "router.rstd", x.router.rstd, y.router.rstd, 2);
    s += mismatches_of(p + "router.logit", x.router.logit, y.router.logit, 2);
    s += mismatches_of(p + "router.sig", x.router.sig, y.router.sig, 2);
    s += mismatches_of(p + "router.key", x.router.key, y.router.key, 2);
    s += mismatches_of(p + "route.ids", x.route.ids, y.route.ids, 2);
    s += mismatches_of(p + "route.weights", x.route.weights, y.route.weights, 2);
    s += mismatches_of(p + "moe.gate", x.moe.gate, y.moe.gate, 2);
    s += mismatches_of(p + "moe.up", x.moe.up, y.moe.up, 2);
    s += mismatches_of(p + "moe.mid", x.moe.mid, y.moe.mid, 2);
    s += mismatches_of(p + "moe.mid8", x.moe.mid8, y.moe.mid8, 2);
    s += mismatches_of(p + "moe.midsc", x.moe.midsc, y.moe.midsc, 2);
    s += mismatches_of(p + "moe.partial", x.moe.partial, y.moe.partial, 2);
    s += mismatches_of(p + "ar_out", x.ar_out, y.ar_out, 2);
  }
  return s;
}

// ---- stage 0: index ------------------------------------------------------------------------
// By value: a block's priority is 1e30 (init), 1e29 (local; applied second), else its score;
// NaN is below everything (-Inf included), -0 equals +0 (double compare), equal priorities go
// to the higher block id. Rows of <= TOPK_BLOCKS blocks (short requests) keep id order. The
// selected blocks fill the slots in order, the tail block (n_blk - 1) moved to the last one;
// n_ctx counts the keys of the selected blocks (the tail's ctx - 128 tail).
Report check_index(const Config& cfg, const StepShared& sh, const std::vector<float>& scores, const IndexOut& idx) {
  Cmp cb("index.blocks"), ct("index.sparse_table"), cn("index.n_ctx"), cl("index.long_row");
  const int S = sh.tokens, TB = cfg.topk_blocks, PPB = cfg.pages_per_block(), TW = TB * PPB + 1;
  std::vector<int> ctx(S), nblk(S);
  std::vector<bool> lng(S);
  // index.cp = on (VARIANTS.md V6.2): long past 288 blocks, and a long row's candidates are
  // the blocks >= init_blocks only (the owner shares start there)
  const bool cp = cfg.variant.index_cp;
  for (int k = 0; k < S; ++k) ctx[k] = std::max(sh.seq_lens[k], 1), nblk[k] = (ctx[k] + cfg.sparse_block - 1) / cfg.sparse_block;
  for (int r0 = 0; r0 < S; r0 += sh.q_len)
    for (int k = r0; k < r0 + sh.q_len; ++k) lng[k] = nblk[r0 + sh.q_len - 1] > (cp ? 288 : cfg.waves * cfg.lanes);
  for (int k = 0; k < S; ++k) {
    const int n = nblk[k], tail = n - 1;
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    if (lng[k] || n > TB) {
      std::vector<double> pr(n);
      for (int b = 0; b < n; ++b) {
        double v = double(scores[size_t(k) * sh.score_width + b]);
        if (b < cfg.init_blocks) v = double(1e30f);
        if (b >= n - cfg.local_blocks) v = double(1e29f);
        pr[b] = v;
      }
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        const bool na = std::isnan(pr[a]), nb = std::isnan(pr[b]);
        if (na != nb) return nb;             // a number before a NaN
        if (!na && pr[a] != pr[b]) return pr[a] > pr[b];
        return a > b;                        // equal (or both NaN): the higher id first
      });
    }
    if (cp && lng[k]) order.erase(std::remove_if(order.begin(), order.end(), [&](int b) { return b < cfg.init_blocks; }), order.end());
    const int n_sel = std::min(int(order.size()), TB);
    std::vector<int> sel(order.begin(), order.begin() + n_sel), slots;
    bool tail_sel = false;
    for (int b : sel)
      if (b == tail) tail_sel = true;
      else slots.push_back(b);
    if (tail_sel) slots.push_back(tail);
    int keys = 0;
    for (int b : slots) keys += b == tail ? ctx[k] - tail * cfg.sparse_block : cfg.sparse_block;
    std::vector<int32_t> table(TW, 0);
    for (int s = 0; s < int(slots.size()); ++s)
      for (int j = 0; j < PPB; ++j) table[s * PPB + j] = sh.block_table[size_t(k) * sh.bt_width + slots[s]] * cfg.kv_page_stride + j;
    table[TW - 1] = keys;
    for (int s = 0; s < TB; ++s) cb.exact(size_t(k) * TB + s, idx.blocks[size_t(k) * TB + s], s < int(slots.size()) ? slots[s] : -1);
    for (int i = 0; i < TW; ++i) ct.exact(size_t(k) * TW + i, idx.sparse_table[size_t(k) * TW + i], table[i]);
    cn.exact(k, idx.n_ctx[k], keys);
    cl.exact(k, idx.long_row[k], lng[k] ? 1 : 0);
  }
  return {cb, ct, cn, cl};
}

// ---- stage 1: split under split.kv_scale = atom_vllm (VARIANTS.md V4.3) ----------------------
// Token tp of KV page `page` into row j of K, |K|, V, |V| (the caches' layouts, R1.2, R1.10).
void load_kv(const StepRank& rk, int page, int tp, int j, const Config& cfg, Mat& K, Mat& Ka, Mat& V, Mat& Va) {
  const int PG = cfg.page, D = cfg.head_dim;
  const size_t page_bytes = size_t(PG) * D;
  const uint8_t* kpage = rk.k_cache.data() + size_t(page) * page_bytes;
  const uint8_t* vpage = rk.v_cache.data() + size_t(page) * page_bytes;
  for (int d = 0; d < D; ++d) {
    K(j, d) = dec8(kpage[(d / 16) * (PG * 16) + tp * 16 + d % 16]);
    V(j, d) = dec8(vpage[d * PG + tp]);
    Ka(j, d) = std::fabs(K(j, d)), Va(j, d) = std::fabs(V(j, d));
  }
}

// Token tok's q8 (decoded) and its magnitudes, (heads, head_dim).
void load_q(const SplitOut& sp, int tok, const Config& cfg, Mat& Q, Mat& Qa) {
  const int H = cfg.heads, D = cfg.head_dim, OK = cfg.o_k();
  for (int h = 0; h < H; ++h)
    for (int d = 0; d < D; ++d) Q(h, d) = dec8(sp.q8[size_t(tok) * OK + h * D + d]), Qa(h, d) = std::fabs(Q(h, d));
}

// One (token, partition)'s o (at ts) against its sharp and loose values: NaN heads exactly;
// else bounds(h, d, l64, rel_l) gives {o_sharp, its core bound, o_loose, its core bound}, to
// which l's relative error (rel_l 1.01 + 4.04 u + rel_more), and bf16's 2^-8 are added.
template <class Bounds>
void compare_o(Cmp& co, Cmp& col, const SplitOut& sp, size_t ts, const Config& cfg, const std::vector<bool>& head_nan,
               const std::vector<double>& l64, const std::vector<double>& dl, double rel_more, Bounds bounds) {
  const int H = cfg.heads, D = cfg.head_dim, OK = cfg.o_k();
  for (int h = 0; h < H; ++h)
    for (int d = 0; d < D; ++d) {
      const size_t i = ts * OK + h * D + d;
      const double got = bf16(sp.o[i]);
      if (head_nan[h]) {
        co.exact(i, got, kNaN), col.exact(i, got, kNaN);
        continue;
      }
      const double lh = l64[h], rel_l = dl[h] / (lh - dl[h]);
      const double rel = rel_l * 1.01 + 4.04 * kU + rel_more;
      const std::array<double, 4> b = bounds(h, d, lh, rel_l);
      const double pre = b[1] + std::fabs(b[0]) * rel, prel = b[3] + std::fabs(b[2]) * rel;
      co.near(i, got, b[0], pre + 0x1p-8 * (std::fabs(b[0]) + pre) * 1.0001 + kTiny);
      col.near(i, got, b[2], prel + 0x1p-8 * (std::fabs(b[2]) + prel) * 1.0001 + kTiny);
    }
}

// Split t takes the sparse keys [begin, end), span = ceil(n_ctx / 8), over the 256-key tiles
// tau it meets, by online softmax. With m = max s_j over the split and mx_tau the running max
// through tile tau: p_j = exp(s_j - mx_tau) (the f32 p the model's P8 = nearest E4M3 of p
// comes from), w_j = exp(mx_tau - m) (the factor that rescales an earlier tile: 1 for the
// last), l = sum_j w_j p_j = sum exp(s_j - m), o_sharp = vs sum_j w_j P8_j V_j / l,
// o_loose = vs sum_j exp(s_j - m) V_j / l. A split with no key: m = f32(-3.4e38), l = +0,
// o = +0. The factor's f32 error (its argument mx_0 - mx_1 and both maxima's) bounds tile 0's
// terms when a split meets two tiles.
void check_split_ranges(Cmp& cm, Cmp& cl, Cmp& co, Cmp& col, const Config& cfg, const StepShared& sh, const StepRank& rk,
                        const IndexOut& idx, const SplitOut& sp) {
  const int S = sh.tokens, OK = cfg.o_k(), H = cfg.heads, D = cfg.head_dim, NS = cfg.n_split, PG = cfg.page;
  const int KEYS = cfg.split_keys(), TW = cfg.sparse_table_words();
  const double sm = double(cfg.sm_scale), u = kU, vs0 = double(rk.v_scale.at(0)), ks0 = double(rk.k_scale.at(0));
  for (int tok = 0; tok < S; ++tok) {
    Mat Q(H, D), Qa(H, D);
    load_q(sp, tok, cfg, Q, Qa);
    const int32_t* table = idx.sparse_table.data() + size_t(tok) * TW;
    const int n_ctx = table[TW - 1];
    const int span = (n_ctx + NS - 1) / NS;
    for (int t = 0; t < NS; ++t) {
      const size_t ts = size_t(tok) * NS + t;
      const int begin = t * span, end = std::min(begin + span, n_ctx);
      const int nv = std::max(0, end - begin);
      if (nv == 0) {  // no tile: the running state's start
        for (int h = 0; h < H; ++h) {
          cm.exact(ts * H + h, sp.m[ts * H + h], double(-3.4e38f));
          cl.exact(ts * H + h, sp.l[ts * H + h], 0.0);
          for (int d = 0; d < D; ++d) {
            co.exact(ts * OK + h * D + d, bf16(sp.o[ts * OK + h * D + d]), 0.0);
            col.exact(ts * OK + h * D + d, bf16(sp.o[ts * OK + h * D + d]), 0.0);
          }
        }
        continue;
      }
      Mat K(nv, D), Ka(nv, D), V(nv, D), Va(nv, D);
      std::vector<int> tile(nv);
      for (int j = 0; j < nv; ++j) {
        const int kap = begin + j, page = table[kap / PG], tp = kap % PG;
        tile[j] = kap / KEYS - begin / KEYS;  // 0 or 1
        load_kv(rk, page, tp, j, cfg, K, Ka, V, Va);
      }
      const int n_tiles = tile[nv - 1] + 1;
      const Mat Sm = Q * K.transpose(), Am = Qa * Ka.transpose();
      Mat P(H, nv), AMB(H, nv), ABS(H, nv), EF(H, nv), PQ(H, nv), R(H, nv);
      std::vector<double> l64(H), dl(H);
      std::vector<bool> head_nan(H, false);
      for (int h = 0; h < H; ++h) {
        std::vector<double> s(nv), ds(nv);
        double mt[2] = {-HUGE_VAL, -HUGE_VAL}, dm = 0.0;
        bool s_nan = false;
        for (int j = 0; j < nv; ++j) {
          s[j] = sm * ks0 * Sm(h, j);
          ds[j] = 2.01 * u * std::fabs(s[j]) + 4.01 * u * std::fabs(sm * ks0) * Am(h, j);
          s_nan |= std::isnan(s[j]);
          mt[tile[j]] = std::max(mt[tile[j]], s[j]), dm = std::max(dm, ds[j]);
        }
        const double mx[2] = {mt[0], std::max(mt[0], mt[1])}, m = mx[n_tiles - 1];
        head_nan[h] = s_nan || std::isnan(vs0);
        if (s_nan) {  // m, l and o NaN: fmax_ieee carries it into mx and m_run, exp2 into lsum and l_run
          cm.exact(ts * H + h, sp.m[ts * H + h], kNaN);
          cl.exact(ts * H + h, sp.l[ts * H + h], kNaN);
          for (int j = 0; j < nv; ++j) P(h, j) = kNaN, AMB(h, j) = ABS(h, j) = EF(h, j) = PQ(h, j) = R(h, j) = 0;
          continue;
        }
        cm.near(ts * H + h, sp.m[ts * H + h], m, 1.01 * dm + 0x1p-149);
        // tile 0's factor exp2((mx_0 - mx_1) LOG2E) in f32: its argument's and its own error
        const double ef = n_tiles == 2 ? std::expm1(2.0 * dm + std::fabs(mx[0] - mx[1]) * (2.0 * u + kErrLog2e) + 2.0 * u) * 1.01 : 0.0;
        double l = 0.0, dls = 0.0;
        for (int j = 0; j < nv; ++j) {
          const double mxj = mx[tile[j]], w = std::exp(mxj - m), efj = tile[j] + 1 < n_tiles ? ef : 0.0;
          const double p = std::exp(s[j] - mxj);
          const double e = ds[j] + dm + std::fabs(s[j] - mxj) * (2.0 * u + kErrLog2e) + 2.0 * u;
          const double dp = p * std::expm1(e) * 1.01 + 0x1p-149;
          l += w * p, dls += w * (dp + (p + dp) * efj);
          const double xi = p * std::expm1(e) * 1.01 + 0x1p-140;  // the f32 p within xi of p
          const uint8_t c = e4m3_nearest(p, false), lo = e4m3_nearest(p - xi, false), hi = e4m3_nearest(p + xi, false);
          P(h, j) = w * e4m3(c);
          AMB(h, j) = w * (e4m3(hi) - e4m3(lo));
          ABS(h, j) = w * (std::fabs(e4m3(c)) + e4m3(hi) - e4m3(lo));
          EF(h, j) = efj * ABS(h, j);
          PQ(h, j) = w * (std::max(0x1p-4 * (p + xi), 0x1p-10) * 1.01 + xi);  // |P8_32 - p64|, weighted
          R(h, j) = w * p;
        }
        l64[h] = l;
        dl[h] = dls + 16.01 * u * (l + dls) + 2 * KEYS * 0x1p-149;
        cl.near(ts * H + h, sp.l[ts * H + h], l, dl[h]);
      }
      const Mat O_sh = P * V, O_amb = AMB * Va, O_abs = ABS * Va, O_ef = EF * Va;
      const Mat O_lo = R * V, O_lq = PQ * Va;
      const double avs = std::fabs(vs0);
      // acc's f32 sums (8.01 u), vs acc, o_run factor and their add (3 u), the factor (O_ef)
      compare_o(co, col, sp, ts, cfg, head_nan, l64, dl, 0.0, [&](int h, int d, double lh, double rel_l) {
        const double g = (1.0 + rel_l) * 1.01 / lh;
        return std::array<double, 4>{vs0 * O_sh(h, d) / lh, avs * (O_amb(h, d) + 11.01 * u * O_abs(h, d) + O_ef(h, d)) * g,
                                     vs0 * O_lo(h, d) / lh, avs * (O_lq(h, d) + 11.01 * u * O_abs(h, d) + O_ef(h, d)) * g};
      });
    }
  }
}

// ---- stage 1: split ------------------------------------------------------------------------
// Per (token, partition t, head h), over the partition's valid keys j (sparse key < n_ctx):
//   S_j = q8 . K_j (exact), s_j = sm ks_j S_j, m = max s_j, p_j = exp(s_j - m), l = sum p_j,
//   vmax = max vs_j, P8_j = nearest E4M3 of p_j vs_j 448 / (vmax + f32(1e-8)),
//   o_sharp = (vmax / 448) sum P8_j V_j / l,   o_loose = sum p_j vs_j V_j / l.
// A partition without valid keys: m = f32(-3.4e38), l = 256 (every key's p is exp2(0)), o = 0.
Report check_split(const Config& cfg, const StepShared& sh, const StepRank& rk, const IndexOut& idx, const SplitOut& sp) {
  serial_eigen();
  Cmp cq("split.q8"), cm("split.m"), cl("split.l"), co("split.o"), col("split.o_loose");
  const int S = sh.tokens, OK = cfg.o_k(), H = cfg.heads, D = cfg.head_dim, NS = cfg.n_split, PG = cfg.page;
  const int KEYS = cfg.split_keys(), TW = cfg.sparse_table_words(), PPP = KEYS / PG;
  // q8: the nearest E4M3, NaN code beyond 464 (NoSaturate)
  for (size_t i = 0; i < sp.q8.size(); ++i) cq.exact(i, sp.q8[i], e4m3_nearest(bf16(rk.q[i]), false));
  if (cfg.variant.kv_scale == KvScale::atom_vllm) {
    check_split_ranges(cm, cl, co, col, cfg, sh, rk, idx, sp);
    return {cq, cm, cl, co, col};
  }
  const double sm = double(cfg.sm_scale), eps8 = double(1e-8f), u = kU;
  // split.kv_scale = static448 (VARIANTS.md V4.2): P8 of 448 p (no vmax, no fscale) and
  // pscale = v_scale[0] / 448 in every partition; the other modes fold vs 448 / (vmax + 1e-8).
  const bool s448 = cfg.variant.kv_scale == KvScale::static448;
  const double vs0 = cfg.one_kv_scale() ? double(rk.v_scale.at(0)) : 0.0;
  for (int tok = 0; tok < S; ++tok) {
    Mat Q(H, D), Qa(H, D);
    load_q(sp, tok, cfg, Q, Qa);
    const int32_t* table = idx.sparse_table.data() + size_t(tok) * TW;
    const int n_ctx = table[TW - 1];
    for (int t = 0; t < NS; ++t) {
      const size_t ts = size_t(tok) * NS + t;
      std::vector<int> keys;
      for (int kp = 0; kp < KEYS; ++kp)
        if (t * KEYS + kp < n_ctx) keys.push_back(kp);
      const int nv = int(keys.size());
      if (nv == 0) {  // no valid key
        for (int h = 0; h < H; ++h) {
          cm.exact(ts * H + h, sp.m[ts * H + h], double(-3.4e38f));
          cl.exact(ts * H + h, sp.l[ts * H + h], double(KEYS));
          const double o0 = s448 && std::isnan(vs0) ? kNaN : 0.0;  // static448: pscale * (+0)
          for (int d = 0; d < D; ++d) {
            co.exact(ts * OK + h * D + d, bf16(sp.o[ts * OK + h * D + d]), o0);
            col.exact(ts * OK + h * D + d, bf16(sp.o[ts * OK + h * D + d]), o0);
          }
        }
        continue;
      }
      Mat K(nv, D), Ka(nv, D), V(nv, D), Va(nv, D);
      std::vector<double> ks(nv), vs(nv);
      double vmax = 0.0;
      for (int j = 0; j < nv; ++j) {
        const int kp = keys[j], page = table[t * PPP + kp / PG], tp = kp % PG;
        load_kv(rk, page, tp, j, cfg, K, Ka, V, Va);
        const size_t si = cfg.one_kv_scale() ? 0 : size_t(page) * PG + tp;
        ks[j] = rk.k_scale[si], vs[j] = rk.v_scale[si];
        vmax = (std::isnan(vs[j]) || std::isnan(vmax)) ? kNaN : std::max(vmax, vs[j]);
      }
      const Mat Sm = Q * K.transpose(), Am = Qa * Ka.transpose();
      const double fscale = 448.0 / (vmax + eps8), pscale = (s448 ? vs0 : vmax) / 448.0;
      const double bias = s448 ? 0.0 : eps8 / (vmax + eps8);  // the fold's 1e-8 against vs 448 / vmax
      Mat P(H, nv), AMB(H, nv), PQ(H, nv), R(H, nv);
      std::vector<double> l64(H), dl(H);
      std::vector<bool> head_nan(H, false);
      for (int h = 0; h < H; ++h) {
        std::vector<double> s(nv), ds(nv);
        double m = -HUGE_VAL, dm = 0.0;
        bool s_nan = false;
        for (int j = 0; j < nv; ++j) {
          s[j] = sm * ks[j] * Sm(h, j);
          ds[j] = 2.01 * u * std::fabs(s[j]) + 4.01 * u * std::fabs(sm * ks[j]) * Am(h, j);
          s_nan |= std::isnan(s[j]);
          m = std::max(m, s[j]), dm = std::max(dm, ds[j]);
        }
        // a NaN score makes m, l and o NaN; a NaN v_scale only o
        head_nan[h] = s_nan || std::isnan(s448 ? vs0 : vmax);
        if (s_nan) {
          cm.exact(ts * H + h, sp.m[ts * H + h], kNaN);
          cl.exact(ts * H + h, sp.l[ts * H + h], kNaN);
          for (int j = 0; j < nv; ++j) P(h, j) = kNaN, AMB(h, j) = PQ(h, j) = R(h, j) = 0;
          continue;
        }
        cm.near(ts * H + h, sp.m[ts * H + h], m, 1.01 * dm + 0x1p-149);
        double l = 0.0, dls = 0.0;
        for (int j = 0; j < nv; ++j) {
          const double p = std::exp(s[j] - m);
          const double e = ds[j] + dm + std::fabs(s[j] - m) * (2.0 * u + kErrLog2e) + 2.0 * u;
          const double dp = p * std::expm1(e) * 1.01 + 0x1p-149;
          l += p, dls += dp;
          // P8: the f32 x = (vs fscale) p lies within xi of x64
          const double x = (s448 ? 448.0 : vs[j] * fscale) * p, xi = x * (std::expm1(e) * 1.01 + 5.05 * u) + 0x1p-140;
          const uint8_t c = e4m3_nearest(x, false), lo = e4m3_nearest(x - xi, false), hi = e4m3_nearest(x + xi, false);
          P(h, j) = e4m3(c);
          AMB(h, j) = e4m3(hi) - e4m3(lo);
          PQ(h, j) = std::max(0x1p-4 * (x + xi), 0x1p-10) * 1.01 + xi;  // |P8_32 - x64|
          R(h, j) = p * vs[j];
        }
        l64[h] = l;
        dl[h] = dls + 12.01 * u * (l + dls) + KEYS * 0x1p-149;
        cl.near(ts * H + h, sp.l[ts * H + h], l, dl[h]);
      }
      const Mat O_sh = P * V, O_amb = AMB * Va, O_abs = (P.cwiseAbs() + AMB) * Va;
      const Mat O_lo = R * V, O_lq = PQ * Va, O_lr = R * Va;
      compare_o(co, col, sp, ts, cfg, head_nan, l64, dl, kErr448, [&](int h, int d, double lh, double rel_l) {
        const double g = (1.0 + rel_l) * 1.01 / lh;
        return std::array<double, 4>{pscale * O_sh(h, d) / lh, pscale * (O_amb(h, d) + 8.01 * u * O_abs(h, d)) * g, O_lo(h, d) / lh,
                                     (pscale * O_lq(h, d) + O_lr(h, d) * bias + pscale * 8.01 * u * O_abs(h, d)) * g};
      });
    }
  }
  return {cq, cm, cl, co, col};
}

// ---- stage 2: merge ------------------------------------------------------------------------
// gm = max m_i; sl_i = l_i exp(m_i - gm); a = sum (sl_i / sum sl) o_i (sum sl <= 0: 1).
// x_scale = amax / 448 over the model's bf16 a; attn8 = the nearest E4M3 of a / x_scale
// (the model's rcp and product: within 2.01u of that quotient; a tie within it may go
// either way); amax = 0: x_scale 0 and zeros.
Report check_merge(const Config& cfg, const SplitOut& sp, const MergeOut& mg, int tokens) {
  Cmp ca("merge.attn"), cx("merge.x_scale"), c8("merge.attn8");
  const int OK = cfg.o_k(), NS = cfg.n_split, H = cfg.heads, D = cfg.head_dim;
  const double u = kU;
  for (int k = 0; k < tokens; ++k) {
    for (int h = 0; h < H; ++h) {
      std::vector<double> m(NS), l(NS);
      bool nan = false;
      double gm = -HUGE_VAL;
      for (int i = 0; i < NS; ++i) {
        m[i] = sp.m[(size_t(k) * NS + i) * H + h], l[i] = sp.l[(size_t(k) * NS + i) * H + h];
        nan |= std::isnan(m[i]) || std::isnan(l[i]);
        gm = std::max(gm, m[i]);
      }
      std::vector<double> sl(NS), eps(NS);
      double gs = 0.0, gs_err = 0.0;
      for (int i = 0; i < NS; ++i) {
        sl[i] = l[i] * std::exp(m[i] - gm);
        eps[i] = std::fabs(m[i] - gm) * (2.0 * u + kErrLog2e) + 4.0 * u;
        gs += sl[i];
        gs_err += sl[i] * eps[i] + 0x1p-149;
      }
      if (!(gs > 0.0)) gs = 1.0;
      const double eps_gs = gs_err / gs + 7.01 * u;
      for (int d = 0; d < D; ++d) {
        const size_t o = size_t(k) * OK + h * D + d;
        double a = 0.0, err = 0.0;
        bool onan = nan;
        for (int i = 0; i < NS; ++i) {
          const double oi = bf16(sp.o[(size_t(k) * NS + i) * OK + h * D + d]);
          onan |= std::isnan(oi);
          const double w = sl[i] / gs;
          a += w * oi;
          err += std::fabs(w * oi) * (eps[i] + eps_gs + 10.1 * u) * 1.01 + std::fabs(oi) * 0x1p-149 / gs;
        }
        if (onan) a = kNaN;
        ca.near(o, bf16(mg.attn[o]), a, err + 0x1p-8 * (std::fabs(a) + err) * 1.0001 + kTiny);
      }
    }
    // the per-token quant, from the model's bf16 a
    double amax = 0.0;
    bool nan = false;
    for (int i = 0; i < OK; ++i) {
      const double a = bf16(mg.attn[size_t(k) * OK + i]);
      nan |= std::isnan(a);
      amax = std::max(amax, std::fabs(a));
    }
    if (nan) amax = kNaN;
    const double xs = mg.x_scale[k];
    cx.near(k, xs, amax / 448.0, amax / 448.0 * (kErr448 + 1.01 * u));
    for (int i = 0; i < OK; ++i) {
      const size_t o = size_t(k) * OK + i;
      const double a = bf16(mg.attn[o]);
      const double got = dec8(mg.attn8[o]);
      if (amax == 0.0) {
        c8.exact(o, mg.attn8[o], e4m3_nearest(a * 0.0, false));  // +-0 codes
        continue;
      }
      const double y = a / xs, xi = std::fabs(y) * 2.02 * u;
      const double want = e4m3(e4m3_nearest(y, false));
      const double lo = e4m3(e4m3_nearest(y - xi, false)), hi = e4m3(e4m3_nearest(y + xi, false));
      c8.near(o, got, want, std::max(std::fabs(hi - want), std::fabs(lo - want)));
    }
  }
  return {ca, cx, c8};
}

// ---- stage 3: o_proj -----------------------------------------------------------------------
// p = s_o x_scale sum_i w_o[r][i] attn8[i]: E4M3 x E4M3 products are multiples of 2^-18 below
// 2^18, so the 2048-term double sum is exact. The model: each 32-block rounded once, 16 in a
// chain from 0 per quarter, 4 quarters from 0, two products, bf16.
Report check_oproj(const Config& cfg, const MergeOut& mg, const RankWeights& w, const OprojOut& op, int tokens) {
  serial_eigen();
  Cmp c("oproj.partial");
  const int OK = cfg.o_k(), HID = cfg.hidden;
  const int depth = 1 + OK / 4 / 32 + 4;
  Mat X(OK, tokens), Xa(OK, tokens);
  for (int k = 0; k < tokens; ++k)
    for (int i = 0; i < OK; ++i) X(i, k) = dec8(mg.attn8[size_t(k) * OK + i]), Xa(i, k) = std::fabs(X(i, k));
  const int R = 256;
  for (int r0 = 0; r0 < HID; r0 += R) {
    const int nr = std::min(R, HID - r0);
    Mat Wm(nr, OK), Wa(nr, OK);
    for (int r = 0; r < nr; ++r)
      for (int i = 0; i < OK; ++i) Wm(r, i) = dec8(w.w_o[size_t(r0 + r) * OK + i]), Wa(r, i) = std::fabs(Wm(r, i));
    const Mat P = Wm * X, A = Wa * Xa;
    for (int r = 0; r < nr; ++r)
      for (int k = 0; k < tokens; ++k) {
        const double sc = double(w.s_o[r0 + r]) * double(mg.x_scale[k]);
        const double want = sc * P(r, k);
        const double pre = std::fabs(sc) * depth * 1.01 * kU * A(r, k) + 2.02 * kU * std::fabs(want);
        const size_t o = size_t(k) * HID + r0 + r;
        c.near(o, bf16(op.partial[o]), want, pre + 0x1p-8 * (std::fabs(want) + pre) * 1.0001 + kTiny);
      }
  }
  return {c};
}

// ---- all-reduces and h_mid -----------------------------------------------------------------
// sum = sum_r p_r in double (exact for a few bf16 terms); the model's W f32 adds and bf16.
// W = 1 without the 0 start (the FFN's): the partial itself, bit for bit (-0 stays -0).
Report check_all_reduce(const std::string& name, const std::vector<const std::vector<uint16_t>*>& partials,
                        const std::vector<const std::vector<uint16_t>*>& out, bool zero_start) {
  Cmp c(name), cr(name + ".replicated");
  const size_t n = partials[0]->size();
  const int W = int(partials.size());
  for (size_t i = 0; i < n; ++i) {
    double sum = 0.0, abs = 0.0;
    for (int r = 0; r < W; ++r) {
      const double p = bf16((*partials[r])[i]);
      sum += p, abs += std::fabs(p);
    }
    for (size_t dst = 0; dst < out.size(); ++dst) {
      const uint16_t got = (*out[dst])[i];
      if (!zero_start && W == 1) c.exact(i, got, (*partials[0])[i]);  // bits
      else if (abs >= 0x1.fefffep127 && !std::isnan(sum) && (std::isinf(bf16(got)) || std::isnan(bf16(got)))) {
        // the f32 adds (or the bf16 rounding) may overflow where the double sum does not:
        // Inf, or Inf - Inf = NaN, is the IEEE result then; counted apart, not compared
        ++c.skipped;
      } else {
        const double pre = W * 1.01 * kU * abs;
        c.near(i, bf16(got), sum, pre + 0x1p-8 * (std::fabs(sum) + pre) * 1.0001 + kTiny);
      }
      cr.exact(i, got, (*out[0])[i]);
    }
  }
  return {c, cr};
}

Report check_residual(const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in, const std::vector<uint16_t>& h_mid) {
  Cmp c("h_mid");
  for (size_t i = 0; i < a.size(); ++i) {
    const double want = bf16(a[i]) + bf16(h_in[i]);
    c.near(i, bf16(h_mid[i]), want, (0x1p-8 + 1.01 * kU) * std::fabs(want) * 1.0001 + kTiny);
  }
  return {c};
}

// ---- MXFP8 ---------------------------------------------------------------------------------
// scale byte e = clamp(ceil(log2(f32(amax * f32(1/448)))) + 127, 1, 254) (NaN / Inf: 254,
// 0: 1); element = nearest E4M3 of clamp(f32(v * 2^(127 - e)), +-448), NaN -> 0x7F.
Report check_mxfp8(const std::string& name, const std::vector<uint16_t>& vals, const std::vector<uint8_t>& codes,
                   const std::vector<uint8_t>& scales) {
  Cmp cs(name + ".scale"), ce(name + ".elems");
  const double inv448 = double(float(1.0 / 448.0));
  for (size_t b = 0; b < scales.size(); ++b) {
    double amax = 0.0;
    bool nan = false;
    for (int i = 0; i < 32; ++i) {
      const double v = bf16(vals[b * 32 + i]);
      nan |= std::isnan(v);
      amax = std::max(amax, std::fabs(v));
    }
    const double y = nan ? kNaN : f32(amax * inv448);
    int e;
    if (std::isnan(y) || std::isinf(y)) e = 254;
    else if (y == 0.0) e = 1;
    else {
      int ex;
      const double f = std::frexp(y, &ex);  // y = f 2^ex, f in [0.5, 1)
      e = std::clamp((f == 0.5 ? ex - 1 : ex) + 127, 1, 254);
    }
    cs.exact(b, scales[b], e);
    const double inv = std::ldexp(1.0, 127 - e);
    for (int i = 0; i < 32; ++i) {
      double z = f32(bf16(vals[b * 32 + i]) * inv);
      if (!std::isnan(z)) z = std::clamp(z, -448.0, 448.0);
      ce.exact(b * 32 + i, codes[b * 32 + i], e4m3_nearest(z, true));
    }
  }
  return {cs, ce};
}

// ---- stage 4: router -----------------------------------------------------------------------
Report check_router(const Config& cfg, const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in,
                    const RankWeights& w, const RouterOut& r, int tokens) {
  serial_eigen();
  Cmp cr("router.rstd"), cx("router.xn"), cg("router.logit"), cs("router.sig");
  const int HID = cfg.hidden, E = cfg.n_routed, re = HID / cfg.threads();
  const double u = kU;
  // rstd: the f32 sum of squares is (re fma + 6 tree + 7 wave) adds of positives, v^2 2u
  const double eps_ss = (2.0 + re + 13.0) * 1.01 * u;
  const double rel_rstd = 0.5 * (eps_ss + 2.02 * u) * 1.01 + 2.02 * u;
  for (int k = 0; k < tokens; ++k) {
    double ss = 0.0;
    std::vector<double> v(HID);
    for (int i = 0; i < HID; ++i) {
      v[i] = bf16(a[size_t(k) * HID + i]) + bf16(h_in[size_t(k) * HID + i]);
      ss += v[i] * v[i];
    }
    const double rstd = 1.0 / std::sqrt(ss / HID + double(cfg.eps));
    cr.near(k, r.rstd[k], rstd, rstd * rel_rstd);
    for (int i = 0; i < HID; ++i) {
      const double want = v[i] * rstd * (1.0 + bf16(w.g_post[i]));
      const double pre = std::fabs(want) * (rel_rstd + 4.04 * u);
      cx.near(size_t(k) * HID + i, bf16(r.xn[size_t(k) * HID + i]), want, pre + 0x1p-8 * (std::fabs(want) + pre) * 1.0001 + kTiny);
    }
  }
  Report rep = {cr, cx};
  merge_into(rep, check_mxfp8("router.xn8", r.xn, r.xn8, r.xsc));
  // logits from the model's xn: bf16 x bf16 products are exact; the model's fdot2 chains
  Mat G(E, HID), Ga(E, HID), X(HID, tokens), Xa(HID, tokens);
  for (int e = 0; e < E; ++e)
    for (int i = 0; i < HID; ++i) G(e, i) = bf16(w.w_gate[size_t(e) * HID + i]), Ga(e, i) = std::fabs(G(e, i));
  for (int k = 0; k < tokens; ++k)
    for (int i = 0; i < HID; ++i) X(i, k) = bf16(r.xn[size_t(k) * HID + i]), Xa(i, k) = std::fabs(X(i, k));
  const Mat L = G * X, LA = Ga * Xa;
  const double depth = 2.0 * (HID / 512) + 8.0;
  for (int k = 0; k < tokens; ++k)
    for (int e = 0; e < E; ++e) {
      const size_t o = size_t(k) * E + e;
      const double lg = L(e, k), dlg = depth * 1.01 * u * LA(e, k) + 0x1p-140;
      cg.near(o, r.logit[o], lg, dlg);
      // sigmoid of bf16(logit): sigma' = s(1-s), at most e^dL larger across the interval
      const double dL = dlg + 0x1p-8 * (std::fabs(lg) + dlg);
      const double s = 1.0 / (1.0 + std::exp(-lg));
      const double bound = s * (1.0 - s) * std::exp(dL) * (dL + (std::fabs(lg) + dL) * (1.01 * u + kErrLog2e)) * 1.01 +
                           s * ((1.0 - s) * 2.02 * u + 2.02 * u) + 0x1p-149;
      cs.near(o, r.sig[o], s, bound);
    }
  rep.push_back(cg);
  rep.push_back(cs);
  return rep;
}

// ---- stage 5: routing ----------------------------------------------------------------------
// Scores sig + bias (one f32 add) in buckets of their top 25 orderable bits (what the route key
// keeps): the top 4 buckets, the lower expert first within one; weights sig * route_scale /
// max(sum of the 4 sigs, 1e-20); slot 4 the shared expert.
Report check_route(const Config& cfg, const RouterOut& r, const RankWeights& w, const RouteOut& ro, int tokens) {
  Cmp ci("route.ids"), cw("route.weights");
  const int E = cfg.n_routed, SL = cfg.moe_slots();
  for (int k = 0; k < tokens; ++k) {
    std::vector<int64_t> bucket(E);
    for (int e = 0; e < E; ++e) {
      const float sg = r.sig[size_t(k) * E + e], bi = w.bias[e];
      const float v = float(double(sg) + double(bi));
      // a NaN sig ranks last (the seed negates the NaN logit), a NaN bias by its own sign
      const uint32_t b = std::isnan(sg) ? 0xFFC00000u : std::isnan(bi) ? ((bits_of(bi) & 0x80000000u) | 0x7FC00000u) : bits_of(v);
      const int64_t mag = int64_t(b & 0x7FFFFFFFu) >> 7;
      bucket[e] = (b >> 31) ? -mag - 1 : mag;
    }
    std::vector<int> ord(E);
    std::iota(ord.begin(), ord.end(), 0);
    std::stable_sort(ord.begin(), ord.end(), [&](int a, int b) { return bucket[a] > bucket[b]; });
    double tot = 0.0;
    bool nan = false;
    for (int p = 0; p < cfg.top_k; ++p) {
      const double s = r.sig[size_t(k) * E + ord[p]];
      tot += s, nan |= std::isnan(s);
    }
    for (int p = 0; p < cfg.top_k; ++p) {
      const size_t o = size_t(k) * SL + p;
      ci.exact(o, ro.ids[o], ord[p]);
      const double want = nan ? kNaN : double(r.sig[size_t(k) * E + ord[p]]) * double(cfg.route_scale) / std::max(tot, double(1e-20f));
      cw.near(o, ro.weights[o], want, std::fabs(want) * 6.06 * kU + 0x1p-149);
    }
    ci.exact(size_t(k) * SL + cfg.top_k, ro.ids[size_t(k) * SL + cfg.top_k], cfg.shared_expert());
    cw.exact(size_t(k) * SL + cfg.top_k, ro.weights[size_t(k) * SL + cfg.top_k], double(cfg.shared_weight));
  }
  return {ci, cw};
}

namespace {

// (token, slot) pairs by expert.
std::map<int, std::vector<std::pair<int, int>>> uses_of(const Config& cfg, const RouteOut& ro, int tokens) {
  std::map<int, std::vector<std::pair<int, int>>> uses;
  for (int k = 0; k < tokens; ++k)
    for (int s = 0; s < cfg.moe_slots(); ++s) uses[ro.ids[size_t(k) * cfg.moe_slots() + s]].push_back({k, s});
  return uses;
}

// Rows [r0, r0 + nr) of an MXFP4 (or, fp8, MXFP8: one E4M3 byte an element) matrix (cols
// wide) with its E8M0 scales, as doubles.
void decode_mxfp4_rows(Mat& out, Mat& out_abs, const std::vector<uint8_t>& w, const std::vector<uint8_t>& s, int r0, int nr,
                       int cols, bool fp8 = false) {
  out.resize(nr, cols), out_abs.resize(nr, cols);
  for (int r = 0; r < nr; ++r)
    for (int i = 0; i < cols; ++i) {
      const uint8_t byte = fp8 ? w[size_t(r0 + r) * cols + i] : w[size_t(r0 + r) * cols / 2 + i / 2];
      const double code = fp8 ? dec8(byte) : dec4(i % 2 ? uint8_t(byte >> 4) : uint8_t(byte & 15));
      const double v = code * decs(s[size_t(r0 + r) * cols / 32 + i / 32]);
      out(r, i) = v, out_abs(r, i) = std::fabs(v);
    }
}

}  // namespace

// ---- stage 5: gate / up --------------------------------------------------------------------
// g = sum_i gate[r][i] x[i] with x = xn8 2^(xsc-127), gate = E2M1 2^(s13-127): every product
// exact, the double sum exact to 2^-53. The model rounds each 32-block once, chains a wave's
// blocks from 0 and adds the 8 waves from 0.
Report check_up_gate(const Config& cfg, const RouteOut& ro, const RouterOut& r, const ExpertSource& src, int rank,
                     const MoeOut& moe, int tokens) {
  serial_eigen();
  Cmp cg("moe.gate"), cu("moe.up");
  const int HID = cfg.hidden, I = cfg.inter, SL = cfg.moe_slots();
  const double depth = 1.0 + (HID / 32) / cfg.waves + cfg.waves;
  for (const auto& [e, uses] : uses_of(cfg, ro, tokens)) {
    const auto ew = src.expert(rank, e);
    const int nu = int(uses.size());
    Mat X(HID, nu), Xa(HID, nu);
    for (int j = 0; j < nu; ++j) {
      const int k = uses[j].first;
      for (int i = 0; i < HID; ++i)
        X(i, j) = dec8(r.xn8[size_t(k) * HID + i]) * decs(r.xsc[size_t(k) * HID / 32 + i / 32]), Xa(i, j) = std::fabs(X(i, j));
    }
    const int R = 64;
    for (int r0 = 0; r0 < I; r0 += R) {
      const int nr = std::min(R, I - r0);
      Mat Wg, Wga, Wu, Wua;
      decode_mxfp4_rows(Wg, Wga, ew->w13, ew->s13, r0, nr, HID, cfg.expert_fp8(e));
      decode_mxfp4_rows(Wu, Wua, ew->w13, ew->s13, I + r0, nr, HID, cfg.expert_fp8(e));
      const Mat G = Wg * X, GA = Wga * Xa, U = Wu * X, UA = Wua * Xa;
      for (int j = 0; j < nu; ++j) {
        const auto [k, s] = uses[j];
        for (int rr = 0; rr < nr; ++rr) {
          const size_t o = (size_t(k) * SL + s) * I + r0 + rr;
          cg.near(o, moe.gate[o], G(rr, j), depth * 1.01 * kU * GA(rr, j) + 0x1p-140);
          cu.near(o, moe.up[o], U(rr, j), depth * 1.01 * kU * UA(rr, j) + 0x1p-140);
        }
      }
    }
  }
  return {cg, cu};
}

double swiglu(double g, double u, double limit) {
  const double gp = std::isnan(g) ? g : std::min(g, limit);
  const double up = std::isnan(u) ? u : std::clamp(u, -limit, limit);
  const double x = 1.702 * gp;
  const double sg = 1.0 / (1.0 + std::exp(-x));
  return (gp * sg) * (up + 1.0);
}

// ---- stage 5: swiglu and the mid MXFP8 -----------------------------------------------------
// y = swiglu(g, u) in double from the model's f32 g, u. The model's steps: x = f32(1.702) g'
// (u + e_1.702), exp2 of x (-log2 e) ((u + e_log2e)|x| on the exponential, and 1 ulp), 1 + e,
// rcp, g' s, u' + 1, the product: relative (1 - s)(|x|(2u + e_c + e_l) + 2u) + 5u; bf16.
Report check_mid(const Config& cfg, const MoeOut& moe, int tokens) {
  Cmp cm("moe.mid");
  const double L = double(cfg.swiglu_limit), u = kU;
  const double e_c = std::fabs(double(1.702f) - 1.702) / 1.702;
  const size_t n = size_t(tokens) * cfg.moe_slots() * cfg.inter;
  for (size_t i = 0; i < n; ++i) {
    const double g = moe.gate[i], uu = moe.up[i];
    const double y = swiglu(g, uu, L);
    const double gp = std::min(g, L), x = 1.702 * gp, s = 1.0 / (1.0 + std::exp(-x));
    const double rel = (1.0 - s) * (std::fabs(x) * (2.02 * u + e_c + kErrLog2e) + 2.02 * u) + 5.05 * u;
    // where e^-x overflows f32 (x < -88.7) the model's sigmoid is 0 and its true value below
    // 2^-127; a subnormal sigmoid has an absolute error 2^-150: |g' (u' + 1)| 2^-126 covers both
    const double gu = std::fabs(gp * (std::clamp(uu, -L, L) + 1.0));
    const double pre = std::fabs(y) * rel * 1.01 + gu * 0x1p-126 + 0x1p-140;
    cm.near(i, bf16(moe.mid[i]), y, pre + 0x1p-8 * (std::fabs(y) + pre) * 1.0001 + kTiny);
  }
  Report rep = {cm};
  merge_into(rep, check_mxfp8("moe.mid8", moe.mid, moe.mid8, moe.midsc));
  return rep;
}

// ---- stage 5: down -------------------------------------------------------------------------
// partial = sum_slot w_slot sum_i w2[e][r][i] mid[i] (E2M1 2^(s2-127) x E4M3 2^(midsc-127):
// exact products). The model: 4 block roundings and 3 adds a 128-k unit, a product by the
// route weight, a chain of units (narrow: ceil(4 KC / 4) a quarter plus the shared ones;
// wide: ceil((4S+1) KC / 4)), 8 or 4 quarter sums, bf16.
Report check_down(const Config& cfg, const RouteOut& ro, const ExpertSource& src, int rank, const MoeOut& moe, int tokens) {
  serial_eigen();
  Cmp c("moe.partial");
  const int HID = cfg.hidden, I = cfg.inter, SL = cfg.moe_slots(), KC = I / 128;
  const int chain = cfg.wide(tokens) ? ((cfg.top_k * tokens + 1) * KC + 3) / 4 : (cfg.top_k * KC + 3) / 4 + (KC + 3) / 4;
  const double depth = 4.0 + 1.0 + chain + 8.0;
  Mat out = Mat::Zero(tokens, HID), abs = Mat::Zero(tokens, HID);
  for (const auto& [e, uses] : uses_of(cfg, ro, tokens)) {
    const auto ew = src.expert(rank, e);
    const int nu = int(uses.size());
    Mat M(I, nu), Ma(I, nu);
    for (int j = 0; j < nu; ++j) {
      const size_t ks = size_t(uses[j].first) * SL + uses[j].second;
      for (int i = 0; i < I; ++i)
        M(i, j) = dec8(moe.mid8[ks * I + i]) * decs(moe.midsc[ks * I / 32 + i / 32]), Ma(i, j) = std::fabs(M(i, j));
    }
    const int R = 512;
    for (int r0 = 0; r0 < HID; r0 += R) {
      const int nr = std::min(R, HID - r0);
      Mat Wd, Wda;
      decode_mxfp4_rows(Wd, Wda, ew->w2, ew->s2, r0, nr, I, cfg.expert_fp8(e));
      const Mat P = Wd * M, PA = Wda * Ma;
      for (int j = 0; j < nu; ++j) {
        const auto [k, s] = uses[j];
        const double wt = ro.weights[size_t(k) * SL + s];
        for (int rr = 0; rr < nr; ++rr) out(k, r0 + rr) += wt * P(rr, j), abs(k, r0 + rr) += std::fabs(wt) * PA(rr, j);
      }
    }
  }
  for (int k = 0; k < tokens; ++k)
    for (int r = 0; r < HID; ++r) {
      const size_t o = size_t(k) * HID + r;
      const double want = out(k, r), pre = depth * 1.01 * kU * abs(k, r);
      c.near(o, bf16(moe.partial[o]), want, pre + 0x1p-8 * (std::fabs(want) + pre) * 1.0001 + kTiny);
    }
  return {c};
}

// ---- the whole step ------------------------------------------------------------------------
Report check_step(const LayerWeights& w, const StepInputs& in, const StepResult& res) {
  const Config& cfg = w.cfg;
  const int S = in.shared.tokens, W = cfg.tp;
  // the ranks' checks are independent (ExpertSource is thread-safe): one thread a rank, the
  // reports merged in rank order
  std::vector<Report> per(W);
#pragma omp parallel for schedule(dynamic)
  for (int r = 0; r < W; ++r) {
    const RankResult& R = res.ranks[r];
    Report& rep = per[r];
    merge_into(rep, check_index(cfg, in.shared, in.ranks[r].index_scores, R.index));
    merge_into(rep, check_split(cfg, in.shared, in.ranks[r], R.index, R.split));
    merge_into(rep, check_merge(cfg, R.split, R.merge, S));
    merge_into(rep, check_oproj(cfg, R.merge, w.ranks[r], R.oproj, S));
    merge_into(rep, check_residual(R.a, in.shared.h_in, R.h_mid));
    merge_into(rep, check_router(cfg, R.a, in.shared.h_in, w.ranks[r], R.router, S));
    merge_into(rep, check_route(cfg, R.router, w.ranks[r], R.route, S));
    merge_into(rep, check_up_gate(cfg, R.route, R.router, *w.experts, r, R.moe, S));
    merge_into(rep, check_mid(cfg, R.moe, S));
    merge_into(rep, check_down(cfg, R.route, *w.experts, r, R.moe, S));
  }
  Report rep;
  for (const Report& p : per) merge_into(rep, p);
  std::vector<const std::vector<uint16_t>*> po, pa, pf, pr;
  for (int r = 0; r < W; ++r) {
    const RankResult& R = res.ranks[r];
    po.push_back(&R.oproj.partial), pa.push_back(&R.a), pf.push_back(&R.moe.partial), pr.push_back(&R.ar_out);
  }
  merge_into(rep, check_all_reduce("a", po, pa, true));
  merge_into(rep, check_all_reduce("ar_out", pf, pr, W > 1));
  return rep;
}

const LayerWeights& cached_layer(const std::string& preset, int tp, uint64_t seed) {
  static std::mutex mu;
  static std::map<std::tuple<std::string, int, uint64_t>, std::unique_ptr<LayerWeights>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{preset, tp, seed}];
  if (!slot) slot = std::make_unique<LayerWeights>(test::random_layer(k4::preset(preset, tp), seed));
  return *slot;
}

}  // namespace k4::f64
