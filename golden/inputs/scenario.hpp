// scenario.hpp -- one decode step's inputs (StepInputs) from a seed and a small scenario.
//
// JSON form (every key optional; unknown keys are an error; each key one row of
// scenario_keys() below, with its k4 golden short form):
//   {"tokens": 4, "q_len": 1,
//    "context": [1000, "short", "long"],   one entry for every request, one a request, or one a row;
//                                          ints are keys; "short" (1 .. TOPK_BLOCKS blocks, the id-
//                                          order path), "medium" (.. THREADS blocks, ranked),
//                                          "long" (past THREADS blocks: split candidates), "max"
//    "pad_rows": [3],                      seq_len 0, all-zero block-table row
//    "static_kv_scale": false, "kv_page_stride": 16,   override the config's
//    "cache_blocks": 256,                  block allocations in the cache at most
//    "rank_scores": "own",                 index scores: "own" (each rank's index head, drawn
//                                          independently), "shared" (rank 0's everywhere: one
//                                          head), "distinct" (own, and rank r's blocks
//                                          b = r mod tp lifted by 32: every rank selects a
//                                          different set where the row is scored)
//    "inject": {"score_ties": true, "nan_scores": 2, "neg_zero_scores": 2, "inf_scores": 2,
//               "repeated_expert": 5 | true, "extreme_q": true, "huge_residual": true,
//               "extreme_kv": true, "zero_rows": [1],
//               "special_q": true, "special_h_in": true, "special_kv": true,
//               "special_weights": true, "nan_weight": "w_o", "zero_attn_rows": [2]}}
// The special-value injections (docs/reliability.md, "Values the model defines"): each puts
// NaN, Inf or -0 where the contract says what comes of it, and keeps the rest of the step
// finite, so that a golden shows both the poisoned and the clean values.
// Contexts: a request's q_len rows are consecutive positions, its last row has the
// request's context L, row j of it L - (q_len - 1 - j) keys.
// Block tables: the cache holds min(total blocks, cache_blocks) block allocations in a
// seeded random order; request i's block b is allocation perm[(offset_i + b) % n_alloc], so
// ids are distinct unless the step needs more blocks than the cache holds, when blocks share
// pages (only the block table must be valid, the content does not matter to the contract).
// Allocation a's pages are a * kv_page_stride + j (j < 8); n_pages = (n_alloc - 1) * stride
// + 8; pages no block uses are zero. Memory stays small for any context: a long row costs its
// block-table and score rows (4 bytes a block), not its keys.
#pragma once
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "reference/config.hpp"
#include "reference/inputs.hpp"
#include "reference/weights.hpp"

namespace k4 {

struct Injections {
  bool score_ties = false;     // scores rounded to halves, the row's best value repeated
  int nan_scores = 0;          // blocks a row given NaN (alternately +NaN and -NaN)
  int neg_zero_scores = 0;     // blocks a row given -0 (and as many +0)
  int inf_scores = 0;          // blocks a row given +Inf / -Inf alternately
  int repeated_expert = -1;    // >= 0: h_in aligned with that expert's gate row (every token picks
                               // it); -2: every token's h_in the same (the same picks); -1: off
  bool extreme_q = false;      // q at +-448, 464 (the tie), 466 (past it), 1e4, +-Inf, NaN, 2^-10, -0
  bool huge_residual = false;  // h_in rows scaled by 256, 1e20, 1e37
  bool extreme_kv = false;     // K / V codes +-448 and subnormals, scales 0 and large
  std::vector<int> zero_rows;  // q, h_in and index-score rows all zero
  // q: token 0 gets NaN (head 0), +Inf (head 1) and 466 (head 2, NaN under NoSaturate): the
  // token is NaN from the merge on (its attn8, o_proj, ...), its route ids are 0..3; every
  // token gets -0, +-448, 464 (-> 448), +-2^-10 (-> +-0), 2^-9 in the other heads (finite).
  bool special_q = false;
  // h_in row k, by k % 4: one NaN (0), one +Inf (1), one -Inf (2) element, or 64 -0 (3).
  bool special_h_in = false;
  // K / V NaN codes (0x7F / 0xFF) and NaN / +Inf k / v scales at every key no row reads
  // (past every row's context: masked by the contract, never in an output); -0 scales and
  // -0 codes at keys rows read.
  bool special_kv = false;
  // Weights, contained: -0 in w_o, s_o (row 3), g_post, w_gate; w_gate +Inf (expert 1) and
  // -Inf (expert 2) elements; bias NaN (expert 3: every token's first pick), -Inf (4: never
  // picked), +Inf (5: second pick), -0 (6); expert 3: s2 NaN at hidden row 7 (that row of
  // every token's FFN partial is NaN), an s13 byte 0, -0 E2M1 nibbles.
  bool special_weights = false;
  // One NaN in "w_o" (rank 0), "s_o", "g_post" or "w_gate" (expert 2): what it poisons is
  // the contract's (docs/reliability.md). "s2": every routed expert e a NaN s2 scale byte
  // (0xFF) at hidden row nan_s2_row(e) = (16 e + 7) % hidden, block 0: in a wide step (R5.13,
  // R5.14) that row is NaN for every token, also for those not routed to e (their zero mid
  // row times the NaN scale); in a narrow step only for e's own tokens.
  std::string nan_weight;
  // v_scale 0 at every key these rows read: their attention, attn8 and o_proj rows are +0.
  std::vector<int> zero_attn_rows;
  // A NaN K code (0x7F, dim 0) at the last key each of these rows reads and a NaN V code
  // (0xFF, dim 1) at the one before (the row's newest keys, in its local block: always
  // selected), so its heads and then its token are NaN from the split on. Rows that do not
  // read those keys (other requests, earlier rows of the same request) do not change.
  std::vector<int> nan_kv_rows;
};

// The most block allocations a scenario's cache may hold (16 pages of 2 KiB each for K and
// for V: a rank's caches stay within 1 GiB).
constexpr int kMaxCacheBlocks = 16384;

struct Scenario {
  int tokens = 1;
  int q_len = 1;
  std::vector<std::string> context = {"short"};
  std::vector<int> pad_rows;
  int static_kv_scale = -1;  // -1: the config's, 0 / 1 override
  int kv_page_stride = -1;   // -1: the config's
  int cache_blocks = 256;
  std::string rank_scores = "own";  // own | shared | distinct
  Injections inject;
};

// ---- the scenario's keys, declared once -------------------------------------------------
// Each key of the JSON form is one row: its name (in "inject" for an injection), the short
// form `k4 golden` takes on its command line, what it holds and its help. The JSON reader,
// the JSON writer and the command line all loop over this table (as config_to_json loops over
// Config's fields): a new scenario option is one row.
enum class KeyKind {
  Int,         // an integer
  OptInt,      // an integer, -1 = the config's: in the JSON only when >= 0
  Flag,        // true / false; the flag sets true
  ConfigFlag,  // -1 the config's, 0 / 1 (JSON false / true, only when set); the flag sets 1
  Rows,        // a list of integers; the option takes them comma-separated
  Contexts,    // key counts or short / medium / long / max: one, or a JSON list; comma-separated
  Text,        // a string
  Expert,      // an expert id, true (-2: the same picks) or false (-1); the option an id or 'any'
};
using ScenarioField = std::variant<int*, bool*, std::vector<int>*, std::vector<std::string>*, std::string*>;
struct ScenarioKey {
  const char* key;       // the JSON key
  bool injection;        // under "inject"
  const char* flag;      // k4 golden's option
  KeyKind kind;
  bool always_written;   // false: in the JSON only when set (the JSON of older scenarios stays as it was)
  const char* help;      // the option's help
  ScenarioField (*field)(Scenario&);
};
const std::vector<ScenarioKey>& scenario_keys();
// Key k of s from its command-line text (Rows, Contexts, Text, Expert); throws
// std::invalid_argument naming the flag.
void set_key_from_text(Scenario& s, const ScenarioKey& k, const std::string& text);

// Throws std::invalid_argument naming `where` and the key.
Scenario scenario_from_json(const std::string& text, const std::string& where);
std::string scenario_to_json(const Scenario& s);
// Checks ranges (tokens 1..max_tokens, q_len divides tokens, row indices, context names);
// messages start with `where` ("scenario FILE").
void validate_scenario(const Scenario& s, const Config& cfg, const std::string& where = "scenario");
// The config fields a scenario overrides (static_kv_scale, kv_page_stride).
void apply_scenario(const Scenario& s, Config& cfg);

// The step's inputs. `w` (optional) lets repeated_expert aim at an expert's gate row.
StepInputs make_inputs(const Config& cfg, const Scenario& s, uint64_t seed, const LayerWeights* w = nullptr);

// The weight injections (special_weights, nan_weight) applied to a loaded layer: replicated
// weights alike in every rank, expert 3 through a wrapping ExpertSource. Call it before
// make_inputs (repeated_expert aims with the gate it leaves).
void apply_weight_injections(LayerWeights& w, const Scenario& s);
// The hidden row of expert e's NaN s2 scale under nan_weight "s2".
int nan_s2_row(const Config& cfg, int e);

// Context of each row (seq_lens), as make_inputs draws them.
std::vector<int32_t> scenario_seq_lens(const Config& cfg, const Scenario& s, uint64_t seed);

}  // namespace k4
