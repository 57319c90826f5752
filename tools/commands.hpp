// commands.hpp -- the k4 subcommands. Each registers its options on the app and returns the
// function to run once parsing succeeded. Exit codes: 0 ok, 1 mismatch / failure, 2 bad
// input or usage (std::invalid_argument, CLI11 parse errors).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace k4::tools {

using Run = std::function<int()>;
Run add_synth(CLI::App& app);
Run add_golden(CLI::App& app);
Run add_inspect(CLI::App& app);
Run add_diff(CLI::App& app);
Run add_replay(CLI::App& app);

}  // namespace k4::tools
