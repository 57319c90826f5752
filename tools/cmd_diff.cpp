// cmd_diff.cpp -- k4 diff GOLDEN DUMP and k4 replay GOLDEN DUMP: a kernel's dump compared
// bit for bit with a golden, stage by stage (golden/diff/compare.hpp), optionally with the
// replay of each stage on the dump's own inputs; text on stdout, --json, --html.
// Exit codes: 0 every tensor compared matches, 1 a mismatch, 2 an unusable input.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "golden/io/atomic_file.hpp"
#include "golden/diff/compare.hpp"
#include "tools/commands.hpp"
#include "tools/report_html.hpp"

namespace k4::tools {
namespace {

struct DiffOpt {
  std::string golden, dump, json, html;
  size_t max = 10;
  bool replay = false, require_all = false, quiet = false, all = false, force = false;
};

// Writes `text` to the output's temporary, then renames it onto the output.
void write_report(AtomicOutput& out, const std::string& text, const char* what) {
  {
    std::ofstream f(out.temp_path(), std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) throw std::runtime_error(std::string("cannot write the ") + what + " report " + out.temp_path());
  }
  count_written(text.size());  // K4_FAIL_AFTER_BYTES (golden/io/atomic_file.hpp)
  out.commit();
}

void options(CLI::App& app, DiffOpt& o, bool replay_flag) {
  app.add_option("GOLDEN", o.golden, "the golden (k4 golden)")->required();
  app.add_option("DUMP", o.dump, "the kernel's dump in the golden schema (any subset of ranks, stages, tensors)")->required();
  app.add_option("--json", o.json, "also write the report as JSON to FILE ('-': stdout, instead of the text)");
  app.add_option("--html", o.html, "also write a self-contained HTML report (maps of the mismatches, ULP histograms)");
  app.add_option("--max", o.max, "mismatches listed a tensor (default 10)")->check(CLI::Range(size_t(0), size_t(1000000)));
  if (replay_flag)
    app.add_flag("--replay", o.replay, "replay each stage on the dump's own inputs: a stage's own fault vs an inherited one");
  app.add_flag("--require-all", o.require_all, "a tensor, stage or rank the dump lacks counts as a mismatch (exit 1)");
  app.add_flag("--all", o.all, "list the first mismatches of every tensor (default: of the first diverging stage)");
  app.add_flag("-q,--quiet", o.quiet, "print only the result line");
  app.add_flag("--force", o.force, "overwrite an existing --json / --html file");
}

int run(const DiffOpt& o) {
  const auto t0 = std::chrono::steady_clock::now();
  // The report files are claimed first: an existing one without --force (or a missing
  // directory) is refused before any work, and a failure leaves neither file nor temporary.
  std::unique_ptr<AtomicOutput> json_out, html_out;
  if (!o.json.empty() && o.json != "-") json_out = std::make_unique<AtomicOutput>(o.json, o.force);
  if (!o.html.empty()) html_out = std::make_unique<AtomicOutput>(o.html, o.force);
  golden::DiffOptions d;
  d.max_list = o.max;
  d.replay = o.replay;
  const golden::DiffReport rep = golden::diff_files(o.golden, o.dump, d);
  const int rc = rep.exit_code(o.require_all);
  const std::string text = golden::report_text(rep, o.all);
  if (o.json == "-") {
    std::fputs(golden::report_json(rep).c_str(), stdout);
  } else {
    if (json_out) write_report(*json_out, golden::report_json(rep), "JSON");
    if (o.quiet) {
      const size_t p = text.rfind("result:");
      std::fputs(text.substr(p == std::string::npos ? 0 : p).c_str(), stdout);
    } else {
      std::fputs(text.c_str(), stdout);
    }
  }
  std::fflush(stdout);
  if (html_out) write_report(*html_out, html_report(rep), "HTML");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "k4 %s: %s in %.2f s%s%s\n", o.replay ? "replay" : "diff", rc == 0 ? "match" : "mismatch", s,
               o.html.empty() ? "" : ", html: ", o.html.c_str());
  return rc;
}

}  // namespace

Run add_diff(CLI::App& app) {
  auto o = std::make_shared<DiffOpt>();
  options(app, *o, true);
  app.footer(
      "Compares every rank's stages in pipeline order (index, split, merge, oproj, router, moe): 'match' or the count of\n"
      "mismatching elements a tensor, the first --max of them (index in named dimensions, bits, values, ULPs), and the\n"
      "first stage that diverges. Exit 0 match, 1 mismatch, 2 unusable input.\n"
      "Example: k4 diff golden.h5 kernel_dump.h5 --replay --html report.html");
  return [o] { return run(*o); };
}

Run add_replay(CLI::App& app) {
  auto o = std::make_shared<DiffOpt>();
  options(app, *o, false);
  o->replay = true;
  app.footer(
      "k4 diff --replay: each stage's reference function on the dump's own upstream tensors (golden weights), compared\n"
      "with the dump's outputs. Replay matches but the golden does not: the stage inherited a bad input; replay does\n"
      "not match: this stage is wrong. Exit 0 match, 1 mismatch, 2 unusable input.\n"
      "Example: k4 replay golden.h5 kernel_dump.h5 --html report.html");
  return [o] { return run(*o); };
}

}  // namespace k4::tools
