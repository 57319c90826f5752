#include "reference/config.hpp"

#include <stdexcept>
#include <string>
#include <utility>

namespace k4 {
namespace {

void require(bool ok, const Config& c, const std::string& rule) {
  if (!ok) throw std::invalid_argument("config '" + c.name + "': " + rule);
}

}  // namespace

void Config::validate() const {
  const Config& c = *this;
  // The counts first, each positive and small enough that the rules below, which divide by
  // them and multiply them, cannot divide by zero or overflow an int (found by fuzzing: a
  // golden whose config said ug_rows = 0 divided by zero here).
  const std::pair<const char*, int> counts[] = {
      {"heads", heads},       {"head_dim", head_dim},       {"hidden", hidden},   {"n_routed", n_routed},
      {"top_k", top_k},       {"inter", inter},             {"sparse_block", sparse_block},
      {"topk_blocks", topk_blocks}, {"page", page},         {"n_split", n_split}, {"max_tokens", max_tokens},
      {"waves", waves},       {"lanes", lanes},             {"o_rows", o_rows},   {"dn_rows", dn_rows},
      {"ug_rows", ug_rows},   {"sh_rows", sh_rows},         {"local_blocks", local_blocks},
      {"max_context", max_context}};
  for (const auto& [name, v] : counts)
    require(v >= 1 && v <= (std::string(name) == "max_context" ? (1 << 30) : (1 << 15)), c,
            std::string(name) + " = " + std::to_string(v) + " is outside 1.." +
                (std::string(name) == "max_context" ? "2^30" : "32768"));
  require(init_blocks >= 0 && init_blocks <= (1 << 15), c, "init_blocks = " + std::to_string(init_blocks) + " is outside 0..32768");
  require(lanes == 64 && waves == 8, c, "waves must be 8 of 64 lanes (THREADS = 512): the seed's reductions are written for them");
  require(head_dim == 128, c, "head_dim must be 128 (QK runs HEAD_DIM/32 = 4 MFMA chunks, PV 8 column tiles)");
  require(heads == 16, c, "heads must be 16 a rank (the MFMA's 16 rows are the heads)");
  require(o_k() == 4 * threads(), c, "O_K must be 4 * THREADS (a thread converts 4 q / merge values)");
  require(page == 16 && sparse_block % page == 0, c, "a KV page is 16 keys and a block a whole number of pages");
  require(split_keys() == waves * 2 * page, c, "SPLIT_KEYS must be WAVES * 2 pages (each wave one 32-key PV MFMA)");
  require(topk_blocks * sparse_block % n_split == 0 && split_keys() % sparse_block == 0, c, "a partition holds whole selected blocks");
  require(topk_blocks * pages_per_block() == n_split * split_keys() / page, c, "the partitions must cover the selection");
  require(hidden % (8 * 128) == 0, c, "hidden must be a multiple of 1024 (each wave takes whole 128-k chunks of up/gate)");
  require(hidden % threads() == 0 && (hidden / threads()) % 4 == 0, c, "hidden / THREADS must be a multiple of 4 (the router polls its row 4 elements a spec)");
  require(topk_blocks == 16 && split_keys() == 2 * sparse_block, c, "TOPK_BLOCKS must be 16 and a partition two selected blocks (slot / 2 == partition; 16-lane sort networks)");
  require(hidden % 512 == 0, c, "hidden must be a multiple of 512 (the router's 8-element lane loads)");
  require(hidden % o_rows == 0 && hidden % dn_rows == 0, c, "hidden must be whole 32-row tasks");
  require(o_k() % (64 * 4 * 2) == 0, c, "O_K must give each of 4 waves an even count of 64-k chunks");
  require(inter % 128 == 0 && inter % (2 * ug_rows) == 0 && inter % sh_rows == 0, c, "inter must be a multiple of 128");
  require(n_routed % waves == 0 && n_routed >= top_k && n_routed <= 2 * lanes, c, "n_routed must be a multiple of 8, at most 128 (2 a lane; 7 id bits in a route key)");
  require((hidden / (n_routed / waves)) % 32 == 0 && hidden / (n_routed / waves) / 4 <= threads(), c, "each router task's xn slice must be whole 32-blocks, 4 elements a thread");
  require(top_k == 4, c, "top_k must be 4 (the weights' butterfly (1, 2) sums 4 lanes)");
  require(tp == 1 || tp == 2 || tp == 4 || tp == 8, c, "tp must be 1, 2, 4 or 8 (a wave pushes to one peer)");
  require(init_blocks >= 0 && local_blocks >= 1 && init_blocks + local_blocks <= topk_blocks, c, "need local_blocks >= 1 (the tail is local) and init + local <= TOPK_BLOCKS");
  require(max_tokens == 16, c, "MAX_TOKENS is 16 (a 16x16 MFMA column a token)");
  require(max_context % sparse_block == 0 && max_blocks() <= n_split * 2 * threads(), c, "MAX_CONTEXT must fit N_SPLIT shares of CAND_BATCH * THREADS blocks");
  require(kv_page_stride == 16 || kv_page_stride == 8, c, "kv_page_stride is 16 (shared K/V allocation) or 8 (separate planes)");
  require(wide_from >= 1 && wide_from <= 8, c, "wide_from must be 1..8: the narrow MoE routes token k on wave k and holds (S + 1) wave partials, so it serves S <= 7");
  require(ag_rs_from >= 1, c, "ag_rs_from must be a token count");
  require(!variant.index_cp || 2 * tp == n_split, c,
          "index.cp = on (VARIANTS.md V6.2) needs N_SPLIT = 2 TP: split task part takes index head part div 2, one a rank");
  require(variant.wide_down_order != WideDownOrder::per_expert || inter / 128 <= 8, c,
          "moe.wide_down_order = per_expert needs inter / 128 <= 8 (a down wave takes chunks q and q + 4 of an expert)");
  try {
    check_variant(variant);
  } catch (const std::invalid_argument& e) {
    require(false, c, e.what());
  }
}

Config preset(const std::string& name, int tp) {
  Config c;
  if (name == "minimax-m3-tp4") {
    // the defaults above
  } else if (name == "small") {
    c.name = "small";
    c.hidden = 4096;
    c.inter = 256;
    c.n_routed = 64;
  } else if (name == "tiny") {
    c.name = "tiny";
    c.hidden = 2048;
    c.inter = 128;
    c.n_routed = 32;
  } else {
    throw std::invalid_argument("unknown preset '" + name + "' (known: minimax-m3-tp4, small, tiny)");
  }
  if (tp != -1) c.tp = tp;  // -1: the preset's; any other value is validated (tp 0 is an error, not a default)
  c.validate();
  return c;
}

std::vector<std::string> preset_names() { return {"minimax-m3-tp4", "small", "tiny"}; }

}  // namespace k4
