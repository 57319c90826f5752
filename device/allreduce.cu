// allreduce.cu -- the rank-ordered sums of bf16 partial rows; the twin of
// reference/stages/oproj.cpp all_reduce_rows / residual_add (stage_o's sums from
// AG_RS (seed:L1087-L1162), and ffn_finish (seed:L1712-L1778)).
//
// Contract (reference/stages/oproj.hpp): out[dst] = bf16(0 + p_rank0 + p_rank1 + ...) in f32,
// ranks in order (zero_start = false: p_rank0 + p_rank1 + ..., the seed's W == 1 FFN path);
// h_mid = bf16(f32(out) + f32(h_in)).
// The partials are read from the exchange buffers the producing kernels pushed them into
// (oproj.cu, moe.cu: push_partial), as the seed's peers exchange them:
//  - plain: every rank got every rank's partials; rank dst sums recv[dst][0..W) itself.
//  - reduce-scatter + all-gather (ag_rs): each row task's owner (task % W) got them; the
//    owner sums recv[owner][0..W) and writes the bf16 sum into every rank's output.
// Same bits either way (one sum, one order); tests/gpu shows it by forcing each form.
// A thread an element of one destination (plain) or owner (ag_rs) rank: grid y.
#include "device/mutants.hpp"
#include "device/stages.hpp"
#include "reference/numerics/bf16.hpp"

namespace k4::gpu {
namespace {

constexpr int kThreads = 256;

struct AllReduceBody {
  AllReduceArgs a;
  template <class Ctx>
  K4_BODY void operator()(Ctx& c, unsigned char*) const {
    const int rank = c.by, W = a.ranks;
    const size_t slice = size_t(a.tokens) * a.hidden;
    c.each(kThreads, [&](int t) {
      const size_t i = size_t(c.bx) * kThreads + t;
      if (i >= slice) return;
      const int row = int(i % size_t(a.hidden));
      const int owner = (row / a.rows_per_task + (K4_MUTANT_ON(38) ? 1 : 0)) % W;
      if (a.ag_rs && owner != rank) return;  // another rank's task
      const uint16_t* parts = a.recv + size_t(rank) * W * slice + i;  // recv[rank][src][i]
      float s = bf16_to_f32(parts[0]);
      if (a.zero_start && !K4_MUTANT_ON(36)) s = 0.0f + s;  // the seed's t0 = 0.0; t0 = t0 + f0 (turns -0 into +0)
      for (int src = 1; src < W; ++src) s = s + bf16_to_f32(parts[size_t(K4_MUTANT_ON(35) ? W - src : src) * slice]);
      const uint16_t sum = bf16_bits_rne(s);
      for (int dst = 0; dst < W; ++dst) {
        if (!a.ag_rs && dst != rank) continue;  // plain: each rank sums its own receive buffer
        a.out[size_t(dst) * slice + i] = sum;
        if (a.h_mid != nullptr)
          a.h_mid[size_t(dst) * slice + i] = bf16_bits_rne((K4_MUTANT_ON(37) ? s : bf16_to_f32(sum)) + bf16_to_f32(a.h_in[i]));
      }
    });
  }
};

}  // namespace

void launch_all_reduce_rows(const AllReduceArgs& a, hipStream_t s) {
  if (a.hidden % a.rows_per_task != 0) throw std::invalid_argument("all-reduce: hidden must be whole row tasks");
  const size_t slice = size_t(a.tokens) * a.hidden;
  launch(AllReduceBody{a}, Grid{int((slice + kThreads - 1) / kThreads), a.ranks, 1}, kThreads, 0, s);
}

}  // namespace k4::gpu
