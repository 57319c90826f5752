// weights.cpp -- k4.Weights.from_tensors: one layer's weights from a user's per-rank tensors
// (a deployment's own K4 buffers, or a golden's), by their schema names
// (rank<r>/oproj/inputs/w_o, s_o; rank<r>/router/inputs/g_post, w_gate, bias;
// rank<r>/moe/inputs/expert_ids, w13, s13, w2, s2; w_gate_f32 under router.gate = f32 and
// sh_w13 .. sh_s2 under moe.shared_fp8),
// each checked against the schema's dtype and shape for the config before any is used.
// The weights are the logical row-major tensors the model reads (reference/weights.hpp);
// a stage's expert stacks hold the experts listed in expert_ids, and a step that routes to
// another expert is refused naming it.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "python/src/bind.hpp"

namespace k4::py {
namespace {

// The weight rows of the schema: the stage inputs of oproj, router and moe stored in the
// golden itself (not links to another stage's output or to the shared inputs).
bool is_weight(const golden::TensorSpec& s) {
  const std::string g = s.group;
  return (g == "oproj/inputs" || g == "router/inputs" || g == "moe/inputs") && s.link[0] == '\0';
}

std::string shape_text(const std::vector<uint64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? "," : "") + std::to_string(s[i]);
  return t + ")";
}

// The experts given: rank r's stacks hold expert ids[r][i] at row i.
class GivenExperts : public ExpertSource {
 public:
  GivenExperts(const Config& c, std::vector<std::vector<int32_t>> ids, std::vector<std::vector<std::shared_ptr<const ExpertWeights>>> ex,
               std::vector<std::shared_ptr<const ExpertWeights>> sh8)
      : cfg_(c), ids_(std::move(ids)), ex_(std::move(ex)), sh8_(std::move(sh8)) {}
  std::shared_ptr<const ExpertWeights> expert(int rank, int e) const override {
    if (rank < 0 || rank >= int(ids_.size())) throw std::invalid_argument("k4.Weights.from_tensors: no rank " + std::to_string(rank));
    if (cfg_.variant.shared_fp8 && e == cfg_.shared_expert()) return sh8_[size_t(rank)];
    const std::vector<int32_t>& ids = ids_[size_t(rank)];
    auto it = std::find(ids.begin(), ids.end(), e);
    if (it == ids.end()) {
      std::string have;
      for (size_t i = 0; i < ids.size() && i < 12; ++i) have += (i ? ", " : "") + std::to_string(ids[i]);
      if (ids.size() > 12) have += ", ...";
      throw std::invalid_argument("k4.Weights.from_tensors: the step routes rank " + std::to_string(rank) + " to expert " +
                                  std::to_string(e) + ", which rank" + std::to_string(rank) +
                                  "/moe/inputs/expert_ids does not list (given: " + (have.empty() ? "none" : have) +
                                  "); give every expert the step routes to");
    }
    return ex_[size_t(rank)][size_t(it - ids.begin())];
  }

 private:
  Config cfg_;
  std::vector<std::vector<int32_t>> ids_;
  std::vector<std::vector<std::shared_ptr<const ExpertWeights>>> ex_;
  std::vector<std::shared_ptr<const ExpertWeights>> sh8_;
};

template <class T>
std::vector<T> as(const std::vector<uint8_t>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace

Weights weights_from_tensors(const Config& cfg, const pyb::dict& tensors, const std::string& source, uint64_t seed) {
  cfg.validate();
  const std::string who = "k4.Weights.from_tensors";
  // every key a weight of the schema, of a rank of the config
  struct Given {
    pyb::array a;
    std::string k4_dtype;  // a k4.Tensor's, or ""
  };
  std::map<std::pair<int, std::string>, Given> given;  // (rank, "stage/inputs/name")
  const pyb::object to_numpy = pyb::module_::import("k4.torchx").attr("to_numpy");
  for (auto kv : tensors) {
    const std::string path = pyb::str(kv.first).cast<std::string>();
    int rank = -1;
    std::string canonical;
    const golden::TensorSpec& s = spec_of(path, rank, canonical);
    if (!is_weight(s))
      throw std::invalid_argument(who + ": '" + path + "' is not a weight (the weights are rank<r>/oproj/inputs/w_o, s_o, "
                                  "rank<r>/router/inputs/g_post, w_gate, bias and rank<r>/moe/inputs/expert_ids, w13, s13, w2, "
                                  "s2, sh_w13 .. sh_s2)");
    if (rank < 0 || rank >= cfg.tp)
      throw std::invalid_argument(who + ": '" + path + "': rank " + std::to_string(rank) + " is outside 0.." +
                                  std::to_string(cfg.tp - 1) + " (config '" + cfg.name + "', tp " + std::to_string(cfg.tp) + ")");
    if (!golden::spec_present(s, cfg))
      throw std::invalid_argument(who + ": '" + path + "': config '" + cfg.name + "' (variant " + variant_name(cfg.variant) +
                                  ") stores no " + s.name + " (" + s.meaning + ")");
    const pyb::handle v = kv.second;
    Given g;
    if (pyb::hasattr(v, "k4_dtype") && !pyb::getattr(v, "k4_dtype").is_none())
      g.k4_dtype = pyb::getattr(v, "k4_dtype").cast<std::string>();
    g.a = pyb::array::ensure(to_numpy(v));
    if (!g.a) throw std::invalid_argument(who + ": '" + path + "' is not an array");
    given[{rank, std::string(s.group) + "/" + s.name}] = g;
  }
  // the bits of rank r's tensor `key`, its dtype and shape checked
  auto bits = [&](int r, const golden::TensorSpec& s, int used) -> std::vector<uint8_t> {
    const std::string key = std::string(s.group) + "/" + s.name;
    const std::string path = "rank" + std::to_string(r) + "/" + key;
    auto it = given.find({r, key});
    if (it == given.end())
      throw std::invalid_argument(who + ": " + path + " is missing (" + s.meaning + "; every rank's weights are required)");
    golden::DimSizes ds;
    ds.cfg = cfg;
    ds.used_experts = used;
    const DType want = ds.dtype_of(s);
    const std::string wants = golden::dtype_name(want);
    if (!it->second.k4_dtype.empty() && it->second.k4_dtype != wants)
      throw std::invalid_argument(who + ": " + path + ": a " + it->second.k4_dtype + " tensor where " + wants + " is expected");
    pyb::array a = it->second.a;
    const std::vector<uint64_t> shape = ds.shape(s.dims);
    std::vector<uint64_t> got(size_t(a.ndim()));
    for (size_t i = 0; i < got.size(); ++i) got[i] = uint64_t(a.shape(pyb::ssize_t(i)));
    if (got != shape)
      throw std::invalid_argument(who + ": " + path + " has shape " + shape_text(got) + ", expected dtype " + wants + ", shape " +
                                  shape_text(shape) + " (" + ds.dims_of(s.dims) + ") for config '" + cfg.name + "'");
    // f32 values are their bits (as in k4.assert_bitexact); a float32 array anywhere else is refused
    if (want == DType::F32 && a.dtype().is(pyb::dtype::of<float>())) a = pyb::array(pyb::dtype::of<uint32_t>(), a.request().shape, a.request().strides, a.data(), a);
    return bits_of(pyb::array::ensure(a, pyb::array::c_style), want, path);
  };
  auto spec = [](const char* group, const char* name) -> const golden::TensorSpec& { return golden::find_spec(group, name); };

  auto lw = std::make_shared<LayerWeights>();
  lw->cfg = cfg;
  std::vector<std::vector<int32_t>> ids(size_t(cfg.tp));
  std::vector<std::vector<std::shared_ptr<const ExpertWeights>>> ex(size_t(cfg.tp));
  std::vector<std::shared_ptr<const ExpertWeights>> sh8(size_t(cfg.tp));
  for (int r = 0; r < cfg.tp; ++r) {
    RankWeights w;
    w.w_o = bits(r, spec("oproj/inputs", "w_o"), 0);
    w.s_o = as<float>(bits(r, spec("oproj/inputs", "s_o"), 0));
    w.g_post = as<uint16_t>(bits(r, spec("router/inputs", "g_post"), 0));
    w.w_gate = as<uint16_t>(bits(r, spec("router/inputs", "w_gate"), 0));
    w.bias = as<float>(bits(r, spec("router/inputs", "bias"), 0));
    if (cfg.variant.router_gate == RouterGate::f32)  // V1a: the F32 gate the logits read
      w.w_gate_f32 = as<float>(bits(r, spec("router/inputs", "w_gate_f32"), 0));
    lw->ranks.push_back(std::move(w));
    // the expert stacks: their rows are the ids given
    const std::string idp = "rank" + std::to_string(r) + "/moe/inputs/expert_ids";
    auto idt = given.find({r, "moe/inputs/expert_ids"});
    if (idt == given.end()) throw std::invalid_argument(who + ": " + idp + " is missing (the experts the stacks w13 .. s2 hold, a row each)");
    const int used = idt->second.a.ndim() == 1 ? int(idt->second.a.shape(0)) : -1;
    if (used < 0) throw std::invalid_argument(who + ": " + idp + " is not one-dimensional (used_expert)");
    ids[size_t(r)] = as<int32_t>(bits(r, spec("moe/inputs", "expert_ids"), used));
    std::set<int32_t> seen;
    for (size_t i = 0; i < ids[size_t(r)].size(); ++i) {
      const int32_t e = ids[size_t(r)][i];
      if (e < 0 || e > cfg.n_routed)
        throw std::invalid_argument(who + ": " + idp + "[" + std::to_string(i) + "] = " + std::to_string(e) + " is outside 0.." +
                                    std::to_string(cfg.n_routed) + " (the shared expert is " + std::to_string(cfg.n_routed) + ")");
      if (!seen.insert(e).second)
        throw std::invalid_argument(who + ": " + idp + "[" + std::to_string(i) + "] = " + std::to_string(e) + " is listed twice");
    }
    const std::vector<uint8_t> w13 = bits(r, spec("moe/inputs", "w13"), used), s13 = bits(r, spec("moe/inputs", "s13"), used),
                               w2 = bits(r, spec("moe/inputs", "w2"), used), s2 = bits(r, spec("moe/inputs", "s2"), used);
    auto row = [&](const std::vector<uint8_t>& stack, int i) {
      const size_t n = used ? stack.size() / size_t(used) : 0;
      return std::vector<uint8_t>(stack.begin() + std::ptrdiff_t(i * n), stack.begin() + std::ptrdiff_t((i + 1) * n));
    };
    for (int i = 0; i < used; ++i) {
      auto e = std::make_shared<ExpertWeights>();
      e->w13 = row(w13, i), e->s13 = row(s13, i), e->w2 = row(w2, i), e->s2 = row(s2, i);
      ex[size_t(r)].push_back(e);
    }
    if (cfg.variant.shared_fp8) {
      auto e = std::make_shared<ExpertWeights>();
      e->w13 = bits(r, spec("moe/inputs", "sh_w13"), used), e->s13 = bits(r, spec("moe/inputs", "sh_s13"), used);
      e->w2 = bits(r, spec("moe/inputs", "sh_w2"), used), e->s2 = bits(r, spec("moe/inputs", "sh_s2"), used);
      sh8[size_t(r)] = e;
    }
  }
  lw->experts = std::make_shared<GivenExperts>(cfg, std::move(ids), std::move(ex), std::move(sh8));
  Weights W;
  W.w = lw;
  W.source = source;
  W.seed = seed;
  return W;
}

}  // namespace k4::py
