// test_diff_world.hpp -- the world the diff / replay / report tests share: one tiny-preset
// golden (S = 4, context 1000: 8 blocks in 4 partitions) whose layer has two tied router
// experts and FFN partial rows that cancel across ranks (rank 1's = -rank 0's, 2^20 above
// ranks 2 and 3's: the rank order of their sum changes bits), written once to a temp directory, and the planted faults, each a StepResult
// with one kernel bug and its downstream effect (the stages after it recomputed by the
// reference from the faulty tensor, as the kernel would compute them).
// K4_DIFF_KEEP=DIR keeps the golden and the dumps the tests write in DIR (for a look with
// k4 diff / k4 replay by hand).
#pragma once
#include <string>
#include <vector>

#include "golden/diff/compare.hpp"
#include "reference/model.hpp"

namespace k4::test {

struct DiffWorld {
  Config cfg;
  LayerWeights w;
  StepInputs in;
  StepResult gold;
  std::string dir;          // removed at exit, unless it is $K4_DIFF_KEEP
  bool keep = false;
  std::string golden_path;  // the golden
  // The tie: token tie_token's picks in slots tie_slot_a < tie_slot_b are experts with
  // equal gate rows and biases (equal scores: the lower id wins the tie).
  int tie_token = 0, tie_slot_a = 0, tie_slot_b = 1;
  std::string path(const std::string& name) const { return dir + "/" + name; }
};
const DiffWorld& diff_world();

// Where the reference recomputes from, after a planted fault (all ranks).
enum class From { Split, Merge, Oproj, AllReduceA, Router, Route, UpGate, Down, ArOut, Nothing };
void rerun(StepResult& res, const DiffWorld& W, From from);

// A planted fault: the faulty result (downstream recomputed) and where the tool must point.
struct Fault {
  std::string name;
  StepResult res;
  int rank;                       // the rank and stage whose own error it is
  std::string stage, tensor;
  std::vector<uint64_t> index;    // the first mismatching element of that tensor
};
Fault fault_split_bit_flip(const DiffWorld& W);     // rank 1: a flipped bit in split o
Fault fault_xsc_round_down(const DiffWorld& W);     // rank 2: one MXFP8 scale of xn rounded down (byte - 1)
Fault fault_tied_experts(const DiffWorld& W);       // rank 0: the two tied experts swapped in a route
Fault fault_block_order(const DiffWorld& W);        // rank 3: two blocks swapped in the sparse table
Fault fault_ffn_rank_order(const DiffWorld& W);     // every rank: ar_out summed with the ranks reversed

}  // namespace k4::test
