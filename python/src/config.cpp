// config.cpp -- k4.Config, k4.Weights and k4.Inputs: the config presets and JSON form, the
// synthetic or checkpoint layer, and a step's inputs from a scenario given by the options
// of `k4 golden` (tokens=4, context="1000,short", ties=True, ...), built in the order
// `k4 golden` builds them (tools/cmd_golden.cpp), so that a step saved from Python holds
// the same bytes as the CLI's golden.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "golden/inputs/checkpoint.hpp"
#include "golden/inputs/hf_config.hpp"
#include "golden/inputs/synth.hpp"
#include "golden/io/file_check.hpp"
#include "python/src/bind.hpp"

namespace k4::py {
namespace {

// "1000,short" or [1000, "short"] -> the items as strings; a bare int too.
std::vector<std::string> str_list(const pyb::handle& v, const char* what) {
  std::vector<std::string> out;
  auto item = [&](const pyb::handle& x) {
    if (pyb::isinstance<pyb::bool_>(x)) throw std::invalid_argument(std::string(what) + ": a bool is not a context");
    if (pyb::isinstance<pyb::int_>(x)) out.push_back(std::to_string(x.cast<long long>()));
    else if (pyb::isinstance<pyb::str>(x)) out.push_back(x.cast<std::string>());
    else throw std::invalid_argument(std::string(what) + ": " + std::string(pyb::repr(x)) + " is neither a key count nor a name");
  };
  if (pyb::isinstance<pyb::str>(v)) {
    std::stringstream ss(v.cast<std::string>());
    std::string t;
    while (std::getline(ss, t, ','))
      if (!t.empty()) out.push_back(t);
  } else if (pyb::isinstance<pyb::sequence>(v)) {
    for (const pyb::handle& x : v) item(x);
  } else {
    item(v);
  }
  return out;
}

int int_of(const pyb::handle& v, const std::string& what) {
  if (pyb::isinstance<pyb::bool_>(v) || !pyb::isinstance<pyb::int_>(v))
    throw std::invalid_argument(what + ": " + std::string(pyb::repr(v)) + " is not an integer");
  const long long x = v.cast<long long>();
  if (x < INT32_MIN || x > INT32_MAX) throw std::invalid_argument(what + ": " + std::to_string(x) + " is outside the int range");
  return int(x);
}

std::vector<int> int_list(const pyb::handle& v, const std::string& what) {
  std::vector<int> out;
  if (pyb::isinstance<pyb::str>(v)) {
    for (const std::string& t : str_list(v, what.c_str())) {
      size_t used = 0;
      int x = 0;
      try {
        x = std::stoi(t, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != t.size()) throw std::invalid_argument(what + ": '" + t + "' is not an integer");
      out.push_back(x);
    }
  } else if (pyb::isinstance<pyb::sequence>(v)) {
    for (const pyb::handle& x : v) out.push_back(int_of(x, what));
  } else {
    out.push_back(int_of(v, what));
  }
  return out;
}

bool flag_of(const pyb::handle& v, const std::string& what) {
  if (!pyb::isinstance<pyb::bool_>(v)) throw std::invalid_argument(what + ": " + std::string(pyb::repr(v)) + " is not True or False");
  return v.cast<bool>();
}

// The scenario options of k4.inputs: one a row of scenario_keys() (golden/inputs/scenario.hpp),
// named as k4 golden's option without its dashes ("--q-len" -> "q_len", "--ties" -> "ties"),
// so that a key added to the table is an option here with no change.
std::string option_name(const ScenarioKey& k) {
  std::string n = k.flag;
  n.erase(0, n.find_first_not_of('-'));
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

const std::vector<std::string>& option_names() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (const ScenarioKey& k : scenario_keys()) out.push_back(option_name(k));
    return out;
  }();
  return v;
}

const char* kind_name(KeyKind k) {
  switch (k) {
    case KeyKind::Int: return "int";
    case KeyKind::OptInt: return "int (-1: the config's)";
    case KeyKind::Flag: return "bool";
    case KeyKind::ConfigFlag: return "bool (absent: the config's)";
    case KeyKind::Rows: return "rows (list of ints or 'i,j')";
    case KeyKind::Contexts: return "contexts (list or 'a,b': key counts or short / medium / long / max)";
    case KeyKind::Text: return "str";
    case KeyKind::Expert: return "expert (an id, 'any' or True: the same picks, False: off)";
  }
  return "str (k4 golden's text)";
}

// One option's value into its key of s, with the meaning the key has in the scenario JSON
// (a flag True / False, a config flag True = 1 / False = 0); texts as k4 golden reads them.
void set_option(Scenario& s, const ScenarioKey& k, const std::string& name, const pyb::handle& v) {
  const ScenarioField f = k.field(s);
  switch (k.kind) {
    case KeyKind::Int:
    case KeyKind::OptInt: *std::get<int*>(f) = int_of(v, name); return;
    case KeyKind::Flag: *std::get<bool*>(f) = flag_of(v, name); return;
    case KeyKind::ConfigFlag: *std::get<int*>(f) = flag_of(v, name) ? 1 : 0; return;
    case KeyKind::Rows: *std::get<std::vector<int>*>(f) = int_list(v, name); return;
    case KeyKind::Contexts: *std::get<std::vector<std::string>*>(f) = str_list(v, name.c_str()); return;
    case KeyKind::Expert:
      if (pyb::isinstance<pyb::bool_>(v)) {
        *std::get<int*>(f) = v.cast<bool>() ? -2 : -1;
        return;
      }
      if (pyb::isinstance<pyb::int_>(v)) {
        *std::get<int*>(f) = int_of(v, name);
        return;
      }
      break;  // a text: 'any' or an id
    default: break;
  }
  if (!pyb::isinstance<pyb::str>(v))
    throw std::invalid_argument(name + ": " + std::string(pyb::repr(v)) + " is not a " + kind_name(k.kind));
  set_key_from_text(s, k, v.cast<std::string>());  // its errors name k4 golden's option, as the CLI's do
}

// The options over `s`, as the CLI applies its options over --scenario (in the table's
// order; None: not given).
void apply_options(Scenario& s, const pyb::dict& opts) {
  std::set<std::string> used;
  for (const ScenarioKey& k : scenario_keys()) {
    const std::string name = option_name(k);
    const pyb::str key(name);
    if (!opts.contains(key)) continue;
    used.insert(name);
    const pyb::handle v = opts[key];
    if (!v.is_none()) set_option(s, k, name, v);
  }
  for (auto kv : opts) {
    const std::string k = pyb::str(kv.first).cast<std::string>();
    if (used.count(k)) continue;
    std::string known;
    for (const std::string& n : option_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown scenario option '" + k + "' (known: " + known + ")");
  }
}

Weights synthetic(const Config& cfg, uint64_t seed) {
  cfg.validate();
  Weights w;
  {
    pyb::gil_scoped_release nogil;
    w.w = std::make_shared<const LayerWeights>(synth::synthetic_layer(cfg, seed));
  }
  w.seed = seed;
  return w;
}

// A str or os.PathLike as a path (os.fspath; bytes refused).
std::string path_of(const pyb::object& p) {
  const pyb::object s = pyb::module_::import("os").attr("fspath")(p);
  if (!pyb::isinstance<pyb::str>(s)) throw std::invalid_argument("a path is a str or os.PathLike of str, not " + std::string(pyb::repr(p)));
  return s.cast<std::string>();
}

// A Hugging Face config.json: a checkpoint directory's (named in messages as k4 golden
// --checkpoint names it: "checkpoint DIR: config.json") or a file's ("config.json FILE").
HfModel hf_model(const std::string& path, int tp) {
  std::error_code ec;
  std::string text, where;
  if (std::filesystem::is_directory(path, ec)) {
    const std::string f = (std::filesystem::path(path) / "config.json").string();
    if (!std::filesystem::exists(f, ec)) throw std::invalid_argument("checkpoint " + path + " has no config.json");
    text = read_input_text(f, "config.json");
    where = "checkpoint " + path + ": config.json";
  } else {
    text = read_input_text(path, "config.json");
    where = "config.json " + path;
  }
  return hf_model_from_config(text, where, tp);
}

// k4 golden --checkpoint PATH [--preset] [--layer] [--mx-scale]: the shape from the
// checkpoint's config.json (a config given must agree with it, its variant is kept), or the
// config given for a checkpoint without config.json; the layer the CLI's (the first K4 layer
// by default); the deployment's weight prep, recorded for the golden as k4 golden records it.
Weights from_checkpoint(const pyb::object& path_obj, const pyb::object& config, int layer, const std::string& mx_scale) {
  const std::string path = path_of(path_obj);
  const prep::MxScale mx = prep::mx_scale_from(mx_scale);
  auto ck = std::make_shared<const Checkpoint>(path);
  Config cfg;
  int lay = layer < 0 ? 0 : layer;
  if (ck->config_json().empty()) {
    if (config.is_none())
      throw std::invalid_argument("checkpoint " + path + " has no config.json: give its k4.Config (k4.Config.preset(...))");
    cfg = config.cast<Config>();
  } else {
    // As k4 golden --checkpoint [--preset --tp]: the config.json's shape at its own TP, or at the
    // config's where that differs; a config.json the model cannot run at the config's TP is
    // refused as k4 golden refuses a preset that disagrees (naming every field that differs).
    const std::string where = "checkpoint " + path + ": config.json";
    HfModel m = hf_model_from_config(ck->config_json(), where, -1);
    if (!config.is_none()) {
      const Config given = config.cast<Config>();
      if (given.tp != m.cfg.tp) {
        try {
          m = hf_model_from_config(ck->config_json(), where, given.tp);
        } catch (const std::invalid_argument&) {
          require_preset_agrees(m.cfg, given, where);
          throw;
        }
      }
      require_preset_agrees(m.cfg, given, where);
      m.cfg.variant = given.variant;
    }
    cfg = m.cfg;
    lay = choose_k4_layer(m, layer, where);
  }
  cfg.validate();
  Weights w;
  {
    pyb::gil_scoped_release nogil;
    w.weight_prep = plan_layer(*ck, cfg, lay, mx).prep_json;
    w.w = std::make_shared<const LayerWeights>(load_checkpoint_layer(ck, cfg, lay, mx));
  }
  w.source = "checkpoint " + path;
  w.checkpoint = path;
  w.layer = lay;
  return w;
}

// k4 golden's order: the scenario checked against the weights' config, its overrides applied,
// the weight injections, then the inputs (repeated_expert aims with the injected gate).
Inputs make_step_inputs(const Weights& W, uint64_t seed, const std::string& scenario_file, const pyb::dict& opts) {
  Scenario scn;
  if (!scenario_file.empty()) scn = scenario_from_json(read_input_text(scenario_file, "scenario file"), "scenario " + scenario_file);
  apply_options(scn, opts);
  const std::string where = scenario_file.empty() ? std::string("scenario")
                            : opts.empty()        ? "scenario " + scenario_file
                                                  : "scenario " + scenario_file + " with the scenario options";
  Inputs I;
  I.cfg = W.w->cfg;
  validate_scenario(scn, I.cfg, where);
  apply_scenario(scn, I.cfg);
  I.seed = seed;
  I.scenario_json = scenario_to_json(scn);
  I.made_from = W.w.get();
  I.weight_injections = scn.inject.special_weights || !scn.inject.nan_weight.empty();
  pyb::gil_scoped_release nogil;
  auto lw = std::make_shared<LayerWeights>(*W.w);
  lw->cfg = I.cfg;
  apply_weight_injections(*lw, scn);
  I.in = std::make_shared<const StepInputs>(make_inputs(I.cfg, scn, seed, lw.get()));
  I.weights = lw;
  return I;
}

}  // namespace

void bind_config(pyb::module_& m) {
  pyb::class_<Config> c(m, "Config", "Every shape and parameter K4's numerics depend on (reference/config.hpp).");
  c.def(pyb::init<>())
      .def_static("preset", &preset, pyb::arg("name") = "minimax-m3-tp4", pyb::arg("tp") = -1,
                  "A preset (minimax-m3-tp4, small, tiny); tp = -1 keeps the preset's TP.")
      .def_static("preset_names", &preset_names)
      .def_static("from_hf_config", [](const pyb::object& path, int tp) { return hf_model(path_of(path), tp).cfg; }, pyb::arg("path"),
                  pyb::arg("tp") = -1,
                  "The shape of a Hugging Face config.json (its text_config): a file, or a checkpoint directory's "
                  "(golden/inputs/hf_config.hpp; k4 golden --checkpoint's rules and messages); tp = -1: "
                  "num_attention_heads / 16.")
      .def_static("from_json", [](const std::string& text) { return golden::config_from_json(text, "config JSON"); },
                  pyb::arg("text"), "The config JSON of a golden (every field required, no others).")
      .def_static("from_file", [](const std::string& path) {
        require_input_file(path, "config file");
        std::ifstream f(path, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        return golden::config_from_json(ss.str(), "config file " + path);
      }, pyb::arg("path"), "A config JSON file (k4's form: Config.to_json()).")
      .def("to_json", [](const Config& x) { return golden::config_to_json(x); })
      .def("validate", &Config::validate)
      .def("copy", [](const Config& x) { return Config(x); })
      .def_property("variant", [](const Config& x) { return variant_name(x.variant); },
                    [](Config& x, const std::string& spec) { x.variant = parse_variant(spec); },
                    "The build's numerics as a spec (seed, vllm-mono, aiter, atom, SWITCH=VALUE,...).")
      .def_property_readonly("o_k", &Config::o_k)
      .def_property_readonly("threads", &Config::threads)
      .def_property_readonly("moe_slots", &Config::moe_slots)
      .def_property_readonly("n_experts", &Config::n_experts)
      .def_property_readonly("sparse_table_words", &Config::sparse_table_words)
      .def("__eq__", [](const Config& a, const Config& b) { return golden::config_to_json(a) == golden::config_to_json(b); })
      .def("__repr__", [](const Config& x) {
        return "k4.Config(name='" + x.name + "', tp=" + std::to_string(x.tp) + ", variant='" + variant_name(x.variant) + "')";
      });
#define K4_RW(f) c.def_readwrite(#f, &Config::f);
  K4_RW(name) K4_RW(heads) K4_RW(head_dim) K4_RW(hidden) K4_RW(n_routed) K4_RW(top_k) K4_RW(inter)
  K4_RW(sparse_block) K4_RW(topk_blocks) K4_RW(page) K4_RW(n_split) K4_RW(max_tokens) K4_RW(max_context)
  K4_RW(kv_page_stride) K4_RW(waves) K4_RW(lanes) K4_RW(o_rows) K4_RW(dn_rows) K4_RW(ug_rows) K4_RW(sh_rows)
  K4_RW(tp) K4_RW(sm_scale) K4_RW(eps) K4_RW(route_scale) K4_RW(shared_weight) K4_RW(swiglu_limit)
  K4_RW(init_blocks) K4_RW(local_blocks) K4_RW(wide_from) K4_RW(ag_rs_from)
#undef K4_RW

  pyb::class_<Weights>(m, "Weights", "One layer's K4 weights, every TP rank's shard (logical row-major).")
      .def_static("synthetic", &synthetic, pyb::arg("config"), pyb::arg("seed") = 1,
                  "The deterministic synthetic layer (k4 golden's default; --weight-seed).")
      .def_static("from_checkpoint", &from_checkpoint, pyb::arg("path"), pyb::arg("config") = pyb::none(),
                  pyb::arg("layer") = -1, pyb::arg("mx_scale") = "even",
                  "A checkpoint as k4 golden --checkpoint reads it: a release directory (config.json, index, shards: "
                  "its config.json gives the shape, a config given must agree and gives the variant; layer -1 = the "
                  "first K4 layer), a directory of shards or one file (then config is required, layer -1 = 0); "
                  "mx_scale even / floor for BF16 experts.")
      .def_static("from_tensors", &weights_from_tensors, pyb::arg("config"), pyb::arg("tensors"), pyb::arg("source") = "tensors",
                  pyb::arg("seed") = 0,
                  "A layer from per-rank tensors by schema name ({'rank0/oproj/inputs/w_o': bits, ...}: w_o, s_o, g_post, "
                  "w_gate, bias, expert_ids and the expert stacks w13, s13, w2, s2 of every rank; sh_w13 .. sh_s2 under "
                  "moe.shared_fp8), each checked against the schema's dtype and shape (a float32 array where bf16 is "
                  "expected is refused; f32 tensors may be float32 values); source and seed are what a golden saved from "
                  "them records as its weights (attributes weights, seeds).")
      .def_readonly("layer", &Weights::layer)
      .def_readonly("weight_prep", &Weights::weight_prep)
      .def_property_readonly("config", [](const Weights& w) { return w.w->cfg; })
      .def_readonly("source", &Weights::source)
      .def_readonly("seed", &Weights::seed)
      .def("__repr__", [](const Weights& w) {
        return "k4.Weights(" + w.source + (w.checkpoint.empty() ? ", seed " + std::to_string(w.seed) : "") + ", " + w.w->cfg.name + ")";
      });

  pyb::class_<Inputs>(m, "Inputs", "One decode step's inputs (every rank's), with the scenario they came from.")
      .def_readonly("config", &Inputs::cfg)
      .def_readonly("seed", &Inputs::seed)
      .def_readonly("scenario_json", &Inputs::scenario_json)
      .def_property_readonly("tokens", [](const Inputs& i) { return i.in->shared.tokens; })
      .def_property_readonly("seq_lens", [](const Inputs& i) { return i.in->shared.seq_lens; });

  m.def("hf_model", [](const pyb::object& path, int tp) {
    const HfModel h = hf_model(path_of(path), tp);
    pyb::dict d;
    d["config"] = h.cfg;
    d["num_layers"] = h.num_layers;
    d["k4_layers"] = h.k4_layers;
    return d;
  }, pyb::arg("path"), pyb::arg("tp") = -1,
        "A Hugging Face config.json (file or checkpoint directory): {config, num_layers, k4_layers (both MoE and sparse)}.");
  m.def("_make_inputs", &make_step_inputs, pyb::arg("weights"), pyb::arg("seed"), pyb::arg("scenario_file"),
        pyb::arg("options"));
  m.def("scenario_options", &option_names, "The scenario options k4.inputs takes (k4 golden's, dashes as underscores).");
  m.def("scenario_keys", [] {
    pyb::list out;
    Scenario dflt;
    for (const ScenarioKey& k : scenario_keys()) {
      pyb::dict d;
      const ScenarioField f = k.field(dflt);
      if (k.kind == KeyKind::ConfigFlag && *std::get<int*>(f) < 0) d["default"] = pyb::none();
      else if (k.kind == KeyKind::Expert && *std::get<int*>(f) == -1) d["default"] = false;
      else std::visit([&](auto* x) { d["default"] = pyb::cast(*x); }, f);
      d["option"] = option_name(k);
      d["key"] = k.key;
      d["inject"] = k.injection;
      d["flag"] = k.flag;
      d["kind"] = kind_name(k.kind);
      d["help"] = k.help;
      out.append(d);
    }
    return out;
  }, "The scenario table (golden/inputs/scenario.hpp scenario_keys()): a dict a key (option, its JSON key, "
     "inject, k4 golden's flag, kind, help, default: the value of a scenario without the key).");
}

}  // namespace k4::py
