// cmd_golden.cpp -- k4 golden: weights (checkpoint or synthetic) + decode inputs (scenario
// or a captured inputs file) -> k4::run_step -> one golden HDF5 file.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "golden/io/atomic_file.hpp"
#include "golden/inputs/checkpoint.hpp"
#include "golden/io/file_check.hpp"
#include "golden/inputs/scenario.hpp"
#include "golden/format/schema.hpp"
#include "golden/inputs/synth.hpp"
#include "reference/model.hpp"
#include "tools/commands.hpp"
#include "tools/progress.hpp"

namespace k4::tools {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int> int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  for (const std::string& t : split_list(s)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.size()) throw std::invalid_argument(std::string(what) + ": '" + t + "' is not an integer");
    out.push_back(v);
  }
  return out;
}

int one_int(const std::string& s, const char* what) {
  const std::vector<int> v = int_list(s, what);
  if (v.size() != 1) throw std::invalid_argument(std::string(what) + ": '" + s + "' is not one integer");
  return v[0];
}

std::string read_text(const std::string& path) {
  require_input_file(path, "scenario file");
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  if (!f && !f.eof()) throw std::invalid_argument("scenario file " + path + ": read failed");
  return ss.str();
}

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

}  // namespace

Run add_golden(CLI::App& app) {
  struct Opt {
    std::string checkpoint, preset, variant, scenario, inputs, out, kv_form = "auto";
    int tp = -1, layer = 0, threads = -1;
    uint64_t seed = 1, weight_seed = 1;
    bool force = false, progress = false;
    // scenario options (override the scenario file)
    int tokens = 0, q_len = 0, kv_page_stride = 0, cache_blocks = 0;
    std::string context, pad_rows, zero_rows, repeated_expert, nan_weight, zero_attn_rows, nan_kv_rows;
    bool static_kv = false, ties = false, extreme_q = false, huge_residual = false, extreme_kv = false;
    bool special_q = false, special_h_in = false, special_kv = false, special_weights = false;
    int nan_scores = -1, neg_zero_scores = -1, inf_scores = -1;
    std::vector<CLI::Option*> scenario_opts;  // given (count() > 0) or not: 0 is a value, not "absent"
    bool given(const char* name) const {
      for (const CLI::Option* op : scenario_opts)
        if (op->check_name(name)) return op->count() > 0;
      throw std::logic_error(std::string("k4 golden: no scenario option ") + name);
    }
  };
  auto o = std::make_shared<Opt>();
  app.add_option("--checkpoint", o->checkpoint, "safetensors file or directory (default: the synthetic layer)");
  app.add_option("--layer", o->layer, "layer index of the checkpoint's tensor names (default 0)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--preset", o->preset, "config preset (minimax-m3-tp4, small, tiny); optional with --inputs");
  app.add_option("--variant", o->variant,
                 "the build's numerics: seed (default), vllm-mono, aiter, atom, and/or SWITCH=VALUE items, comma-separated "
                 "(listed below)");
  app.add_option("--tp", o->tp, "tensor-parallel ranks (default: the preset's)");
  app.add_option("--seed", o->seed, "input seed (default 1)")->check(non_negative_integer());
  app.add_option("--weight-seed", o->weight_seed, "synthetic weight seed (default 1; ignored with --checkpoint)")
      ->check(non_negative_integer());
  app.add_option("--scenario", o->scenario, "scenario JSON file (docs/golden-format.md, 'Scenarios')");
  app.add_option("--inputs", o->inputs, "captured inputs file (K4INPUTS, or a golden's inputs) instead of a scenario");
  auto* g = app.add_option_group("scenario", "scenario options (override --scenario)");
  auto& so = o->scenario_opts;
  so.push_back(g->add_option("--tokens", o->tokens, "decode rows S (1..16)"));
  so.push_back(g->add_option("--q-len", o->q_len, "rows a request (divides S)"));
  so.push_back(g->add_option("--context", o->context,
                "contexts: one, one a request or one a row, comma-separated key counts or short / medium / long / max"));
  so.push_back(g->add_option("--pad-rows", o->pad_rows, "comma-separated rows with seq_len 0"));
  so.push_back(g->add_flag("--static-kv-scale", o->static_kv, "one k / v scale a cache"));
  so.push_back(g->add_option("--kv-page-stride", o->kv_page_stride, "8 or 16"));
  so.push_back(g->add_option("--cache-blocks", o->cache_blocks, "block allocations in the cache at most (default 256)"));
  so.push_back(g->add_flag("--ties", o->ties, "inject index-score ties"));
  so.push_back(g->add_option("--nan-scores", o->nan_scores, "NaN index scores a row"));
  so.push_back(g->add_option("--neg-zero-scores", o->neg_zero_scores, "-0 (and +0) index scores a row"));
  so.push_back(g->add_option("--inf-scores", o->inf_scores, "+-Inf index scores a row"));
  so.push_back(g->add_option("--repeated-expert", o->repeated_expert, "expert id every token routes to, or 'any' (the same picks)"));
  so.push_back(g->add_flag("--extreme-q", o->extreme_q, "q at and beyond the E4M3 range, Inf, NaN, -0"));
  so.push_back(g->add_flag("--huge-residual", o->huge_residual, "h_in rows scaled up to 1e37"));
  so.push_back(g->add_flag("--extreme-kv", o->extreme_kv, "K / V codes at +-448 and subnormals, scales 0 and 1e3"));
  so.push_back(g->add_option("--zero-rows", o->zero_rows, "comma-separated rows of all-zero q, h_in and scores"));
  so.push_back(g->add_flag("--special-q", o->special_q, "q: token 0 NaN / +Inf / 466, every token -0, +-448, 464, +-2^-10"));
  so.push_back(g->add_flag("--special-h-in", o->special_h_in, "h_in: a NaN, +Inf, -Inf element or 64 -0 a row (row % 4)"));
  so.push_back(g->add_flag("--special-kv", o->special_kv, "NaN K / V codes and NaN / Inf scales where no row reads, -0 where rows read"));
  so.push_back(g->add_flag("--special-weights", o->special_weights, "-0, +-Inf and NaN in the weights where their effect is contained"));
  so.push_back(g->add_option("--nan-weight", o->nan_weight, "one NaN in w_o, s_o, g_post or w_gate"));
  so.push_back(g->add_option("--zero-attn-rows", o->zero_attn_rows, "comma-separated rows whose keys get v_scale 0 (attention 0)"));
  so.push_back(g->add_option("--nan-kv-rows", o->nan_kv_rows, "comma-separated rows with a NaN K and a NaN V code at keys they read"));
  app.add_option("--kv-form", o->kv_form, "KV pages stored: whole, selected or auto (default: whole up to 8 MiB a rank)")
      ->check(CLI::IsMember({"whole", "selected", "auto"}));
  app.add_option("--threads", o->threads, "OpenMP threads, 1..1024 (default: OMP_NUM_THREADS / all); the bits never depend on it")
      ->check(CLI::Range(1, 1024));
  app.add_option("--out", o->out, "output golden .h5")->required();
  app.add_flag("--force", o->force, "overwrite an existing output");
  app.add_flag("--progress", o->progress, "show progress even when stderr is not a terminal");
  app.footer(variants_help() + "\nExample: k4 golden --preset tiny --tokens 4 --context 1000 --out /tmp/x.h5");
  return [o]() {
    const auto t0 = std::chrono::steady_clock::now();
    if (o->threads > 0) omp_set_num_threads(o->threads);
    check_output(o->out, o->force);  // refused before minutes of work, not after
    Config cfg;
    Scenario scn;
    StepInputs in;
    std::string scenario_json;
    if (!o->inputs.empty()) {
      if (!o->scenario.empty()) throw std::invalid_argument("--inputs excludes --scenario");
      for (const CLI::Option* op : o->scenario_opts)
        if (op->count() > 0)
          throw std::invalid_argument("--inputs excludes the scenario options (" + op->get_name() + " given)");
      Config file_cfg;
      in = golden::read_inputs_file(o->inputs, &file_cfg);
      if (o->preset.empty() && o->tp != -1 && o->tp != file_cfg.tp)
        throw std::invalid_argument("--tp " + std::to_string(o->tp) + ": inputs file " + o->inputs + " was captured with tp " +
                                    std::to_string(file_cfg.tp));
      if (!o->preset.empty()) {
        Config p = preset(o->preset, o->tp);
        p.variant = file_cfg.variant;
        p.kv_page_stride = file_cfg.kv_page_stride;
        if (golden::config_to_json(p) != golden::config_to_json(file_cfg))
          throw std::invalid_argument("inputs file " + o->inputs + " was captured with config " +
                                      golden::config_to_json(file_cfg) + ", not preset " + o->preset);
      }
      cfg = file_cfg;
      if (!o->variant.empty()) cfg.variant = parse_variant(o->variant), cfg.validate();
      scenario_json = "{\"inputs_file\": \"" + std::filesystem::path(o->inputs).filename().string() + "\"}";
    } else {
      if (o->preset.empty()) throw std::invalid_argument("--preset is required (or --inputs)");
      cfg = preset(o->preset, o->tp);
      if (!o->variant.empty()) cfg.variant = parse_variant(o->variant), cfg.validate();
      if (!o->scenario.empty()) scn = scenario_from_json(read_text(o->scenario), "scenario " + o->scenario);
      if (o->given("--tokens")) scn.tokens = o->tokens;
      if (o->given("--q-len")) scn.q_len = o->q_len;
      if (o->given("--context")) scn.context = split_list(o->context);
      if (o->given("--pad-rows")) scn.pad_rows = int_list(o->pad_rows, "--pad-rows");
      if (o->static_kv) scn.static_kv_scale = 1;
      if (o->given("--kv-page-stride")) scn.kv_page_stride = o->kv_page_stride;
      if (o->given("--cache-blocks")) scn.cache_blocks = o->cache_blocks;
      Injections& x = scn.inject;
      if (o->ties) x.score_ties = true;
      if (o->given("--nan-scores")) x.nan_scores = o->nan_scores;
      if (o->given("--neg-zero-scores")) x.neg_zero_scores = o->neg_zero_scores;
      if (o->given("--inf-scores")) x.inf_scores = o->inf_scores;
      if (o->given("--repeated-expert"))
        x.repeated_expert = o->repeated_expert == "any" ? -2 : one_int(o->repeated_expert, "--repeated-expert");
      if (o->extreme_q) x.extreme_q = true;
      if (o->huge_residual) x.huge_residual = true;
      if (o->extreme_kv) x.extreme_kv = true;
      if (o->given("--zero-rows")) x.zero_rows = int_list(o->zero_rows, "--zero-rows");
      if (o->special_q) x.special_q = true;
      if (o->special_h_in) x.special_h_in = true;
      if (o->special_kv) x.special_kv = true;
      if (o->special_weights) x.special_weights = true;
      if (o->given("--nan-weight")) x.nan_weight = o->nan_weight;
      if (o->given("--zero-attn-rows")) x.zero_attn_rows = int_list(o->zero_attn_rows, "--zero-attn-rows");
      if (o->given("--nan-kv-rows")) x.nan_kv_rows = int_list(o->nan_kv_rows, "--nan-kv-rows");
      bool options = false;
      for (const CLI::Option* op : o->scenario_opts) options = options || op->count() > 0;
      const std::string where = o->scenario.empty() ? std::string("scenario")
                                : options           ? "scenario " + o->scenario + " with the scenario options"
                                                    : "scenario " + o->scenario;
      validate_scenario(scn, cfg, where);  // before apply_scenario: its messages name the scenario's keys
      apply_scenario(scn, cfg);
      scenario_json = scenario_to_json(scn);
    }
    // Weights.
    const auto tw = std::chrono::steady_clock::now();
    LayerWeights w = o->checkpoint.empty() ? synth::synthetic_layer(cfg, o->weight_seed)
                                           : load_checkpoint_layer(o->checkpoint, cfg, o->layer);
    if (o->inputs.empty()) apply_weight_injections(w, scn);
    const double t_weights = since(tw);
    if (o->inputs.empty()) in = make_inputs(cfg, scn, o->seed, &w);
    // The model.
    const auto tr = std::chrono::steady_clock::now();
    const StepResult res = run_step(w, in);
    const double t_run = since(tr);
    // The file.
    golden::GoldenMeta meta;
    meta.scenario_json = scenario_json;
    meta.weight_seed = o->checkpoint.empty() ? o->weight_seed : 0;
    meta.input_seed = o->inputs.empty() ? o->seed : 0;
    meta.weights = o->checkpoint.empty() ? "synthetic" : "checkpoint " + o->checkpoint;
    meta.kv_form = o->kv_form;
    golden::WriteOptions wo;
    wo.overwrite = o->force;
    Progress bar("golden", o->progress);
    wo.progress = [&](uint64_t d, uint64_t t) { bar.update(d, t); };
    const auto tg = std::chrono::steady_clock::now();
    golden::write_golden(o->out, w, in, res, meta, wo);
    bar.finish();
    const double t_write = since(tg);
    const uint64_t bytes = std::filesystem::file_size(o->out);
    std::printf("wrote %s: %s tp %d, S %d, %llu bytes (%.1f MB); weights %.2f s, run_step %.2f s, write %.2f s, total %.2f s\n",
                o->out.c_str(), cfg.name.c_str(), cfg.tp, in.shared.tokens, (unsigned long long)bytes,
                double(bytes) / 1e6, t_weights, t_run, t_write, since(t0));
    return 0;
  };
}

}  // namespace k4::tools
