// cmd_checkpoint.cpp -- k4 checkpoint inspect DIR [--layer L]: what a golden of that layer
// reads, before reading it: per tensor the name found, its shard, the stored dtype and shape
// and the conversion the loader applies; and which shards the layer needs (a user downloads
// only those). Works on a directory holding only config.json and the index.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

#include "golden/inputs/checkpoint.hpp"
#include "golden/inputs/hf_config.hpp"
#include "golden/inputs/hf_names.hpp"
#include "golden/io/safetensors.hpp"
#include "tools/commands.hpp"

namespace k4::tools {
namespace {

struct CheckpointOpt {
  std::string dir, preset, mx_scale = "even", variant;
  int tp = -1, layer = -1;
  bool all_experts = false;
};

// The names the layer reads and their shards, from the index alone.
std::vector<std::string> layer_tensor_names(const Checkpoint& ck, const Config& c, int layer) {
  using T = hf::Tensor;
  std::vector<std::string> v;
  for (T t : {T::PostNorm, T::OProj, T::OProjScale, T::Gate, T::Bias}) v.push_back(ck.find(hf::candidates(t, layer)));
  for (int e = 0; e <= c.n_routed; ++e)
    for (T t : {T::W1, T::W1Scale, T::W3, T::W3Scale, T::W2, T::W2Scale})
      v.push_back(ck.find(hf::candidates(t, layer, e, e == c.shared_expert())));
  v.erase(std::remove(v.begin(), v.end(), std::string()), v.end());
  return v;
}

bool shown(const TensorUse& u, bool all) {
  if (all) return true;
  return u.role.rfind("expert ", 0) != 0 || u.role.rfind("expert 0 ", 0) == 0;
}

int inspect(const CheckpointOpt& o) {
  const Checkpoint ck(o.dir);
  CheckpointShape s = checkpoint_shape(ck, o.preset, o.tp, o.layer);
  if (!o.variant.empty()) s.cfg.variant = parse_variant(o.variant), s.cfg.validate();  // moe.experts=mxfp8: MXFP8 experts as stored
  const Config& c = s.cfg;
  std::printf("checkpoint %s\n", o.dir.c_str());
  std::printf("  shape: %s (hidden %d, %d q heads a rank, tp %d, %d routed experts + the shared one, inter %d a rank)\n",
              s.from_config_json ? "config.json text_config" : ("--preset " + o.preset).c_str(), c.hidden, c.heads, c.tp,
              c.n_routed, c.inter);
  if (s.from_config_json) std::printf("  K4 layers (MoE and sparse): %s\n", layer_list(s.k4_layers).c_str());
  std::printf("  layer %d\n", s.layer);
  const std::vector<std::string> names = layer_tensor_names(ck, c, s.layer);
  std::set<std::string> shards;
  for (const std::string& n : names) shards.insert(ck.shard_of(n));
  const std::vector<std::string> missing_all = ck.missing_shards();
  const std::set<std::string> missing(missing_all.begin(), missing_all.end());
  std::printf("  shards the layer needs:\n");
  int absent = 0;
  for (const std::string& f : shards) {
    const bool gone = missing.count(f) != 0;
    absent += gone;
    std::printf("    %s%s\n", f.c_str(), gone ? "  (not in the directory: download it)" : "");
  }
  if (absent) {  // the headers cannot be read: the names and shards from the index
    std::printf("  tensors K4 reads (from the index; %d shard%s missing, so no dtypes):\n", absent, absent > 1 ? "s" : "");
    for (const std::string& n : names) std::printf("    %s  %s\n", n.c_str(), ck.shard_of(n).c_str());
    return 0;
  }
  const LayerPlan plan = plan_layer(ck, c, s.layer, prep::mx_scale_from(o.mx_scale));
  std::printf("  tensors K4 reads: role | name | shard | stored dtype, shape | conversion\n");
  int hidden = 0;
  for (const TensorUse& u : plan.tensors) {
    if (!shown(u, o.all_experts)) {
      ++hidden;
      continue;
    }
    std::printf("    %s | %s | %s | %s %s | %s\n", u.role.c_str(), u.name.c_str(), u.shard.c_str(), u.dtype.c_str(),
                st::shape_str(u.shape).c_str(), u.conversion.c_str());
  }
  if (hidden) std::printf("    (and %d tensors of experts 1..%d, the same forms, each checked; --all-experts lists them)\n", hidden, c.n_routed - 1);
  std::printf("  weight_prep: %s\n", plan.prep_json.c_str());
  return 0;
}

}  // namespace

Run add_checkpoint(CLI::App& app) {
  auto o = std::make_shared<CheckpointOpt>();
  app.require_subcommand(1);
  CLI::App* in = app.add_subcommand("inspect", "per tensor K4 reads: name, shard, dtype, shape, conversion; the shards a layer needs");
  in->add_option("DIR", o->dir, "checkpoint directory (config.json, model.safetensors.index.json, shards) or file")->required();
  in->add_option("--layer", o->layer, "layer (default: the first K4 layer)")->check(CLI::Range(0, 1 << 20));
  in->add_option("--preset", o->preset, "config preset (needed without config.json; must agree with it)");
  in->add_option("--tp", o->tp, "tensor-parallel ranks (default: config.json's heads / 16)");
  in->add_option("--mx-scale", o->mx_scale, "MXFP4 rule for BF16 experts: even (default) or floor")
      ->check(CLI::IsMember({"even", "floor"}));
  in->add_option("--variant", o->variant, "the build (as k4 golden --variant): moe.experts=mxfp8 reads MXFP8 experts as stored");
  in->add_flag("--all-experts", o->all_experts, "list every expert's tensors (default: expert 0 and the shared expert)");
  return [o, in]() {
    if (!in->parsed()) throw std::invalid_argument("k4 checkpoint: a subcommand is required (inspect)");
    return inspect(*o);
  };
}

}  // namespace k4::tools
