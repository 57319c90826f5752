// commands.hpp -- the k4 subcommands. Each registers its options on the app and returns the
// function to run once parsing succeeded. Exit codes: 0 ok, 1 mismatch / failure, 2 bad
// input or usage (std::invalid_argument, CLI11 parse errors).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace k4::tools {

using Run = std::function<int()>;

// Digits only ("-1" is refused by name, not wrapped to 2^64 - 1 by the conversion).
inline CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) return "";
        return "'" + s + "' is not a non-negative integer";
      },
      "UINT");
}
Run add_synth(CLI::App& app);
Run add_golden(CLI::App& app);
Run add_inspect(CLI::App& app);
Run add_diff(CLI::App& app);
Run add_replay(CLI::App& app);
Run add_checkpoint(CLI::App& app);

}  // namespace k4::tools
