// main.cpp -- the k4 command: k4 synth | golden | inspect | diff | replay | checkpoint (k4 SUBCOMMAND --help).
//
// The command runs in a child process watched by the crash guard (golden/io/crash_guard.hpp):
// a corrupt HDF5 file that crashes libhdf5 ends in an error naming the file and exit 2.
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "golden/io/crash_guard.hpp"
#include "golden/format/schema.hpp"
#include "tools/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"k4 -- goldens of the MiniMax-M3 K4 reference model (" + k4::golden::tool_version() + ")"};
  app.require_subcommand(1);
  app.set_version_flag("--version", k4::golden::tool_version());
  std::vector<std::pair<CLI::App*, k4::tools::Run>> cmds;
  auto add = [&](const char* name, const char* what, k4::tools::Run (*fn)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, what);
    cmds.push_back({sub, fn(*sub)});
  };
  add("synth", "write a deterministic synthetic checkpoint (safetensors)", k4::tools::add_synth);
  add("golden", "run the reference model and write a golden HDF5 file", k4::tools::add_golden);
  add("inspect", "show a golden's stages, shapes, dtypes and value summaries", k4::tools::add_inspect);
  add("diff", "compare a kernel's dump with a golden, stage by stage, bit for bit", k4::tools::add_diff);
  add("replay", "diff + replay each stage on the dump's inputs: own fault or inherited", k4::tools::add_replay);
  add("checkpoint", "inspect a checkpoint: the tensors and shards a layer's golden reads", k4::tools::add_checkpoint);
  if (argc > 1 && argv[1][0] != '-') {  // CLI11 would only say "A subcommand is required"
    bool known = false;
    std::string names;
    for (const auto& c : cmds) {
      known = known || c.first->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + c.first->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "k4: unknown subcommand '%s' (known: %s; see k4 --help)\n", argv[1], names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "k4: %s (see k4 --help)\n", e.what());
    return 2;
  }
  for (auto& c : cmds) {
    if (!c.first->parsed()) continue;
    const std::string name = c.first->get_name();
    return k4::guard::run("k4 " + name, [&] {
      try {
        return c.second();
      } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "k4 %s: error: %s\n", name.c_str(), e.what());
        return 2;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "k4 %s: failed: %s\n", name.c_str(), e.what());
        return 1;
      }
    });
  }
  return 2;
}
