// runner.cu -- the host runner of the stage kernels (runner.hpp): uploads, launches all ranks
// of the TP group on one GPU, the exchange buffers, downloads into reference StepResults.
//
// A step, as the seed runs it (every launch covers all W ranks, grid y = rank):
//   index -> split -> merge -> o_proj (each rank's partial rows pushed into every peer's, or
//   the row task owner's, receive buffer) -> attention all-reduce (+ h_mid) -> router ->
//   route_top4 -> [the routed experts uploaded] -> up/gate -> down (pushed likewise) -> FFN
//   all-reduce -> ar_out.
#include "device/runner.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "device/mutants.hpp"
#include "device/stages.hpp"
#include "device/weight_layout.hpp"
#include "golden/format/tensors.hpp"

namespace k4::gpu {
namespace {

template <class T>
void upload(DeviceBuffer<T>& d, const std::vector<T>& h) {
  d.resize(h.size());
  if (!h.empty()) d.upload(h.data(), h.size());
}
template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& h) {
  DeviceBuffer<T> d;
  upload(d, h);
  return d;
}
template <class T>
std::vector<T> download(const DeviceBuffer<T>& d, size_t off, size_t n) {
  std::vector<T> h(n);
  if (n > 0) K4_HIP_CHECK(hipMemcpy(h.data(), d.get() + off, n * sizeof(T), hipMemcpyDeviceToHost));
  return h;
}
template <class T>
std::vector<T> download(const DeviceBuffer<T>& d, size_t n) {
  return download(d, 0, n);
}

void sync() { K4_HIP_CHECK(hipDeviceSynchronize()); }

[[noreturn]] void bad_weights(const std::string& what) { throw std::invalid_argument("weights: " + what); }

void expect_size(const std::string& what, size_t got, size_t want) {
  if (got != want) bad_weights(what + " has " + std::to_string(got) + " elements, expected " + std::to_string(want));
}

// The experts of W ranks on the device and their pointer tables ([rank * n_experts + e]).
class Experts {
 public:
  void reset(int ranks, int n_experts) {
    W_ = ranks, n_exp_ = n_experts;
    have_.clear();
    for (auto* h : {&h_w13_, &h_s13_, &h_w2_, &h_s2_, &h_z2_, &h_w13f_, &h_w2f_}) h->assign(size_t(W_) * n_exp_, nullptr);
    dirty_ = true;
  }
  // Uploads every expert ids (W, S, slots) addresses; src_rank[r]: the shard table rank r holds.
  // frag: also the fragment-order copies of w13 and w2 the fast path reads (weight_layout.hpp).
  void ensure(const ExpertSource& src, const Config& cfg, const std::vector<int>& src_rank,
              const std::vector<int32_t>& ids, int S, bool frag = false) {
    const int SL = cfg.moe_slots();
    for (int r = 0; r < W_; ++r)
      for (int ks = 0; ks < S * SL; ++ks) {
        int e = ids[size_t(r) * S * SL + ks];
        e = std::min(e, n_exp_ - 1);
        if (e < 0) throw std::runtime_error("device routing produced expert id " + std::to_string(e));
        const auto have = have_.find({r, e});
        if (have != have_.end() && (!frag || have->second.w13f.size() > 0)) continue;
        const size_t H = cfg.hidden, I = cfg.inter;
        const std::string name = "expert " + std::to_string(e) + " of rank " + std::to_string(src_rank[r]);
        std::shared_ptr<const ExpertWeights> ew;
        try {
          ew = src.expert(src_rank[r], e);
        } catch (const std::exception& x) {
          throw ExpertUnavailable("the device's routing picked " + name + ", which the weights cannot give: " + x.what());
        }
        expect_size(name + " w13", ew->w13.size(), 2 * I * size_t(cfg.w13_row_bytes(e)));
        expect_size(name + " s13", ew->s13.size(), 2 * I * H / 32);
        expect_size(name + " w2", ew->w2.size(), H * size_t(cfg.w2_row_bytes(e)));
        expect_size(name + " s2", ew->s2.size(), H * I / 32);
        Dev& d = have_[{r, e}];
        upload(d.w13, ew->w13), upload(d.s13, ew->s13), upload(d.w2, ew->w2), upload(d.s2, ew->s2);
        const size_t i = size_t(r) * n_exp_ + e;
        h_w13_[i] = d.w13.get(), h_s13_[i] = d.s13.get(), h_w2_[i] = d.w2.get(), h_s2_[i] = d.s2.get();
        if (d.z2.get() == nullptr) {  // the expert's zero-row flags, from its w2 and s2 on the device
          const DevCfg dc = dev_cfg(cfg);
          d.z2.resize(zero_row_flags_bytes(dc));
          launch_zero_row_flags(ZeroRowFlagsArgs{d.z2.get(), d.w2.get(), d.s2.get(), e, dc}, 0);  // synced below
          h_z2_[i] = d.z2.get();
        }
        if (frag) {
          upload(d.w13f, to_fragment_order(ew->w13, H / 2)), upload(d.w2f, to_fragment_order(ew->w2, I / 2));
          h_w13f_[i] = d.w13f.get(), h_w2f_[i] = d.w2f.get();
        }
        dirty_ = true;
      }
    if (dirty_) {
      sync();  // the zero-row flags launched above, before any stream's step reads them
      upload(d_w13_, h_w13_), upload(d_s13_, h_s13_), upload(d_w2_, h_w2_), upload(d_s2_, h_s2_), upload(d_z2_, h_z2_);
      upload(d_w13f_, h_w13f_), upload(d_w2f_, h_w2f_);
      dirty_ = false;
    }
  }
  ExpertTable table() const { return ExpertTable{d_w13_.get(), d_s13_.get(), d_w2_.get(), d_s2_.get(), d_z2_.get()}; }
  // the fast path's: w13 and w2 in fragment order (nullptr where not uploaded: the kernels flag it)
  ExpertTable fast_table() const { return ExpertTable{d_w13f_.get(), d_s13_.get(), d_w2f_.get(), d_s2_.get(), d_z2_.get()}; }

 private:
  struct Dev {
    DeviceBuffer<uint8_t> w13, s13, w2, s2, z2, w13f, w2f;
  };
  int W_ = 0, n_exp_ = 0;
  bool dirty_ = true;
  std::map<std::pair<int, int>, Dev> have_;
  std::vector<const uint8_t*> h_w13_, h_s13_, h_w2_, h_s2_, h_z2_, h_w13f_, h_w2f_;
  DeviceBuffer<const uint8_t*> d_w13_, d_s13_, d_w2_, d_s2_, d_z2_, d_w13f_, d_w2f_;
};

}  // namespace

// ------------------------------------------------------------------------------ the step
struct Runner::Impl {
  Config cfg;
  DevCfg dc;
  int W = 1;
  std::shared_ptr<const ExpertSource> src;
  std::vector<int> src_rank;
  // weights, (W, ...) slices
  DeviceBuffer<uint8_t> w_o;
  DeviceBuffer<float> s_o, bias;
  DeviceBuffer<uint16_t> g_post, w_gate;
  DeviceBuffer<float> w_gate_f32;  // router.gate = f32 only
  Experts ex;
  // the step's inputs
  int S = 0, q_len = 1, bt_width = 0, score_width = 0, ag = 0;
  DeviceBuffer<int32_t> seq_lens, block_table;
  DeviceBuffer<uint8_t> live;  // (S) V2: live_rows of the config and seq_lens
  DeviceBuffer<float> scores;
  DeviceBuffer<uint16_t> h_in, q;
  DeviceBuffer<uint8_t> k_cache, v_cache;
  DeviceBuffer<float> k_scale, v_scale;
  size_t cache_slice = 0, scale_slice = 0;
  std::vector<int> n_ctx_host;  // for the byte counts
  int step_experts = 0;         // the step's distinct experts over all ranks (fetch_experts)
  // the stages' outputs, (W, ...) slices
  DeviceBuffer<int32_t> table, blocks, n_ctx, cand;
  DeviceBuffer<uint8_t> long_row, q8, attn8, xn8, xsc, mid8, midsc;
  DeviceBuffer<uint16_t> o, attn, partial, recv_attn, a, h_mid, xn, mid, ffn_partial, recv_ffn, ar_out;
  DeviceBuffer<float> m, l, x_scale, rstd, logit, sig, weights, gate, up;
  DeviceBuffer<int32_t> key, ids, ulist;
  // the fast path (moe_fast.cu): B-fragment limbs of xn8 and mid8, their NaN flags, the down
  // units, the missing-expert flag
  bool fast = false;
  hipStream_t st = 0;  // every launch's stream (a capture stream while a graph is recorded)
  DeviceBuffer<uint32_t> xlimbs, mlimbs;
  DeviceBuffer<uint8_t> xnan, mnan;
  DeviceBuffer<float> units;
  DeviceBuffer<int> missing;
  // the fast o_proj (oproj_fast.cu): attn8's B-fragment limbs and NaN flags
  bool fast_o = false;
  bool fast_s = false;  // split's QK and PV on the tensor cores (split.cu's kMma body)
  DeviceBuffer<uint32_t> olimbs;
  DeviceBuffer<uint8_t> onan;

  explicit Impl(const LayerWeights& w) : cfg(w.cfg), dc(dev_cfg(w.cfg)), W(w.cfg.tp), src(w.experts) {
    cfg.validate();
    if (int(w.ranks.size()) != W) bad_weights(std::to_string(w.ranks.size()) + " rank shards for tp = " + std::to_string(W));
    if (!src) bad_weights("no expert source");
    const size_t H = cfg.hidden, OK = cfg.o_k(), E = cfg.n_routed;
    std::vector<uint8_t> wo;
    std::vector<float> so, bi;
    std::vector<uint16_t> gp, wg;
    std::vector<float> wg32;
    const bool f32_gate = cfg.variant.router_gate == RouterGate::f32;
    for (int r = 0; r < W; ++r) {
      const RankWeights& rw = w.ranks[r];
      const std::string p = "rank" + std::to_string(r) + "/";
      expect_size(p + "w_o", rw.w_o.size(), H * OK);
      expect_size(p + "s_o", rw.s_o.size(), H);
      expect_size(p + "g_post", rw.g_post.size(), H);
      expect_size(p + "w_gate", rw.w_gate.size(), E * H);
      if (f32_gate) expect_size(p + "w_gate_f32 (router.gate = f32)", rw.w_gate_f32.size(), E * H);
      expect_size(p + "bias", rw.bias.size(), E);
      wo.insert(wo.end(), rw.w_o.begin(), rw.w_o.end());
      so.insert(so.end(), rw.s_o.begin(), rw.s_o.end());
      gp.insert(gp.end(), rw.g_post.begin(), rw.g_post.end());
      wg.insert(wg.end(), rw.w_gate.begin(), rw.w_gate.end());
      if (f32_gate) wg32.insert(wg32.end(), rw.w_gate_f32.begin(), rw.w_gate_f32.end());
      bi.insert(bi.end(), rw.bias.begin(), rw.bias.end());
      src_rank.push_back(r);
    }
    upload(w_o, wo), upload(s_o, so), upload(g_post, gp), upload(w_gate, wg), upload(w_gate_f32, wg32), upload(bias, bi);
    ex.reset(W, cfg.n_experts());
  }

  void set_inputs(const StepInputs& in, const RunOptions& opt) {
    validate_inputs(in, cfg);
    const StepShared& sh = in.shared;
    S = sh.tokens, q_len = sh.q_len, bt_width = sh.bt_width, score_width = sh.score_width;
    ag = opt.ar_form < 0 ? (cfg.ag_rs(S + (K4_MUTANT_ON(39) ? 1 : 0)) ? 1 : 0) : (opt.ar_form != 0 ? 1 : 0);
    upload(seq_lens, sh.seq_lens), upload(block_table, sh.block_table), upload(live, live_rows(cfg, sh.seq_lens));
    upload(h_in, sh.h_in);
    int max_pages = 1;
    for (const StepRank& R : in.ranks) max_pages = std::max(max_pages, R.n_pages);
    const size_t page_bytes = size_t(cfg.page) * cfg.head_dim;
    cache_slice = size_t(max_pages) * page_bytes;
    scale_slice = cfg.one_kv_scale() ? 1 : size_t(max_pages) * cfg.page;
    std::vector<uint16_t> qh;
    std::vector<float> sch;  // (W, S, score_width): every rank's own index scores
    std::vector<uint8_t> kh(W * cache_slice, 0), vh(W * cache_slice, 0);
    std::vector<float> ksh(W * scale_slice, 0.0f), vsh(W * scale_slice, 0.0f);
    for (int r = 0; r < W; ++r) {
      const StepRank& R = in.ranks[r];
      qh.insert(qh.end(), R.q.begin(), R.q.end());
      sch.insert(sch.end(), R.index_scores.begin(), R.index_scores.end());
      std::copy(R.k_cache.begin(), R.k_cache.end(), kh.begin() + r * cache_slice);
      std::copy(R.v_cache.begin(), R.v_cache.end(), vh.begin() + r * cache_slice);
      std::copy(R.k_scale.begin(), R.k_scale.end(), ksh.begin() + r * scale_slice);
      std::copy(R.v_scale.begin(), R.v_scale.end(), vsh.begin() + r * scale_slice);
    }
    upload(q, qh), upload(scores, sch), upload(k_cache, kh), upload(v_cache, vh), upload(k_scale, ksh), upload(v_scale, vsh);
    // outputs
    const size_t OK = cfg.o_k(), H = cfg.hidden, NS = cfg.n_split, HD = cfg.heads, E = cfg.n_routed;
    const size_t SL = cfg.moe_slots(), I = cfg.inter, TW = cfg.sparse_table_words(), WS = size_t(W) * S;
    table.resize(WS * TW), blocks.resize(WS * cfg.topk_blocks), n_ctx.resize(WS), long_row.resize(WS);
    cand.resize(WS * NS * 16 * 2);
    q8.resize(WS * OK), o.resize(WS * NS * OK), m.resize(WS * NS * HD), l.resize(WS * NS * HD);
    attn.resize(WS * OK), attn8.resize(WS * OK), x_scale.resize(WS);
    partial.resize(WS * H), recv_attn.resize(size_t(W) * WS * H), a.resize(WS * H), h_mid.resize(WS * H);
    xn.resize(WS * H), xn8.resize(WS * H), xsc.resize(WS * H / 32), rstd.resize(WS);
    logit.resize(WS * E), sig.resize(WS * E), key.resize(WS * E), ids.resize(WS * SL), weights.resize(WS * SL);
    mid.resize(WS * SL * I), gate.resize(WS * SL * I), up.resize(WS * SL * I), mid8.resize(WS * SL * I);
    midsc.resize(WS * SL * I / 32), ulist.resize(size_t(W) * (cfg.n_experts() + 1));
    ffn_partial.resize(WS * H), recv_ffn.resize(size_t(W) * WS * H), ar_out.resize(WS * H);
    n_ctx_host.clear();
    int path = opt.moe_path;
    if (path < 0) {
      const char* env = std::getenv("K4_FAST");
      path = env != nullptr && env[0] == '1' ? 1 : 0;
    }
    fast = path == 1 && fast_moe_supported(dc, S);
    fast_o = path == 1 && fast_oproj_supported(dc, S);
    fast_s = path == 1 && fast_split_supported(dc, S);
    if (fast_o) olimbs.resize(WS * OK / 32 * 24), onan.resize(WS * OK / 32);
    if (fast) {
      xlimbs.resize(WS * H / 32 * 24), xnan.resize(WS * H / 32);
      mlimbs.resize(WS * SL * I / 32 * 24), mnan.resize(WS * SL * I / 32);
      units.resize(WS * SL * H * (I / 128)), missing.resize(1);
      K4_HIP_CHECK(hipMemset(missing.get(), 0, sizeof(int)));
    }
  }

  // ---- the stages, all ranks a launch
  void stage_index() {
    launch_select_blocks(IndexArgs{table.get(), blocks.get(), n_ctx.get(), long_row.get(), cand.get(), seq_lens.get(),
                                   block_table.get(), scores.get(), S, q_len, bt_width, score_width, W, dc},
                         st);
  }
  void stage_split() {
    launch_split_attention(SplitArgs{q8.get(), o.get(), m.get(), l.get(), table.get(), q.get(), k_cache.get(),
                                     v_cache.get(), k_scale.get(), v_scale.get(), cache_slice, scale_slice, S, W, dc},
                           st, fast_s);
  }
  void stage_merge() {
    launch_merge_partitions(MergeArgs{attn.get(), attn8.get(), x_scale.get(), o.get(), m.get(), l.get(), S, W, dc}, st);
  }
  void stage_oproj() {
    const OprojArgs o{partial.get(), recv_attn.get(), attn8.get(), x_scale.get(), w_o.get(), s_o.get(), S, W, ag, dc};
    if (fast_o) {  // oproj_fast.cu: attn8's B-fragment limbs, then the tensor-core GEMV
      launch_e4m3_limbs(LimbsArgs{olimbs.get(), onan.get(), attn8.get(), W * S, dc.o_k}, st);
      launch_fast_o_proj(FastOprojArgs{o, olimbs.get(), onan.get()}, st);
    } else {
      launch_o_proj_partials(o, st);
    }
  }
  void stage_attn_ar() {
    launch_all_reduce_rows(AllReduceArgs{a.get(), h_mid.get(), recv_attn.get(), h_in.get(), S, cfg.hidden, W,
                                         cfg.o_rows, 1, ag},
                           st);
  }
  void stage_router() {
    launch_route_scores(RouterArgs{xn.get(), xn8.get(), xsc.get(), rstd.get(), logit.get(), sig.get(), key.get(),
                                   a.get(), h_in.get(), g_post.get(), w_gate.get(), w_gate_f32.get(), bias.get(), S, W, dc},
                        st);
  }
  void stage_route() { launch_route_top4(RouteArgs{ids.get(), weights.get(), sig.get(), key.get(), S, W, dc}, st); }
  void fetch_experts() {
    sync();
    const std::vector<int32_t> h_ids = download(ids, size_t(W) * S * cfg.moe_slots());
    ex.ensure(*src, cfg, src_rank, h_ids, S, fast);
    step_experts = 0;  // the step's distinct experts, summed over ranks (for the byte counts)
    for (int r = 0; r < W; ++r) {
      std::vector<char> seen(cfg.n_experts(), 0);
      for (int ks = 0; ks < S * cfg.moe_slots(); ++ks)
        seen[std::min<int>(h_ids[size_t(r) * S * cfg.moe_slots() + ks], cfg.n_experts() - 1)] = 1;
      for (char c : seen) step_experts += c;
    }
  }
  void stage_up_gate() {
    launch_experts_up_gate(UpGateArgs{mid.get(), gate.get(), up.get(), mid8.get(), midsc.get(), ulist.get(), ids.get(),
                                      xn8.get(), xsc.get(), live.get(), ex.table(), S, W, dc},
                           st);
  }
  void stage_down() {
    launch_experts_down(DownArgs{ffn_partial.get(), recv_ffn.get(), ids.get(), weights.get(), mid8.get(), midsc.get(),
                                 live.get(), ex.table(), S, W, ag, dc},
                        st);
  }
  // stage 5 on the tensor cores (moe_fast.cu): xn8's limbs, the expert list, up/gate, mid8's
  // limbs, the down units, then moe.cu's down kernel assembling those units in the model's order
  void stage_up_gate_fast() {
    const size_t H = cfg.hidden;
    launch_e4m3_limbs(LimbsArgs{xlimbs.get(), xnan.get(), xn8.get(), W * S, int(H)}, st);
    // V2 (exclude_pad) does not come here: the fast up/gate has no slot_joins (it would compute a
    // pad row's routed slots), so fast_moe_supported sends such steps to moe.cu's kernels
    launch_expert_list(UpGateArgs{mid.get(), gate.get(), up.get(), mid8.get(), midsc.get(), ulist.get(), ids.get(),
                                  xn8.get(), xsc.get(), live.get(), ex.table(), S, W, dc},
                       st);
    launch_fast_up_gate(FastUpGateArgs{mid.get(), gate.get(), up.get(), mid8.get(), midsc.get(), missing.get(),
                                       ulist.get(), ids.get(), xlimbs.get(), xnan.get(), xsc.get(), ex.fast_table(), S, W,
                                       dc},
                        st);
  }
  void stage_down_fast() {
    launch_e4m3_limbs(LimbsArgs{mlimbs.get(), mnan.get(), mid8.get(), W * S * cfg.moe_slots(), cfg.inter}, st);
    launch_fast_down_units(FastUnitsArgs{units.get(), missing.get(), ulist.get(), ids.get(), mlimbs.get(), mnan.get(),
                                         midsc.get(), ex.fast_table(), S, W, dc},
                           st);
    DownArgs d{ffn_partial.get(), recv_ffn.get(), ids.get(), weights.get(), mid8.get(), midsc.get(),
               live.get(), ex.table(), S, W, ag, dc};
    d.units = units.get();
    launch_experts_down(d, st);
  }
  // The fast path's flag: a kernel found an expert of the step's routing not on the device.
  bool experts_missing() {
    int m = 0;
    K4_HIP_CHECK(hipMemcpy(&m, missing.get(), sizeof(int), hipMemcpyDeviceToHost));
    return m != 0;
  }

  void stage_ffn_ar() {
    // W == 1: the seed stores the partial itself (ffn_finish), no 0.0 start
    launch_all_reduce_rows(AllReduceArgs{ar_out.get(), nullptr, recv_ffn.get(), nullptr, S, cfg.hidden, W,
                                         cfg.dn_rows, W > 1 ? 1 : 0, ag},
                           st);
  }

  // fetch: read the routing back and upload the experts it needs (the reference path's host
  // round trip); without it (the fast path's timed and captured steps) the experts must be
  // resident already, which the kernels check (experts_missing).
  void run_all(int last_stage = 5, bool fetch = true) {
    if (last_stage < 0 || last_stage > 5)
      throw std::invalid_argument("RunOptions::last_stage " + std::to_string(last_stage) + " is outside 0..5");
    void (Impl::*const upto[])() = {&Impl::stage_index, &Impl::stage_split, &Impl::stage_merge, &Impl::stage_oproj,
                                    &Impl::stage_attn_ar, &Impl::stage_router};
    const int n_first = last_stage <= 2 ? last_stage + 1 : last_stage + 2;  // stage 3 is two launches
    for (int i = 0; i < std::min(n_first, 6); ++i) (this->*upto[i])();
    if (last_stage == 5) {
      stage_route();
      if (fetch || !fast) fetch_experts();
      if (fast) stage_up_gate_fast(), stage_down_fast();
      else stage_up_gate(), stage_down();
      stage_ffn_ar();
    }
    if (fetch) sync();
  }

  // The device buffer that holds a stage output, every rank's (W, per-rank) slices; its
  // result field and its per-rank size are the schema table's (golden/format/tensors.hpp).
  using OutputBuffer = std::variant<DeviceBuffer<uint8_t> Impl::*, DeviceBuffer<uint16_t> Impl::*,
                                    DeviceBuffer<int32_t> Impl::*, DeviceBuffer<float> Impl::*>;
  static OutputBuffer output_buffer(const golden::TensorSpec& s) {
    static const std::map<std::string, OutputBuffer> buffers = {
        {"index/outputs/sparse_table", &Impl::table}, {"index/outputs/blocks", &Impl::blocks},
        {"index/outputs/n_ctx", &Impl::n_ctx},         {"index/outputs/long_row", &Impl::long_row},
        {"split/outputs/q8", &Impl::q8},               {"split/outputs/o", &Impl::o},
        {"split/outputs/m", &Impl::m},                 {"split/outputs/l", &Impl::l},
        {"merge/outputs/attn", &Impl::attn},           {"merge/outputs/attn8", &Impl::attn8},
        {"merge/outputs/x_scale", &Impl::x_scale},     {"oproj/outputs/partial", &Impl::partial},
        {"oproj/outputs/a", &Impl::a},                 {"oproj/outputs/h_mid", &Impl::h_mid},
        {"router/outputs/xn", &Impl::xn},              {"router/outputs/xn8", &Impl::xn8},
        {"router/outputs/xsc", &Impl::xsc},            {"router/outputs/rstd", &Impl::rstd},
        {"router/outputs/logit", &Impl::logit},        {"router/outputs/sig", &Impl::sig},
        {"router/outputs/key", &Impl::key},            {"moe/outputs/route_ids", &Impl::ids},
        {"moe/outputs/route_weights", &Impl::weights}, {"moe/outputs/gate", &Impl::gate},
        {"moe/outputs/up", &Impl::up},                 {"moe/outputs/mid", &Impl::mid},
        {"moe/outputs/mid8", &Impl::mid8},             {"moe/outputs/midsc", &Impl::midsc},
        {"moe/outputs/partial", &Impl::ffn_partial},   {"moe/outputs/ar_out", &Impl::ar_out},
    };
    const auto it = buffers.find(std::string(s.group) + "/" + s.name);
    if (it == buffers.end()) throw std::logic_error(std::string("runner: no device buffer for ") + s.group + "/" + s.name);
    return it->second;
  }

  // Every stage output up to last_stage, rank r's slice of its buffer into its result field.
  StepResult result(int last_stage = 5) const {
    golden::DimSizes dims;
    dims.cfg = cfg;
    dims.tokens = S;
    StepResult res;
    res.ranks.resize(W);
    for (const golden::TensorSpec& s : golden::tensor_specs()) {
      if (!s.field || golden::stage_of(s) > last_stage) continue;
      const size_t n = dims.count(s.dims);
      for (int r = 0; r < W; ++r)
        golden::with_field(s, res.ranks[r], [&](auto& v) {
          std::visit(
              [&](auto buffer) {
                const auto& d = this->*buffer;
                if constexpr (std::is_same_v<std::decay_t<decltype(v)>, decltype(download(d, 0))>)
                  v = download(d, size_t(r) * n, n);
                else
                  throw std::logic_error(std::string("runner: the device buffer of ") + s.group + "/" + s.name +
                                         " is not of its result field's type");
              },
              output_buffer(s));
        });
    }
    return res;
  }

  // The HBM bytes each stage must move at least, all W ranks together (every rank's own
  // weights: on one GPU the shards add up).
  double stage_bytes(const std::string& st) {
    const double OK = cfg.o_k(), H = cfg.hidden, NS = cfg.n_split, HD = cfg.heads, E = cfg.n_routed;
    const double SL = cfg.moe_slots(), I = cfg.inter, TW = cfg.sparse_table_words(), Wd = W, Sd = S;
    if (n_ctx_host.empty()) {
      const std::vector<int32_t> nc = download(n_ctx, size_t(W) * S);
      n_ctx_host.assign(nc.begin(), nc.end());
    }
    if (st == "index") {
      const std::vector<int32_t> sl = download(seq_lens, size_t(S));
      double blk = 0;
      for (int32_t L : sl) blk += double((std::max(L, 1) + cfg.sparse_block - 1) / cfg.sparse_block);
      return Wd * (blk * 4 + Sd * 16 * 4 + Sd * (TW + 16 + 2) * 4);
    }
    if (st == "split") {
      double keys = 0;
      for (int v : n_ctx_host) keys += v;
      return keys * (2.0 * cfg.head_dim + 8) + Wd * Sd * (OK * 3 + NS * OK * 2 + NS * HD * 8 + TW * 4);
    }
    if (st == "merge") return Wd * Sd * (NS * OK * 2 + NS * HD * 8 + OK * 3 + 4);
    if (st == "o_proj") return Wd * (H * OK + H * 4 + Sd * OK + Sd * H * 2 * (1 + (ag ? 1 : Wd)));
    if (st == "attn_allreduce") return Wd * Sd * H * 2 * ((ag ? 1 : Wd) + 2) + Sd * H * 2;
    if (st == "router") return Wd * (E * H * 2 + H * 2 + Sd * H * (2 + 2 + 2 + 1 + 1.0 / 32) + Sd * E * 12) + Sd * H * 2;
    if (st == "route_top4") return Wd * Sd * (E * 8 + SL * 8);
    const double experts = step_experts;  // this step's, not every expert uploaded so far
    if (st == "up_gate") return experts * (2 * I * H / 2 + 2 * I * H / 32) + Wd * Sd * (H + H / 32 + SL * I * 11.0 / 1);
    if (st == "down") return experts * (H * I / 2 + H * I / 32) + Wd * Sd * (SL * I * (1 + 1.0 / 32) + H * 2 * (1 + (ag ? 1 : Wd)));
    if (st == "ffn_allreduce") return Wd * Sd * H * 2 * ((ag ? 1 : Wd) + 1);
    return 0;
  }
};

#if !defined(K4_HOST_EMULATION)
namespace {

// Writing twice the L2's size evicts every line the step before could have left.
class L2Flush {
 public:
  L2Flush() {
    int dev = 0, l2 = 0;
    K4_HIP_CHECK(hipGetDevice(&dev));
    hipDeviceProp_t p;
    K4_HIP_CHECK(hipGetDeviceProperties(&p, dev));
    l2 = p.l2CacheSize;
    buf_.resize(size_t(std::max(l2, 1 << 20)) * 2);
  }
  void operator()(hipStream_t st = 0) { K4_HIP_CHECK(hipMemsetAsync(buf_.get(), 0x5a, buf_.size(), st)); }

 private:
  DeviceBuffer<uint8_t> buf_;
};

// Every 16-byte vector of p read once (4 in flight a thread, grid-stride); the xor is stored
// only on a value no input makes, so no load is dead.
__global__ void __launch_bounds__(512) stream_read_kernel(const uint4* __restrict__ p, size_t n16, int* sink) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
    for (int u = 0; u < 4; ++u) v[u] = p[i + u * stride];
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) acc ^= p[i].x ^ p[i].y ^ p[i].z ^ p[i].w;
  if (acc == 0x7eadbeefu) sink[0] = int(acc);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace
#endif

// K4_MUTANT in the environment picks a K4_MUTANTS build's first active mutant (read when the
// first Runner is made, after every unit has registered its setter).
Runner::Runner(const LayerWeights& w) : impl_(std::make_unique<Impl>(w)) {
  static const bool env_read = [] {
    const char* e = std::getenv("K4_MUTANT");
    if (e != nullptr && mutants_switchable()) set_mutant(std::atoi(e));
    return true;
  }();
  (void)env_read;
}
Runner::~Runner() = default;

StepResult Runner::run_step(const StepInputs& in, const RunOptions& opt) {
  impl_->set_inputs(in, opt);
  impl_->run_all(opt.last_stage);
  if (impl_->fast && opt.last_stage == 5 && impl_->experts_missing())
    throw std::runtime_error("run_step: the fast path found an expert of the routing not on the device");
  return impl_->result(opt.last_stage);
}

std::vector<StageTime> Runner::time_stages(const StepInputs& in, int warmup, int repeats, const RunOptions& opt) {
  Impl& s = *impl_;
  s.set_inputs(in, opt);
  s.run_all();
  struct Stage {
    const char* name;
    void (Impl::*fn)();
  };
  const Stage stages[] = {{"index", &Impl::stage_index},       {"split", &Impl::stage_split},
                          {"merge", &Impl::stage_merge},       {"o_proj", &Impl::stage_oproj},
                          {"attn_allreduce", &Impl::stage_attn_ar}, {"router", &Impl::stage_router},
                          {"route_top4", &Impl::stage_route},
                          {"up_gate", s.fast ? &Impl::stage_up_gate_fast : &Impl::stage_up_gate},
                          {"down", s.fast ? &Impl::stage_down_fast : &Impl::stage_down},
                          {"ffn_allreduce", &Impl::stage_ffn_ar}};
  std::vector<StageTime> out;
#if defined(K4_HOST_EMULATION)
  (void)warmup, (void)repeats;
  for (const Stage& st : stages) out.push_back(StageTime{st.name, 0, 0, s.stage_bytes(st.name)});
#else
  L2Flush flush;
  hipEvent_t t0, t1;
  K4_HIP_CHECK(hipEventCreate(&t0));
  K4_HIP_CHECK(hipEventCreate(&t1));
  for (const Stage& st : stages) {
    for (int i = 0; i < warmup; ++i) (s.*st.fn)();
    std::vector<double> us;
    for (int i = 0; i < repeats; ++i) {
      flush();  // no weight left hot in L2 by the repeat before
      K4_HIP_CHECK(hipEventRecord(t0, 0));
      (s.*st.fn)();
      K4_HIP_CHECK(hipEventRecord(t1, 0));
      K4_HIP_CHECK(hipEventSynchronize(t1));
      float ms = 0;
      K4_HIP_CHECK(hipEventElapsedTime(&ms, t0, t1));
      us.push_back(double(ms) * 1000.0);
    }
    std::sort(us.begin(), us.end());
    out.push_back(StageTime{st.name, us[us.size() / 2], us.front(), s.stage_bytes(st.name)});
  }
  K4_HIP_CHECK(hipEventDestroy(t0));
  K4_HIP_CHECK(hipEventDestroy(t1));
#endif
  return out;
}


double Runner::read_floor_s(size_t bytes, int repeats) {
#if defined(K4_HOST_EMULATION)
  (void)bytes, (void)repeats;
  return 0;
#else
  bytes = std::max<size_t>(bytes & ~size_t(15), 16);
  DeviceBuffer<uint8_t> x(bytes);
  DeviceBuffer<int> sink(1);
  K4_HIP_CHECK(hipMemset(x.get(), 1, bytes));
  int dev = 0;
  K4_HIP_CHECK(hipGetDevice(&dev));
  hipDeviceProp_t p;
  K4_HIP_CHECK(hipGetDeviceProperties(&p, dev));
  L2Flush flush;
  hipEvent_t t0, t1;
  K4_HIP_CHECK(hipEventCreate(&t0));
  K4_HIP_CHECK(hipEventCreate(&t1));
  std::vector<double> s;
  for (int i = 0; i <= repeats; ++i) {
    flush();
    K4_HIP_CHECK(hipEventRecord(t0, 0));
    hipLaunchKernelGGL(stream_read_kernel, dim3(2 * p.multiProcessorCount), dim3(512), 0, 0,
                       reinterpret_cast<const uint4*>(x.get()), bytes / 16, sink.get());
    K4_HIP_CHECK(hipGetLastError());
    K4_HIP_CHECK(hipEventRecord(t1, 0));
    K4_HIP_CHECK(hipEventSynchronize(t1));
    float ms = 0;
    K4_HIP_CHECK(hipEventElapsedTime(&ms, t0, t1));
    if (i > 0) s.push_back(double(ms) / 1000.0);  // the first is the warm-up
  }
  K4_HIP_CHECK(hipEventDestroy(t0));
  K4_HIP_CHECK(hipEventDestroy(t1));
  return median_of(s);
#endif
}

StepTime Runner::time_step(const StepInputs& in, int warmup, int repeats, const RunOptions& opt) {
  Impl& s = *impl_;
  s.set_inputs(in, opt);
  s.run_all();  // uploads the step's experts: the timed fast steps need no host round trip
  StepTime out;
  out.repeats = repeats;
  out.experts = s.step_experts;
  out.fast = s.fast;
  for (const char* st : {"index", "split", "merge", "o_proj", "attn_allreduce", "router", "route_top4", "up_gate", "down",
                         "ffn_allreduce"})
    out.bytes += s.stage_bytes(st);
#if defined(K4_HOST_EMULATION)
  (void)warmup;
#else
  L2Flush flush;
  hipEvent_t t0, t1;
  K4_HIP_CHECK(hipEventCreate(&t0));
  K4_HIP_CHECK(hipEventCreate(&t1));
  // the reference path reads the routing back (fetch); the fast path's step is device work only
  const bool fetch = !s.fast;
  for (int i = 0; i < warmup; ++i) s.run_all(5, fetch);
  auto timed = [&](auto&& step) {
    std::vector<double> us;
    for (int i = 0; i < repeats; ++i) {
      flush(s.st);
      K4_HIP_CHECK(hipEventRecord(t0, s.st));
      step();
      K4_HIP_CHECK(hipEventRecord(t1, s.st));
      K4_HIP_CHECK(hipEventSynchronize(t1));
      float ms = 0;
      K4_HIP_CHECK(hipEventElapsedTime(&ms, t0, t1));
      us.push_back(double(ms) * 1000.0);
    }
    std::sort(us.begin(), us.end());
    return us;
  };
  const std::vector<double> us = timed([&] { s.run_all(5, fetch); });
  out.median_us = us[us.size() / 2], out.min_us = us.front();
  if (s.fast) {
    // the same step captured once as a graph and replayed (on its own stream)
    hipStream_t cap;
    K4_HIP_CHECK(hipStreamCreateWithFlags(&cap, hipStreamNonBlocking));
    s.st = cap;
    hipGraph_t graph;
    hipGraphExec_t exec;
    K4_HIP_CHECK(hipStreamBeginCapture(cap, hipStreamCaptureModeGlobal));
    s.run_all(5, false);
    K4_HIP_CHECK(hipStreamEndCapture(cap, &graph));
    K4_HIP_CHECK(k4_graph_instantiate(&exec, graph));
    size_t nodes = 0;
    K4_HIP_CHECK(hipGraphGetNodes(graph, nullptr, &nodes));
    out.graph_nodes = int(nodes);
    K4_HIP_CHECK(hipGraphLaunch(exec, cap));
    K4_HIP_CHECK(hipStreamSynchronize(cap));
    const std::vector<double> g = timed([&] { K4_HIP_CHECK(hipGraphLaunch(exec, cap)); });
    out.graph_median_us = g[g.size() / 2], out.graph_min_us = g.front();
    K4_HIP_CHECK(hipGraphExecDestroy(exec));
    K4_HIP_CHECK(hipGraphDestroy(graph));
    s.st = 0;
    K4_HIP_CHECK(hipStreamDestroy(cap));
    if (s.experts_missing()) throw std::runtime_error("time_step: an expert of the routing was not on the device");
  }
  K4_HIP_CHECK(hipEventDestroy(t0));
  K4_HIP_CHECK(hipEventDestroy(t1));
  out.floor_us = read_floor_s(size_t(out.bytes), std::max(repeats, 5)) * 1e6;
  out.read_bw = out.bytes / (out.floor_us * 1e-6);
#endif
  return out;
}

double Runner::copy_bandwidth(size_t bytes, int repeats) {
#if defined(K4_HOST_EMULATION)
  (void)bytes, (void)repeats;
  return 1.0;
#else
  DeviceBuffer<uint8_t> x(bytes), y(bytes);
  K4_HIP_CHECK(hipMemset(x.get(), 1, bytes));
  hipEvent_t t0, t1;
  K4_HIP_CHECK(hipEventCreate(&t0));
  K4_HIP_CHECK(hipEventCreate(&t1));
  K4_HIP_CHECK(hipMemcpy(y.get(), x.get(), bytes, hipMemcpyDeviceToDevice));  // warm-up
  std::vector<double> s;
  for (int i = 0; i < repeats; ++i) {
    K4_HIP_CHECK(hipEventRecord(t0, 0));
    K4_HIP_CHECK(hipMemcpyAsync(y.get(), x.get(), bytes, hipMemcpyDeviceToDevice, 0));
    K4_HIP_CHECK(hipEventRecord(t1, 0));
    K4_HIP_CHECK(hipEventSynchronize(t1));
    float ms = 0;
    K4_HIP_CHECK(hipEventElapsedTime(&ms, t0, t1));
    s.push_back(double(ms) / 1000.0);
  }
  K4_HIP_CHECK(hipEventDestroy(t0));
  K4_HIP_CHECK(hipEventDestroy(t1));
  std::sort(s.begin(), s.end());
  return 2.0 * double(bytes) / s[s.size() / 2];
#endif
}

StepResult run_step(const LayerWeights& w, const StepInputs& in, const RunOptions& opt) {
  Runner r(w);
  return r.run_step(in, opt);
}

// ----------------------------------------------------------------------- the stage twins
namespace {

Config one_rank(const Config& cfg) {
  Config c = cfg;
  c.tp = 1;
  return c;
}

}  // namespace

void select_blocks(IndexOut& out, const StepShared& in, const std::vector<float>& scores, const Config& cfg) {
  const DevCfg dc = dev_cfg(cfg);
  const int S = in.tokens;
  if (scores.size() != size_t(S) * in.score_width)
    throw std::invalid_argument("index: the rank's index_scores have " + std::to_string(scores.size()) +
                                " elements, expected " + std::to_string(size_t(S) * in.score_width) + " (S, score_width)");
  auto sl = to_device(in.seq_lens);
  auto bt = to_device(in.block_table);
  auto sc = to_device(scores);
  DeviceBuffer<int32_t> table(size_t(S) * dc.table_words), blocks(size_t(S) * dc.topk_blocks), n_ctx(S);
  DeviceBuffer<int32_t> cand(size_t(S) * dc.n_split * 32);
  DeviceBuffer<uint8_t> long_row(S);
  launch_select_blocks(IndexArgs{table.get(), blocks.get(), n_ctx.get(), long_row.get(), cand.get(), sl.get(), bt.get(),
                                 sc.get(), S, in.q_len, in.bt_width, in.score_width, 1, dc},
                       0);
  sync();
  out.sparse_table = download(table, size_t(S) * dc.table_words);
  out.blocks = download(blocks, size_t(S) * dc.topk_blocks);
  out.n_ctx = download(n_ctx, S);
  out.long_row = download(long_row, S);
}

void split_attention(SplitOut& out, const StepShared& sh, const StepRank& rank, const IndexOut& idx, const Config& cfg) {
  const DevCfg dc = dev_cfg(cfg);
  const int S = sh.tokens;
  const size_t OK = dc.o_k, NS = dc.n_split, H = dc.heads;
  auto table = to_device(idx.sparse_table);
  auto q = to_device(rank.q);
  auto kc = to_device(rank.k_cache);
  auto vc = to_device(rank.v_cache);
  auto ks = to_device(rank.k_scale);
  auto vs = to_device(rank.v_scale);
  DeviceBuffer<uint8_t> q8(S * OK);
  DeviceBuffer<uint16_t> o(S * NS * OK);
  DeviceBuffer<float> m(S * NS * H), l(S * NS * H);
  launch_split_attention(SplitArgs{q8.get(), o.get(), m.get(), l.get(), table.get(), q.get(), kc.get(), vc.get(), ks.get(),
                                   vs.get(), rank.k_cache.size(), rank.k_scale.size(), S, 1, dc},
                         0);
  sync();
  out.q8 = download(q8, S * OK);
  out.o = download(o, S * NS * OK);
  out.m = download(m, S * NS * H);
  out.l = download(l, S * NS * H);
}

void merge_partitions(MergeOut& out, const SplitOut& sp, int tokens, const Config& cfg) {
  const DevCfg dc = dev_cfg(cfg);
  const size_t OK = dc.o_k;
  auto o = to_device(sp.o);
  auto m = to_device(sp.m);
  auto l = to_device(sp.l);
  DeviceBuffer<uint16_t> attn(tokens * OK);
  DeviceBuffer<uint8_t> attn8(tokens * OK);
  DeviceBuffer<float> xs(tokens);
  launch_merge_partitions(MergeArgs{attn.get(), attn8.get(), xs.get(), o.get(), m.get(), l.get(), tokens, 1, dc}, 0);
  sync();
  out.attn = download(attn, tokens * OK);
  out.attn8 = download(attn8, tokens * OK);
  out.x_scale = download(xs, tokens);
}

void o_proj_partials(OprojOut& out, const MergeOut& mg, const RankWeights& w, int tokens, const Config& cfg) {
  const DevCfg dc = dev_cfg(one_rank(cfg));
  auto attn8 = to_device(mg.attn8);
  auto xs = to_device(mg.x_scale);
  auto wo = to_device(w.w_o);
  auto so = to_device(w.s_o);
  DeviceBuffer<uint16_t> partial(size_t(tokens) * dc.hidden);
  launch_o_proj_partials(
      OprojArgs{partial.get(), nullptr, attn8.get(), xs.get(), wo.get(), so.get(), tokens, 1, 0, dc}, 0);
  sync();
  out.partial = download(partial, size_t(tokens) * dc.hidden);
}

void all_reduce_rows(std::vector<std::vector<uint16_t>>& out, const std::vector<const std::vector<uint16_t>*>& partials,
                     int tokens, int hidden, bool zero_start, bool reduce_scatter, int rows_per_task) {
  const int W = int(partials.size());
  const size_t slice = size_t(tokens) * hidden;
  // the exchange buffers as the pushes leave them: plain, every rank got every partial;
  // reduce-scatter, each row task's owner got them (the rest is never read)
  std::vector<uint16_t> recv(size_t(W) * W * slice, 0);
  for (int dst = 0; dst < W; ++dst)
    for (int src = 0; src < W; ++src)
      std::copy(partials[src]->begin(), partials[src]->end(), recv.begin() + (size_t(dst) * W + src) * slice);
  auto d_recv = to_device(recv);
  DeviceBuffer<uint16_t> d_out(W * slice);
  launch_all_reduce_rows(AllReduceArgs{d_out.get(), nullptr, d_recv.get(), nullptr, tokens, hidden, W, rows_per_task,
                                       zero_start ? 1 : 0, reduce_scatter ? 1 : 0},
                         0);
  sync();
  out.assign(W, {});
  for (int r = 0; r < W; ++r) out[r] = download(d_out, r * slice, slice);
}

void residual_add(std::vector<uint16_t>& h_mid, const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in) {
  // the attention all-reduce's epilogue, run over one rank's sum: recv[0][0] = a
  const size_t n = a.size();
  auto d_recv = to_device(a);
  auto d_h = to_device(h_in);
  DeviceBuffer<uint16_t> d_out(n), d_mid(n);
  launch_all_reduce_rows(AllReduceArgs{d_out.get(), d_mid.get(), d_recv.get(), d_h.get(), 1, int(n), 1, 1, 0, 0}, 0);
  sync();
  h_mid = download(d_mid, n);
}

void route_scores(RouterOut& out, const std::vector<uint16_t>& a, const std::vector<uint16_t>& h_in,
                  const RankWeights& w, int tokens, const Config& cfg) {
  const DevCfg dc = dev_cfg(cfg);
  const size_t H = dc.hidden, E = dc.n_routed, S = tokens;
  auto da = to_device(a);
  auto dh = to_device(h_in);
  auto g = to_device(w.g_post);
  auto wg = to_device(w.w_gate);
  if (cfg.variant.router_gate == RouterGate::f32 && w.w_gate_f32.size() != E * H)
    throw std::invalid_argument("router: router.gate = f32 needs the F32 gate w_gate_f32 (" + std::to_string(E * H) +
                                " elements), the weights have " + std::to_string(w.w_gate_f32.size()));
  auto wg32 = to_device(cfg.variant.router_gate == RouterGate::f32 ? w.w_gate_f32 : std::vector<float>{});
  auto bi = to_device(w.bias);
  DeviceBuffer<uint16_t> xn(S * H);
  DeviceBuffer<uint8_t> xn8(S * H), xsc(S * H / 32);
  DeviceBuffer<float> rstd(S), logit(S * E), sig(S * E);
  DeviceBuffer<int32_t> key(S * E);
  launch_route_scores(RouterArgs{xn.get(), xn8.get(), xsc.get(), rstd.get(), logit.get(), sig.get(), key.get(), da.get(),
                                 dh.get(), g.get(), wg.get(), wg32.get(), bi.get(), tokens, 1, dc},
                      0);
  sync();
  out.xn = download(xn, S * H), out.xn8 = download(xn8, S * H), out.xsc = download(xsc, S * H / 32);
  out.rstd = download(rstd, S), out.logit = download(logit, S * E), out.sig = download(sig, S * E);
  out.key = download(key, S * E);
}

void route_top4(RouteOut& out, const RouterOut& r, int tokens, const Config& cfg) {
  const DevCfg dc = dev_cfg(cfg);
  const size_t SL = dc.moe_slots;
  auto sig = to_device(r.sig);
  auto key = to_device(r.key);
  DeviceBuffer<int32_t> ids(tokens * SL);
  DeviceBuffer<float> wts(tokens * SL);
  launch_route_top4(RouteArgs{ids.get(), wts.get(), sig.get(), key.get(), tokens, 1, dc}, 0);
  sync();
  out.ids = download(ids, tokens * SL);
  out.weights = download(wts, tokens * SL);
}

void experts_up_gate(MoeOut& out, const RouteOut& route, const RouterOut& r, const ExpertSource& src, int rank,
                     int tokens, const Config& cfg) {
  const DevCfg dc = dev_cfg(cfg);
  const size_t n = size_t(tokens) * dc.moe_slots * dc.inter;
  Experts ex;
  ex.reset(1, dc.n_experts);
  ex.ensure(src, cfg, {rank}, route.ids, tokens);
  auto ids = to_device(route.ids);
  auto xn8 = to_device(r.xn8);
  auto xsc = to_device(r.xsc);
  auto live = to_device(route.live);  // empty: every row joins
  DeviceBuffer<uint16_t> mid(n);
  DeviceBuffer<float> gate(n), up(n);
  DeviceBuffer<uint8_t> mid8(n), midsc(n / 32);
  DeviceBuffer<int32_t> ulist(dc.n_experts + 1);
  launch_experts_up_gate(UpGateArgs{mid.get(), gate.get(), up.get(), mid8.get(), midsc.get(), ulist.get(), ids.get(),
                                    xn8.get(), xsc.get(), route.live.empty() ? nullptr : live.get(), ex.table(), tokens, 1, dc},
                         0);
  sync();
  out.mid = download(mid, n), out.gate = download(gate, n), out.up = download(up, n);
  out.mid8 = download(mid8, n), out.midsc = download(midsc, n / 32);
}

void experts_down(MoeOut& out, const RouteOut& route, const ExpertSource& src, int rank, int tokens, const Config& cfg) {
  const DevCfg dc = dev_cfg(one_rank(cfg));
  Experts ex;
  ex.reset(1, dc.n_experts);
  ex.ensure(src, cfg, {rank}, route.ids, tokens);
  auto ids = to_device(route.ids);
  auto wts = to_device(route.weights);
  auto mid8 = to_device(out.mid8);
  auto midsc = to_device(out.midsc);
  auto live = to_device(route.live);
  DeviceBuffer<uint16_t> partial(size_t(tokens) * dc.hidden);
  launch_experts_down(DownArgs{partial.get(), nullptr, ids.get(), wts.get(), mid8.get(), midsc.get(),
                               route.live.empty() ? nullptr : live.get(), ex.table(), tokens, 1, 0, dc},
                      0);
  sync();
  out.partial = download(partial, size_t(tokens) * dc.hidden);
}

std::string device_name() {
#if defined(K4_HOST_EMULATION)
  return "host emulation";
#else
  int dev = 0;
  K4_HIP_CHECK(hipGetDevice(&dev));
  hipDeviceProp_t p;
  K4_HIP_CHECK(hipGetDeviceProperties(&p, dev));
  return std::string(p.name) + " (cc " + std::to_string(p.major) + "." + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, " + K4_PLATFORM_NAME + ")";
#endif
}

int planted_stage() { return kPlantStage; }

// ------------------------------------------------------------------------------ mutants
namespace {
std::vector<MutantSetter>& mutant_setters() {
  static std::vector<MutantSetter> v;
  return v;
}
}  // namespace

void register_mutant_setter(MutantSetter f) { mutant_setters().push_back(f); }

bool mutants_switchable() {
#if defined(K4_MUTANTS)
  return true;
#else
  return false;
#endif
}

int compiled_mutant() {
#if defined(K4_MUTANT)
  return K4_MUTANT;
#else
  return 0;
#endif
}

void set_mutant(int id) {
  if (!mutants_switchable()) {
    if (id != compiled_mutant()) throw std::logic_error("set_mutant: this build's kernels are not a K4_MUTANTS build");
    return;
  }
  g_mutant_host = id;
  for (MutantSetter f : mutant_setters()) f(id);
}

}  // namespace k4::gpu
