// report_html.cpp -- the HTML diff report (report_html.hpp).
#include "tools/report_html.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>

namespace k4::tools {
namespace {

using golden::DiffReport;
using golden::StageDiff;
using golden::TensorDiff;
using golden::Verdict;

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// The 2-D view of a tensor: element (flat) -> (row, col).
struct Fold {
  uint64_t rows = 1, cols = 1;
  uint64_t band = 0;      // rows a value of the first dimension spans (0: no bands)
  std::string row_label, col_label, band_dim;
};

Fold fold_of(const TensorDiff& t) {
  Fold f;
  const size_t k = t.shape.size();
  auto dim = [&](size_t i) { return i < t.dims.size() ? t.dims[i] : "d" + std::to_string(i); };
  if (k <= 1) {
    const uint64_t n = std::max<uint64_t>(t.elements, 1);
    const std::string d = k ? dim(0) : "element";
    if (n <= 128) {
      f.cols = n;
      f.col_label = d;
      f.row_label = "";
    } else {
      f.cols = std::min<uint64_t>(256, uint64_t(std::ceil(std::sqrt(double(n) * 4))));
      f.rows = (n + f.cols - 1) / f.cols;
      f.col_label = d + " mod " + std::to_string(f.cols);
      f.row_label = d + " / " + std::to_string(f.cols);
    }
    return f;
  }
  f.cols = t.shape[k - 1];
  f.col_label = dim(k - 1);
  std::vector<std::string> lead;
  for (size_t i = 0; i + 1 < k; ++i) {
    f.rows *= t.shape[i];
    lead.push_back(dim(i));
  }
  f.row_label = join(lead, "\xC2\xB7");  // middle dot
  if (k >= 3) {
    f.band = f.rows / std::max<uint64_t>(t.shape[0], 1);
    f.band_dim = dim(0);
  }
  return f;
}

// A colour from light orange (few) to dark red (all of the cell).
std::string heat(double x) {
  x = std::clamp(x, 0.0, 1.0);
  const int r = int(253 + (165 - 253) * x), g = int(174 + (0 - 174) * x), b = int(97 + (38 - 97) * x);
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", r, g, b);
  return buf;
}

std::string map_svg(const TensorDiff& t) {
  const Fold f = fold_of(t);
  const uint64_t cb = std::min<uint64_t>(f.cols, 256), rb = std::min<uint64_t>(f.rows, 160);
  const double W = 960, cw = W / double(cb);
  const double ch = std::clamp(260.0 / double(rb), 2.0, 28.0), H = ch * double(rb);
  const double left = 110, top = 24, bottom = 40;
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> cells;
  for (uint64_t i : t.where) {
    const uint64_t row = i / f.cols, col = i % f.cols;
    cells[{row * rb / f.rows, col * cb / f.cols}]++;
  }
  const double per_cell = double(f.rows) / double(rb) * double(f.cols) / double(cb);
  std::string s;
  s += "<svg class=\"map\" width=\"" + num(left + W + 20) + "\" height=\"" +
       num(top + H + bottom) + "\" role=\"img\">";
  s += "<title>where the mismatches of " + esc(t.name) + " are</title>";
  s += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(W) + "\" height=\"" + num(H) +
       "\" fill=\"#e8ecf4\" stroke=\"#889\"/>";
  for (const auto& [rc, n] : cells) {
    const double x = left + double(rc.second) * cw, y = top + double(rc.first) * ch;
    const double frac = std::log1p(double(n)) / std::log1p(std::max(per_cell, 1.0));
    const uint64_t r0 = rc.first * f.rows / rb, r1 = (rc.first + 1) * f.rows / rb - 1;
    const uint64_t c0 = rc.second * f.cols / cb, c1 = (rc.second + 1) * f.cols / cb - 1;
    s += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(cw, 1.0)) + "\" height=\"" +
         num(std::max(ch, 1.0)) + "\" fill=\"" + heat(0.35 + 0.65 * frac) + "\"><title>rows " + std::to_string(r0) + ".." +
         std::to_string(r1) + ", " + esc(f.col_label) + " " + std::to_string(c0) + ".." + std::to_string(c1) + ": " +
         std::to_string(n) + " mismatching</title></rect>";
  }
  // bands of the first dimension, and its labels
  if (f.band > 0 && f.rows / f.band <= 64) {
    for (uint64_t v = 0; v * f.band < f.rows; ++v) {
      const double y = top + double(v * f.band) * H / double(f.rows);
      if (v) s += "<line x1=\"" + num(left) + "\" x2=\"" + num(left + W) + "\" y1=\"" + num(y) + "\" y2=\"" + num(y) + "\" stroke=\"#556\" stroke-width=\"1\"/>";
      if (f.rows / f.band <= 16)
        s += "<text x=\"" + num(left - 6) + "\" y=\"" + num(y + std::min(12.0, f.band * H / f.rows)) + "\" text-anchor=\"end\">" +
             esc(f.band_dim) + " " + std::to_string(v) + "</text>";
    }
  } else if (f.rows <= 16 && f.rows > 1) {
    for (uint64_t v = 0; v < f.rows; ++v)
      s += "<text x=\"" + num(left - 6) + "\" y=\"" + num(top + (double(v) + 0.5) * H / double(f.rows) + 4) + "\" text-anchor=\"end\">" +
           std::to_string(v) + "</text>";
  }
  // the first mismatch, ringed
  if (!t.first.empty()) {
    const uint64_t i = t.first.front().flat, row = i / f.cols, col = i % f.cols;
    const double x = left + double(col * cb / f.cols) * cw, y = top + double(row * rb / f.rows) * ch;
    s += "<rect x=\"" + num(x - 3) + "\" y=\"" + num(y - 3) + "\" width=\"" + num(std::max(cw, 1.0) + 6) + "\" height=\"" +
         num(std::max(ch, 1.0) + 6) + "\" fill=\"none\" stroke=\"#1f4fd0\" stroke-width=\"2\"><title>first mismatch</title></rect>";
  }
  for (int q = 0; q <= 4; ++q) {
    const uint64_t c = q == 4 ? f.cols - 1 : f.cols * uint64_t(q) / 4;
    const double x = left + (double(c) + 0.5) * W / double(f.cols);
    s += "<text x=\"" + num(x) + "\" y=\"" + num(top + H + 14) + "\" text-anchor=\"middle\">" + std::to_string(c) + "</text>";
  }
  s += "<text x=\"" + num(left + W / 2) + "\" y=\"" + num(top + H + 32) + "\" text-anchor=\"middle\" class=\"axis\">" +
       esc(f.col_label) + " (" + std::to_string(f.cols) + ")</text>";
  s += "<text x=\"" + num(left) + "\" y=\"" + num(top - 8) + "\" class=\"axis\">" +
       esc(f.row_label.empty() ? std::string("") : f.row_label + " (" + std::to_string(f.rows) + ") down") + "</text>";
  s += "</svg>";
  return s;
}

std::string hist_svg(const TensorDiff& t) {
  std::vector<std::pair<std::string, uint64_t>> bars;
  int lo = golden::kHistBuckets, hi = -1;
  for (int k = 0; k < golden::kHistBuckets; ++k)
    if (t.hist[size_t(k)]) lo = std::min(lo, k), hi = std::max(hi, k);
  for (int k = lo; k <= hi; ++k) bars.push_back({golden::hist_label(k), t.hist[size_t(k)]});
  if (t.nan_vs_number) bars.push_back({"NaN/num", t.nan_vs_number});
  if (t.nan_vs_nan) bars.push_back({"NaN bits", t.nan_vs_nan});
  uint64_t mx = 1;
  for (const auto& b : bars) mx = std::max(mx, b.second);
  const double bw = std::clamp(600.0 / std::max<size_t>(bars.size(), 1), 14.0, 60.0), H = 120, left = 40, top = 18;
  const double W = std::max(bw * double(bars.size()), 300.0);  // room for the axis label
  std::string s = "<svg class=\"hist\" width=\"" + num(left + W + 20) + "\" height=\"" +
                  num(top + H + 46) + "\" role=\"img\"><title>" + std::string(golden::is_float(t.dtype) ? "ULP" : "|delta|") +
                  " histogram of " + esc(t.name) + "</title>";
  s += "<line x1=\"" + num(left) + "\" x2=\"" + num(left + W) + "\" y1=\"" + num(top + H) + "\" y2=\"" + num(top + H) + "\" stroke=\"#333\"/>";
  for (size_t i = 0; i < bars.size(); ++i) {
    const double h = std::max(2.0, H * double(bars[i].second) / double(mx));
    const double x = left + double(i) * bw;
    s += "<rect x=\"" + num(x + 2) + "\" y=\"" + num(top + H - h) + "\" width=\"" + num(bw - 4) + "\" height=\"" + num(h) +
         "\" fill=\"#c0392b\"><title>" + esc(bars[i].first) + ": " + std::to_string(bars[i].second) + "</title></rect>";
    s += "<text x=\"" + num(x + bw / 2) + "\" y=\"" + num(top + H - h - 3) + "\" text-anchor=\"middle\">" +
         std::to_string(bars[i].second) + "</text>";
    s += "<text x=\"" + num(x + bw / 2) + "\" y=\"" + num(top + H + 13) + "\" text-anchor=\"middle\" class=\"small\">" +
         esc(bars[i].first) + "</text>";
  }
  s += "<text x=\"" + num(left) + "\" y=\"" + num(top + H + 34) + "\" class=\"axis\">" +
       std::string(golden::is_float(t.dtype) ? "ULP distance (ordered-integer)" : "|integer difference|") +
       "; 2^k: [2^k, 2^(k+1))</text>";
  s += "</svg>";
  return s;
}

std::string mismatch_table(const TensorDiff& t, const char* ref_name, size_t max_list) {
  std::string s = "<table class=\"mm\"><tr><th>index</th><th>" + std::string(ref_name) + " bits</th><th>" + ref_name +
                  " value</th><th>dump bits</th><th>dump value</th><th>distance</th></tr>";
  for (const golden::Mismatch& m : t.first)
    s += "<tr><td>" + esc(golden::index_text(m.index, t.dims)) + "</td><td class=\"mono\">" + golden::bits_hex(t.dtype, m.ref) +
         "</td><td>" + esc(golden::value_text(t.dtype, m.ref)) + "</td><td class=\"mono\">" + golden::bits_hex(t.dtype, m.got) +
         "</td><td>" + esc(golden::value_text(t.dtype, m.got)) + "</td><td>" + esc(m.dist.str()) + "</td></tr>";
  s += "</table>";
  if (t.mismatches > t.first.size())
    s += "<p class=\"small\">" + std::to_string(t.mismatches - t.first.size()) + " more (k4 diff --max " +
         std::to_string(max_list) + " lists the first " + std::to_string(max_list) + ")</p>";
  return s;
}

std::string tensor_section(const std::string& title, const TensorDiff& t, const char* ref_name, size_t max_list,
                           const std::string& id) {
  std::string shape;
  for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? "\xC3\x97" : "") + std::to_string(t.shape[i]);
  std::string s = "<section class=\"tensor\" id=\"" + id + "\"><h3>" + esc(title) + "</h3>";
  s += "<p>" + std::string(golden::dtype_name(t.dtype)) + " [" + esc(join(t.dims, ", ")) + "] " + shape + ": <b>" +
       std::to_string(t.mismatches) + "</b> of " + std::to_string(t.elements) + " elements differ" +
       (t.where_capped ? " (map: the first " + std::to_string(t.where.size()) + ")" : "") + "</p>";
  s += "<div class=\"figs\"><div>" + map_svg(t) + "</div><div>" + hist_svg(t) + "</div></div>";
  s += mismatch_table(t, ref_name, max_list) + "</section>\n";
  return s;
}

std::string cell_class(const StageDiff& s) {
  switch (s.status) {
    case StageDiff::Status::Match: return "ok";
    case StageDiff::Status::Mismatch: return "bad";
    case StageDiff::Status::Incomplete: return "part";
    case StageDiff::Status::Missing: return "none";
  }
  return "";
}

std::string summary_table(const DiffReport& rep) {
  std::string s = "<table class=\"sum\"><tr><th>stage</th>";
  for (int r = 0; r < rep.tp; ++r) s += "<th>rank " + std::to_string(r) + "</th>";
  s += "</tr>";
  for (const std::string& st : golden::stage_names()) {
    s += "<tr><th>" + st + "</th>";
    for (const StageDiff& sd : rep.stages) {
      if (sd.stage != st) continue;
      std::string body;
      if (sd.status == StageDiff::Status::Missing) {
        body = "not in the dump";
      } else {
        std::vector<std::string> bad;
        for (const TensorDiff& t : sd.tensors)
          if (t.status == TensorDiff::Status::Mismatch)
            bad.push_back("<a href=\"#t-" + std::to_string(sd.rank) + "-" + st + "-" + t.name + "\">" + esc(t.name) + "</a> " +
                          std::to_string(t.mismatches));
          else if (!t.compared())
            bad.push_back(esc(t.name) + " " + golden::status_name(t.status));
        body = bad.empty() ? "match" : join(bad, ", ");
      }
      std::string verdict;
      if (rep.replayed && sd.replay.verdict != Verdict::None && sd.replay.verdict != Verdict::Match) {
        const char* cls = sd.replay.verdict == Verdict::Own ? "own" : sd.replay.verdict == Verdict::Inherited ? "inh" : "nr";
        verdict = "<div class=\"verdict " + std::string(cls) + "\" title=\"" + esc(sd.replay.text) + "\">" +
                  golden::verdict_text(sd.replay.verdict) + "</div>";
      }
      s += "<td class=\"" + cell_class(sd) + "\">" + body + verdict + "</td>";
    }
    s += "</tr>";
  }
  return s + "</table>";
}

const char* kStyle = R"(
body{font-family:'DejaVu Sans',Arial,sans-serif;margin:18px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 6px} h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #ccd}
h3{font-size:15px;margin:16px 0 4px} p{margin:4px 0} .small{font-size:11px;color:#555}
.mono,td.mono{font-family:'DejaVu Sans Mono',monospace}
.badge{display:inline-block;padding:3px 10px;border-radius:4px;color:#fff;font-weight:bold}
.badge.ok{background:#2e8b57} .badge.bad{background:#c0392b}
.first{background:#fff4e0;border:1px solid #e0b060;padding:8px 12px;margin:10px 0;border-radius:4px}
table{border-collapse:collapse;font-size:12px}
table.sum td,table.sum th{border:1px solid #bbc;padding:5px 8px;text-align:left;vertical-align:top;min-width:110px}
td.ok{background:#dff3e4} td.bad{background:#f8d7d3} td.part{background:#fdf2c8} td.none{background:#eceef2;color:#777}
.verdict{margin-top:4px;font-weight:bold;font-size:11px} .verdict.own{color:#a50026} .verdict.inh{color:#8a5a00} .verdict.nr{color:#666;font-weight:normal}
table.mm td,table.mm th{border:1px solid #dde;padding:2px 6px}
.figs{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-start}
svg text{font-size:11px;fill:#333} svg text.axis{font-size:12px;fill:#111} svg text.small{font-size:9px}
section.tensor{border-top:1px dashed #ccd;padding-top:4px}
)";

}  // namespace

std::string html_report(const DiffReport& rep) {
  const bool ok = rep.exit_code() == 0;
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>k4 diff: " + esc(rep.dump) +
                  "</title><style>" + kStyle + "</style></head><body>\n";
  h += "<h1>k4 diff <span class=\"badge " + std::string(ok ? "ok" : "bad") + "\">" + (ok ? "MATCH" : "MISMATCH") + "</span></h1>";
  h += "<p>golden <span class=\"mono\">" + esc(rep.golden) + "</span><br>dump <span class=\"mono\">" + esc(rep.dump) + "</span></p>";
  h += "<p>config " + esc(rep.config_name) + ", tp " + std::to_string(rep.tp) + ", S " + std::to_string(rep.tokens) + "; " +
       std::to_string(rep.tensors_compared) + " tensors compared" + (rep.replayed ? "; replayed" : "") + "</p>";
  if (rep.first.found)
    h += "<div class=\"first\"><b>first divergence</b>: " + (rep.first.rank < 0 ? std::string("shared inputs") : "rank " + std::to_string(rep.first.rank)) +
         ", stage <b>" + esc(rep.first.stage) + "</b>, tensor <b>" + esc(rep.first.tensor) + "</b>, element " +
         esc(golden::index_text(rep.first.index, rep.first.dims)) + "</div>";
  h += "<h2>Stages</h2>" + summary_table(rep);
  h += "<h2>Mismatching tensors</h2>";
  size_t shown = 0;
  for (const TensorDiff& t : rep.shared)
    if (t.status == TensorDiff::Status::Mismatch && shown++ < 40)
      h += tensor_section("shared " + t.group + "/" + t.name, t, "golden", rep.max_list, "t-shared-" + t.name);
  for (const StageDiff& s : rep.stages)
    for (const TensorDiff& t : s.tensors)
      if (t.status == TensorDiff::Status::Mismatch && shown++ < 40)
        h += tensor_section("rank " + std::to_string(s.rank) + " " + t.group + "/" + t.name + " (dump vs golden)", t, "golden",
                            rep.max_list, "t-" + std::to_string(s.rank) + "-" + s.stage + "-" + t.name);
  if (shown > 40) h += "<p>" + std::to_string(shown - 40) + " more mismatching tensors (see k4 diff --json)</p>";
  if (shown == 0) h += "<p>none</p>";
  if (rep.replayed) {
    for (const StageDiff& s : rep.stages) {
      if (s.replay.verdict != Verdict::Own) continue;
      for (const golden::ReplayStep& st : s.replay.steps)
        for (const TensorDiff& t : st.outputs)
          if (t.status == TensorDiff::Status::Mismatch)
            h += tensor_section("rank " + std::to_string(s.rank) + " " + t.group + "/" + t.name + " (replay " + st.name +
                                    " vs dump: this stage's own error)",
                                t, "replay", rep.max_list, "r-" + std::to_string(s.rank) + "-" + s.stage + "-" + t.name);
    }
  }
  if (rep.replayed) {
    h += "<h2>Replay verdicts</h2><ul>";
    for (const StageDiff& s : rep.stages)
      if (s.replay.verdict == Verdict::Own || s.replay.verdict == Verdict::Inherited)
        h += "<li>rank " + std::to_string(s.rank) + " <b>" + s.stage + "</b>: " + esc(s.replay.text) + "</li>";
    h += "</ul>";
  }
  if (!rep.not_compared.empty()) {
    h += "<h2>Not compared</h2><ul>";
    size_t n = 0;
    for (const golden::NotCompared& nc : rep.not_compared) {
      if (++n > 60) {
        h += "<li>" + std::to_string(rep.not_compared.size() - 60) + " more</li>";
        break;
      }
      h += "<li>" + (nc.rank < 0 ? std::string("shared") : "rank " + std::to_string(nc.rank)) + " " + esc(nc.stage) + " " +
           esc(nc.tensor) + ": " + esc(nc.why) + "</li>";
    }
    h += "</ul>";
  }
  h += "</body></html>\n";
  return h;
}

void write_html_report(const std::string& path, const DiffReport& rep) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot write the HTML report " + path);
  f << html_report(rep);
  f.close();
  if (!f) throw std::runtime_error("writing the HTML report " + path + " failed");
}

}  // namespace k4::tools
