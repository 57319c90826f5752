// cmd_golden.cpp -- k4 golden: weights (checkpoint or synthetic) + decode inputs (scenario
// or a captured inputs file) -> k4::run_step -> one golden HDF5 file.
#include <omp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <variant>

#include "golden/io/atomic_file.hpp"
#include "golden/inputs/checkpoint.hpp"
#include "golden/inputs/hf_config.hpp"
#include "golden/io/file_check.hpp"
#include "golden/inputs/scenario.hpp"
#include "golden/format/schema.hpp"
#include "golden/format/weights_file.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/model.hpp"
#include "tools/commands.hpp"
#include "tools/progress.hpp"

namespace k4::tools {
namespace {

// The presets and switches --variant takes, from the switch table (reference/variant.hpp).
std::string variants_help() {
  std::string h = "Variants (--variant; docs/numerics.md section 13):\n  presets:";
  h += "\n";
  for (const std::string& p : variant_preset_names()) {
    std::string d;
    for (const std::string& x : variant_diff(Variant{}, variant_preset(p))) d += (d.empty() ? "" : ",") + x;
    h += "    " + p + (d.empty() ? "  (every switch's first value)" : "  = seed," + d) + "\n";
  }
  h += "  switches (the seed's value first):\n";
  for (const VariantSwitch& s : variant_switches()) {
    std::string vals;
    for (size_t i = 0; i < s.values.size(); ++i)
      vals += std::string(i ? "|" : "") + s.values[i] + (s.modelled[i] ? "" : "(not modelled yet)");
    h += "  " + std::string(s.name) + "=" + vals + "  " + s.rule + ": " + s.doc + "\n";
  }
  return h;
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct GoldenOpt {
  std::string checkpoint, preset, variant, scenario, inputs, out, kv_form = "auto", mx_scale = "even", weights_file;
  int tp = -1, layer = -1, threads = -1;
  uint64_t seed = 1, weight_seed = 1;
  bool force = false, progress = false;
  // The scenario options, one a row of scenario_keys() (override the scenario file).
  struct Key {
    const ScenarioKey* key = nullptr;
    int number = 0;
    bool flag = false;
    std::string text;
    CLI::Option* opt = nullptr;  // given (count() > 0) or not: 0 is a value, not "absent"
  };
  std::deque<Key> keys;  // stable addresses: CLI11 keeps pointers to the values
  bool any_scenario_option() const {
    for (const Key& k : keys)
      if (k.opt->count() > 0) return true;
    return false;
  }
};

// The scenario options, from the table: integers as CLI11 integers, flags as flags, the rest
// as text in the key's short form (comma lists, 'any').
void add_scenario_options(CLI::App& app, GoldenOpt& o) {
  auto* g = app.add_option_group("scenario", "scenario options (override --scenario)");
  for (const ScenarioKey& k : scenario_keys()) {
    GoldenOpt::Key& x = o.keys.emplace_back();
    x.key = &k;
    switch (k.kind) {
      case KeyKind::Int:
      case KeyKind::OptInt: x.opt = g->add_option(k.flag, x.number, k.help); break;
      case KeyKind::Flag:
      case KeyKind::ConfigFlag: x.opt = g->add_flag(k.flag, x.flag, k.help); break;
      default: x.opt = g->add_option(k.flag, x.text, k.help); break;
    }
  }
}

// The options given, over the scenario (a flag given sets its key).
void apply_scenario_options(const GoldenOpt& o, Scenario& scn) {
  for (const GoldenOpt::Key& x : o.keys) {
    if (x.opt->count() == 0) continue;
    const ScenarioField f = x.key->field(scn);
    switch (x.key->kind) {
      case KeyKind::Int:
      case KeyKind::OptInt: *std::get<int*>(f) = x.number; break;
      case KeyKind::Flag:
        if (x.flag) *std::get<bool*>(f) = true;
        break;
      case KeyKind::ConfigFlag:
        if (x.flag) *std::get<int*>(f) = 1;
        break;
      default: set_key_from_text(scn, *x.key, x.text); break;
    }
  }
}

// What the model runs on: the config, the step's inputs (made later from the scenario, or read
// from an inputs file) and the scenario as the golden records it.
struct Step {
  std::shared_ptr<const Checkpoint> ck;  // --checkpoint's files, and its shape and layer
  CheckpointShape shape;
  Config cfg;
  Scenario scn;
  StepInputs in;
  std::string scenario_json;
};

// --inputs: a captured inputs file, its config checked against --preset / --tp.
Step step_from_inputs_file(const GoldenOpt& o) {
  if (!o.scenario.empty()) throw std::invalid_argument("--inputs excludes --scenario");
  for (const GoldenOpt::Key& x : o.keys)
    if (x.opt->count() > 0)
      throw std::invalid_argument("--inputs excludes the scenario options (" + x.opt->get_name() + " given)");
  Step st;
  Config file_cfg;
  st.in = golden::read_inputs_file(o.inputs, &file_cfg);
  if (o.preset.empty() && o.tp != -1 && o.tp != file_cfg.tp)
    throw std::invalid_argument("--tp " + std::to_string(o.tp) + ": inputs file " + o.inputs + " was captured with tp " +
                                std::to_string(file_cfg.tp));
  if (!o.preset.empty()) {
    Config p = preset(o.preset, o.tp);
    p.variant = file_cfg.variant;
    p.kv_page_stride = file_cfg.kv_page_stride;
    if (golden::config_to_json(p) != golden::config_to_json(file_cfg))
      throw std::invalid_argument("inputs file " + o.inputs + " was captured with config " + golden::config_to_json(file_cfg) +
                                  ", not preset " + o.preset);
  }
  st.cfg = file_cfg;
  if (!o.checkpoint.empty()) {  // the inputs file's config is the truth; config.json must agree
    st.ck = std::make_shared<const Checkpoint>(o.checkpoint);
    if (st.ck->config_json().empty()) {
      st.shape.layer = o.layer < 0 ? 0 : o.layer;
    } else {
      st.shape = checkpoint_shape(*st.ck, "", file_cfg.tp, o.layer);
      require_preset_agrees(st.shape.cfg, file_cfg, "checkpoint " + o.checkpoint + ": config.json");
    }
  }
  if (!o.variant.empty()) st.cfg.variant = parse_variant(o.variant), st.cfg.validate();
  st.scenario_json = "{\"inputs_file\": \"" + std::filesystem::path(o.inputs).filename().string() + "\"}";
  return st;
}

// --preset with --scenario and / or the scenario options.
Step step_from_scenario(const GoldenOpt& o) {
  Step st;
  if (!o.checkpoint.empty()) {  // the checkpoint's files and shape first: a bad one is refused before the scenario
    st.ck = std::make_shared<const Checkpoint>(o.checkpoint);
    st.shape = checkpoint_shape(*st.ck, o.preset, o.tp, o.layer);
    st.cfg = st.shape.cfg;
  } else {
    if (o.preset.empty()) throw std::invalid_argument("--preset is required (or --inputs, or --checkpoint DIR with config.json)");
    st.cfg = preset(o.preset, o.tp);
  }
  if (!o.variant.empty()) st.cfg.variant = parse_variant(o.variant), st.cfg.validate();
  if (!o.scenario.empty()) st.scn = scenario_from_json(read_input_text(o.scenario, "scenario file"), "scenario " + o.scenario);
  apply_scenario_options(o, st.scn);
  const std::string where = o.scenario.empty()        ? std::string("scenario")
                            : o.any_scenario_option() ? "scenario " + o.scenario + " with the scenario options"
                                                      : "scenario " + o.scenario;
  validate_scenario(st.scn, st.cfg, where);  // before apply_scenario: its messages name the scenario's keys
  apply_scenario(st.scn, st.cfg);
  st.scenario_json = scenario_to_json(st.scn);
  return st;
}

// A count of the experts prepared so far (the total is known only once the model routes),
// drawn from the threads that prepare them; after close() it draws no more (the golden writer
// prepares experts again, past the source's cache).
class ExpertProgress {
 public:
  ExpertProgress(std::string label, bool force) : bar_(std::move(label), force, "(rank, expert) shards") {}
  void built(uint64_t n) {
    uint64_t seen = n_.load();  // keep the largest count seen: threads report out of order
    while (n > seen && !n_.compare_exchange_weak(seen, n)) {
    }
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);  // a thread drawing already: skip this redraw
    if (lock.owns_lock() && open_) bar_.count(n);
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_ && n_.load() > 0) bar_.count(n_.load(), true);
    open_ = false;
    bar_.finish();
  }

 private:
  Progress bar_;
  std::mutex mu_;
  std::atomic<uint64_t> n_{0};
  bool open_ = true;
};

// The weights, the inputs, the model, the file; the timings printed.
int write_step_golden(const GoldenOpt& o, Step& st, std::chrono::steady_clock::time_point t0) {
  const bool from_scenario = o.inputs.empty();
  const auto tw = std::chrono::steady_clock::now();
  std::string weight_prep;
  // the checkpoint's experts are prepared as run_step first routes to them, from its worker
  // threads: their line is drawn from there and closed after run_step (declared before the
  // weights, whose expert source keeps the callback)
  ExpertProgress experts_bar("load layer " + std::to_string(st.shape.layer) + " experts", o.progress);
  LayerWeights w;
  const prep::MxScale mx = prep::mx_scale_from(o.mx_scale);
  if (st.ck) weight_prep = plan_layer(*st.ck, st.cfg, st.shape.layer, mx).prep_json;  // headers only: a bad tensor first
  golden::WeightsSource src;
  src.weights = o.checkpoint.empty() ? "synthetic" : "checkpoint " + o.checkpoint;
  src.weight_seed = o.checkpoint.empty() ? o.weight_seed : 0;
  src.weight_prep = weight_prep;
  src.weight_layer = st.ck ? st.shape.layer : -1;
  std::string wf_hash;
  bool reused = false;
  if (!o.weights_file.empty()) {
    const Injections& x = st.scn.inject;
    golden::refuse_weights_file(st.cfg, from_scenario && (x.special_weights || !x.nan_weight.empty()), "--weights-file");
    if (std::filesystem::exists(o.weights_file)) {  // reused: its weights, checked whole first
      const golden::WeightsFile wf(o.weights_file);
      wf.require_matches(st.cfg, src);
      wf.verify();
      w = wf.weights(st.cfg);
      wf_hash = wf.hash();
      reused = true;
    }
  }
  if (!reused) {
    if (st.ck) {
      Progress lbar("load layer " + std::to_string(st.shape.layer) + " o_proj", o.progress, "rows");
      w = load_checkpoint_layer(st.ck, st.cfg, st.shape.layer, mx, [&](uint64_t d, uint64_t t) { lbar.update(d, t); },
                                [&experts_bar](uint64_t n) { experts_bar.built(n); });
      lbar.finish();
    } else {
      w = synth::synthetic_layer(st.cfg, o.weight_seed);
    }
    if (!o.weights_file.empty()) {
      Progress wbar("weights file", o.progress);
      wf_hash = golden::write_weights_file(o.weights_file, w, src, [&](uint64_t d, uint64_t t) { wbar.update(d, t); });
      wbar.finish();
    }
  }
  if (from_scenario) apply_weight_injections(w, st.scn);
  const double t_weights = since(tw);
  if (from_scenario) st.in = make_inputs(st.cfg, st.scn, o.seed, &w);
  const auto tr = std::chrono::steady_clock::now();
  const StepResult res = run_step(w, st.in);
  experts_bar.close();
  const double t_run = since(tr);
  golden::GoldenMeta meta;
  meta.scenario_json = st.scenario_json;
  meta.weight_seed = o.checkpoint.empty() ? o.weight_seed : 0;
  meta.input_seed = from_scenario ? o.seed : 0;
  meta.weights = o.checkpoint.empty() ? "synthetic" : "checkpoint " + o.checkpoint;
  if (st.ck) meta.weight_prep = weight_prep, meta.weight_layer = st.shape.layer;
  meta.kv_form = o.kv_form;
  meta.weights_file = o.weights_file;
  meta.weights_file_hash = wf_hash;
  golden::WriteOptions wo;
  wo.overwrite = o.force;
  Progress bar("golden", o.progress);
  wo.progress = [&](uint64_t d, uint64_t t) { bar.update(d, t); };
  const auto tg = std::chrono::steady_clock::now();
  golden::write_golden(o.out, w, st.in, res, meta, wo);
  bar.finish();
  const double t_write = since(tg);
  const uint64_t bytes = std::filesystem::file_size(o.out);
  std::printf("wrote %s: %s tp %d, S %d, %llu bytes (%.1f MB); weights %.2f s, run_step %.2f s, write %.2f s, total %.2f s\n",
              o.out.c_str(), st.cfg.name.c_str(), st.cfg.tp, st.in.shared.tokens, (unsigned long long)bytes,
              double(bytes) / 1e6, t_weights, t_run, t_write, since(t0));
  if (!o.weights_file.empty())
    std::printf("weights in %s (%s, hash %s, %llu bytes)\n", o.weights_file.c_str(), reused ? "reused" : "written",
                wf_hash.c_str(), (unsigned long long)std::filesystem::file_size(o.weights_file));
  return 0;
}

}  // namespace

Run add_golden(CLI::App& app) {
  auto o = std::make_shared<GoldenOpt>();
  app.add_option("--checkpoint", o->checkpoint,
                 "release directory (config.json, index, shards), safetensors directory or file (default: the synthetic layer)");
  app.add_option("--layer", o->layer, "layer of the checkpoint (default: the first K4 layer of its config.json, else 0)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--mx-scale", o->mx_scale,
                 "MXFP4 scale rule for BF16 experts: even (Quark's, the MXFP4 release; default) or floor (OCP)")
      ->check(CLI::IsMember({"even", "floor"}));
  app.add_option("--preset", o->preset,
                 "config preset (minimax-m3-tp4, small, tiny); optional with --inputs and with a checkpoint's config.json "
                 "(then it must agree)");
  app.add_option("--variant", o->variant,
                 "the build's numerics: seed (default), vllm-mono, aiter, atom, and/or SWITCH=VALUE items, comma-separated "
                 "(listed below)");
  app.add_option("--tp", o->tp, "tensor-parallel ranks (default: the preset's)");
  app.add_option("--seed", o->seed, "input seed (default 1)")->check(non_negative_integer());
  app.add_option("--weight-seed", o->weight_seed, "synthetic weight seed (default 1; ignored with --checkpoint)")
      ->check(non_negative_integer());
  app.add_option("--scenario", o->scenario, "scenario JSON file (docs/golden-format.md, 'Scenarios')");
  app.add_option("--inputs", o->inputs, "captured inputs file (K4INPUTS, or a golden's inputs) instead of a scenario");
  add_scenario_options(app, *o);
  app.add_option("--kv-form", o->kv_form, "KV pages stored: whole, selected or auto (default: whole up to 8 MiB a rank)")
      ->check(CLI::IsMember({"whole", "selected", "auto"}));
  app.add_option("--threads", o->threads, "OpenMP threads, 1..1024 (default: OMP_NUM_THREADS / all); the bits never depend on it")
      ->check(CLI::Range(1, 1024));
  app.add_option("--weights-file", o->weights_file,
                 "layer weights file: written when absent, else reused (the same weights); the golden then refers to its "
                 "o_proj and expert weights (with their hash) instead of holding them");
  app.add_option("--out", o->out, "output golden .h5")->required();
  app.add_flag("--force", o->force, "overwrite an existing output");
  app.add_flag("--progress", o->progress, "show progress even when stderr is not a terminal");
  app.footer(variants_help() + "\nExample: k4 golden --preset tiny --tokens 4 --context 1000 --out /tmp/x.h5");
  return [o]() {
    const auto t0 = std::chrono::steady_clock::now();
    if (o->threads > 0) omp_set_num_threads(o->threads);
    check_output(o->out, o->force);  // refused before minutes of work, not after
    Step st = o->inputs.empty() ? step_from_scenario(*o) : step_from_inputs_file(*o);
    return write_step_golden(*o, st, t0);
  };
}

}  // namespace k4::tools
