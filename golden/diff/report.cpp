// report.cpp -- a DiffReport as text (k4 diff's output) and as JSON (--json).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

#include "golden/diff/compare.hpp"

namespace k4::golden {
namespace {

std::string pad(std::string s, size_t n) {
  if (s.size() < n) s.append(n - s.size(), ' ');
  return s;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string shape_text(const TensorDiff& t) {
  std::string s = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? "," : "") + std::to_string(t.shape[i]);
  return s + ")";
}

// "ulp 1 .. 2^15, most 8-15 (459)": the range of the histogram and its largest bucket.
std::string hist_text(const TensorDiff& t) {
  int lo = -1, hi = -1, mode = -1;
  for (int k = 0; k < kHistBuckets; ++k) {
    if (!t.hist[size_t(k)]) continue;
    if (lo < 0) lo = k;
    hi = k;
    if (mode < 0 || t.hist[size_t(k)] > t.hist[size_t(mode)]) mode = k;
  }
  std::vector<std::string> parts;
  if (lo >= 0) {
    std::string r = (is_float(t.dtype) ? "ulp " : "|delta| ") + hist_label(lo);
    if (hi > lo) r += " .. " + hist_label(hi) + ", most " + hist_label(mode) + " (" + std::to_string(t.hist[size_t(mode)]) + ")";
    parts.push_back(r);
  }
  if (t.nan_vs_number) parts.push_back("NaN vs number " + std::to_string(t.nan_vs_number));
  if (t.nan_vs_nan) parts.push_back("NaN bits differ " + std::to_string(t.nan_vs_nan));
  return join(parts, "; ");
}

// "o 1 of 65536, m 2 of 256"
std::string stage_cell(const StageDiff& s) {
  if (s.status == StageDiff::Status::Missing) return "not in the dump";
  std::vector<std::string> bad;
  size_t missing = 0;
  for (const TensorDiff& t : s.tensors) {
    if (t.status == TensorDiff::Status::Mismatch) bad.push_back(t.name + " " + std::to_string(t.mismatches) + "/" + std::to_string(t.elements));
    else if (t.status == TensorDiff::Status::ShapeDiffers || t.status == TensorDiff::Status::DtypeDiffers)
      bad.push_back(t.name + " " + status_name(t.status));
    else if (t.status == TensorDiff::Status::Missing) ++missing;
  }
  std::string s1;
  if (bad.empty()) s1 = "match";
  else if (bad.size() <= 3) s1 = "MISMATCH " + join(bad);
  else s1 = "MISMATCH " + bad[0] + ", " + bad[1] + ", " + bad[2] + " +" + std::to_string(bad.size() - 3) + " more";
  if (missing) s1 += " (" + std::to_string(missing) + " missing)";
  return s1;
}

void mismatch_lines(std::string& o, const TensorDiff& t, const char* ref_name, size_t max_list) {
  o += "    " + pad("index", 34) + pad(ref_name, 26) + pad("dump", 26) + "distance\n";
  for (const Mismatch& m : t.first)
    o += "    " + pad(index_text(m.index, t.dims), 34) + pad(bits_hex(t.dtype, m.ref) + " " + value_text(t.dtype, m.ref), 26) +
         pad(bits_hex(t.dtype, m.got) + " " + value_text(t.dtype, m.got), 26) + m.dist.str() + "\n";
  if (t.mismatches > t.first.size())
    o += "    ... " + std::to_string(t.mismatches - t.first.size()) + " more (--max " + std::to_string(max_list) + ")\n";
}

std::string tensor_head(const std::string& where, const TensorDiff& t) {
  return where + t.group + "/" + t.name + "  " + dtype_name(t.dtype) + " [" + join(t.dims, ",") + "] " + shape_text(t) + ": " +
         std::to_string(t.mismatches) + " of " + std::to_string(t.elements) + " differ; " + hist_text(t) + "\n";
}

std::string rank_label(int r) { return r < 0 ? std::string("shared ") : "rank " + std::to_string(r) + " "; }

}  // namespace

std::string report_text(const DiffReport& rep, bool all) {
  std::string o;
  o += "k4 diff: golden " + rep.golden + "\n         dump   " + rep.dump + "\n";
  o += "config " + rep.config_name + ", tp " + std::to_string(rep.tp) + ", S " + std::to_string(rep.tokens) + "; " +
       std::to_string(rep.tensors_compared) + " tensors compared\n\n";
  o += pad("stage", 8) + pad("rank", 6) + (rep.replayed ? pad("dump vs golden", 52) + "replay on the dump's inputs" : "dump vs golden") + "\n";
  if (!rep.shared.empty()) {
    std::vector<std::string> bad;
    for (const TensorDiff& t : rep.shared)
      if (t.status != TensorDiff::Status::Match) bad.push_back(t.name + " " + status_name(t.status));
    o += pad("inputs", 8) + pad("-", 6) +
         (bad.empty() ? "match (" + std::to_string(rep.shared.size()) + " shared inputs)" : "MISMATCH " + join(bad)) + "\n";
  }
  for (const StageDiff& s : rep.stages) {
    std::string cell = stage_cell(s);
    if (cell.size() > 50) cell = cell.substr(0, 47) + "...";
    o += pad(s.stage, 8) + pad(std::to_string(s.rank), 6) + (rep.replayed ? pad(cell, 52) + verdict_text(s.replay.verdict) : cell) + "\n";
  }
  o += "\n";
  if (rep.first.found)
    o += "first divergence: " + (rep.first.rank < 0 ? std::string("shared inputs") : "rank " + std::to_string(rep.first.rank)) +
         ", stage " + rep.first.stage + ", tensor " + rep.first.tensor +
         ", element " + index_text(rep.first.index, rep.first.dims) + " (flat " + std::to_string(rep.first.flat) + ")\n\n";
  else if (!rep.any_mismatch())
    o += "no divergence: every tensor compared matches bit for bit\n\n";
  bool header = false, downstream = false;
  auto each = [&](int rank, const std::string& stage, const TensorDiff& t) {
    if (t.status != TensorDiff::Status::Mismatch) return;
    const bool detail = all || (rep.first.found && stage == rep.first.stage);
    if (!detail && !downstream) {
      o += std::string(header ? "\n" : "") + "downstream of the first divergence (k4 diff --all lists their mismatches):\n";
      downstream = header = true;
    }
    if (!header) o += "mismatches (the first " + std::to_string(rep.max_list) + " a tensor):\n";
    header = true;
    o += tensor_head(rank_label(rank), t);
    if (detail) mismatch_lines(o, t, "golden", rep.max_list);
  };
  for (const TensorDiff& t : rep.shared) each(-1, "inputs", t);
  for (const StageDiff& s : rep.stages)
    for (const TensorDiff& t : s.tensors) each(s.rank, s.stage, t);
  if (header) o += "\n";
  if (rep.replayed) {
    o += "replay (each stage's reference function on the dump's own inputs, compared with the dump's outputs):\n";
    for (const StageDiff& s : rep.stages) {
      if (s.replay.verdict == Verdict::Match || s.status == StageDiff::Status::Missing) continue;
      o += rank_label(s.rank) + s.stage + ": " + s.replay.text + "\n";
      if (s.replay.verdict != Verdict::Own) continue;
      for (const ReplayStep& st : s.replay.steps)
        for (const TensorDiff& t : st.outputs) {
          if (t.status != TensorDiff::Status::Mismatch) continue;
          o += "  step " + st.name + " on " + join(st.inputs) + "\n  ";
          o += tensor_head("replay vs dump: ", t);
          mismatch_lines(o, t, "replay", rep.max_list);
        }
    }
    o += "\n";
  }
  if (!rep.not_compared.empty()) {
    o += "not compared (" + std::to_string(rep.not_compared.size()) + "):\n";
    size_t n = 0;
    for (const NotCompared& nc : rep.not_compared) {
      if (++n > 40) {
        o += "  ... " + std::to_string(rep.not_compared.size() - 40) + " more (see --json)\n";
        break;
      }
      o += "  " + rank_label(nc.rank) + nc.stage + (nc.tensor.empty() ? "" : " " + nc.tensor) + ": " + nc.why + "\n";
    }
    o += "\n";
  }
  const int rc = rep.exit_code();
  o += std::string("result: ") + (rc == 0 ? "MATCH" : "MISMATCH");
  if (rep.first.found) o += " (first divergence: " + rank_label(rep.first.rank) + rep.first.stage + "/" + rep.first.tensor + ")";
  o += "\n";
  return o;
}

// ---- JSON ------------------------------------------------------------------------------

namespace {

using J = nlohmann::ordered_json;

J value_json(DType d, uint32_t bits) {
  J v;
  v["bits"] = bits_hex(d, bits);
  const double x = value_of(d, bits);
  if (d == DType::E2M1X2) v["value"] = value_text(d, bits);
  else if (std::isfinite(x)) v["value"] = x;
  else v["value"] = value_text(d, bits);
  return v;
}

J tensor_json(const TensorDiff& t, const char* ref_name) {
  J j;
  j["name"] = t.name;
  j["group"] = t.group;
  j["path"] = t.path;
  j["status"] = status_name(t.status);
  if (!t.why.empty()) j["why"] = t.why;
  j["dtype"] = dtype_name(t.dtype);
  j["dims"] = t.dims;
  j["shape"] = t.shape;
  j["elements"] = t.elements;
  j["mismatches"] = t.mismatches;
  if (t.status != TensorDiff::Status::Mismatch) return j;
  J first = J::array();
  for (const Mismatch& m : t.first) {
    J e;
    e["index"] = m.index;
    J coords = J::object();
    for (size_t k = 0; k < m.index.size() && k < t.dims.size(); ++k) coords[t.dims[k]] = m.index[k];
    e["coords"] = coords;
    e["flat"] = m.flat;
    e[ref_name] = value_json(t.dtype, m.ref);
    e["dump"] = value_json(t.dtype, m.got);
    if (m.dist.kind == Distance::Kind::Ulp) e["ulp"] = m.dist.n;
    else if (m.dist.kind == Distance::Kind::Int) e["delta"] = m.dist.n;
    else e["ulp"] = nullptr;
    e["distance"] = m.dist.str();
    first.push_back(e);
  }
  j["first"] = first;
  J h = J::object();
  for (int k = 0; k < kHistBuckets; ++k)
    if (t.hist[size_t(k)]) h[hist_label(k)] = t.hist[size_t(k)];
  if (t.nan_vs_number) h["nan_vs_number"] = t.nan_vs_number;
  if (t.nan_vs_nan) h["nan_vs_nan"] = t.nan_vs_nan;
  j[is_float(t.dtype) ? "ulp_histogram" : "delta_histogram"] = h;
  return j;
}

J replay_json(const StageReplay& rp) {
  J j;
  j["verdict"] = verdict_text(rp.verdict);
  j["text"] = rp.text;
  J steps = J::array();
  for (const ReplayStep& st : rp.steps) {
    J s;
    s["name"] = st.name;
    s["inputs"] = st.inputs;
    s["inputs_differing_from_golden"] = st.differing;
    s["recomputed"] = st.recomputed;
    if (!st.not_replayed.empty()) s["not_replayed"] = st.not_replayed;
    J outs = J::array();
    for (const TensorDiff& t : st.outputs) outs.push_back(tensor_json(t, "replay"));
    s["outputs"] = outs;
    steps.push_back(s);
  }
  j["steps"] = steps;
  return j;
}

}  // namespace

std::string report_json(const DiffReport& rep) {
  J j;
  j["golden"] = rep.golden;
  j["dump"] = rep.dump;
  j["config"] = rep.config_name;
  j["tp"] = rep.tp;
  j["tokens"] = rep.tokens;
  j["result"] = rep.exit_code() == 0 ? "match" : "mismatch";
  j["exit_code"] = rep.exit_code();
  j["tensors_compared"] = rep.tensors_compared;
  j["replayed"] = rep.replayed;
  if (rep.first.found) {
    J f;
    f["rank"] = rep.first.rank < 0 ? J(nullptr) : J(rep.first.rank);
    f["stage"] = rep.first.stage;
    f["tensor"] = rep.first.tensor;
    f["index"] = rep.first.index;
    f["dims"] = rep.first.dims;
    f["flat"] = rep.first.flat;
    j["first_divergence"] = f;
  } else {
    j["first_divergence"] = nullptr;
  }
  J shared = J::array();
  for (const TensorDiff& t : rep.shared) shared.push_back(tensor_json(t, "golden"));
  j["shared_inputs"] = shared;
  J stages = J::array();
  for (const StageDiff& s : rep.stages) {
    J e;
    e["stage"] = s.stage;
    e["rank"] = s.rank;
    e["status"] = stage_status_name(s.status);
    if (!s.why.empty()) e["why"] = s.why;
    e["mismatches"] = s.mismatches();
    J ts = J::array();
    for (const TensorDiff& t : s.tensors) ts.push_back(tensor_json(t, "golden"));
    e["tensors"] = ts;
    if (rep.replayed) e["replay"] = replay_json(s.replay);
    stages.push_back(e);
  }
  j["stages"] = stages;
  J nc = J::array();
  for (const NotCompared& n : rep.not_compared) {
    J e;
    e["rank"] = n.rank < 0 ? J(nullptr) : J(n.rank);
    e["stage"] = n.stage;
    e["tensor"] = n.tensor;
    e["why"] = n.why;
    nc.push_back(e);
  }
  j["not_compared"] = nc;
  // replace: a dump's own strings (a soft link's target, an attribute) need not be UTF-8 (found by fuzzing)
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace k4::golden
