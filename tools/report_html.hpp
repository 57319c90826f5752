// report_html.hpp -- a DiffReport as one self-contained HTML page (k4 diff --html): inline
// CSS and SVG only (no script, no network). It holds the summary table (stage x rank, with
// the replay verdict), the first divergence, and for every mismatching tensor a map of
// where its mismatches are over two dimensions (the last dimension across, the leading
// ones folded down; a 1-D tensor folded into rows), the ULP (or |delta|) histogram and the
// first mismatches as bits and values. Stages the replay calls wrong get the map of
// replay-vs-dump mismatches too.
#pragma once
#include <string>

#include "golden/diff/compare.hpp"

namespace k4::tools {

std::string html_report(const golden::DiffReport& rep);
// Writes the page (replacing FILE); throws std::runtime_error when it cannot.
void write_html_report(const std::string& path, const golden::DiffReport& rep);

}  // namespace k4::tools
