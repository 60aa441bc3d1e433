#pragma once
// Subcommands of the dtsim CLI. Each lives in its own sim/cli/cmd_*.cpp and is registered
// in main.cpp. Only the CLI turns errors into messages and exit codes.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace dtsim::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitInput = 2;

/// CLI11 splits a word "[a,b]" given to a list option into its elements
/// (CLI::Option::_add_result), so a launch's `--moe-layer-freq "[1,0,1,0]"` after `--` would
/// reach `dtsim import` as four words. main() marks each such word after `--` with this
/// leading byte, and unmark_word() restores it as typed.
inline constexpr char kWordMark = '\x1f';
inline std::string unmark_word(std::string w) {
  if (!w.empty() && w.front() == kWordMark) w.erase(0, 1);
  return w;
}
/// `dtsim run`: the step was simulated and its outputs written, but at least one pipeline
/// stage needs more memory than the GPU has (the summary's OOM warning).
constexpr int kExitDoesNotFit = 3;

/// A subcommand: its CLI11 node and what runs when it was given. The options it parses
/// into live in the closure.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

/// Throws InputError naming `path` when it is not a readable regular file.
void require_input_file(const std::string& path);
/// Throws InputError when `path` may not be written (reports/atomic_file.hpp: a device,
/// FIFO, directory, dangling link or input file; "-" unless `allow_stdout`).
void require_output_file(const std::string& path, const std::string& option, bool allow_stdout);
/// CLI11 check for an option naming an output file or directory: an empty value
/// (`--json ''`) is refused, not taken as "no output".
inline CLI::Validator output_path_check() {
  return CLI::Validator(
      [](std::string& s) { return s.empty() ? std::string("an empty path names no file or directory") : std::string(); },
      "", "output path");
}
/// Adds the repeatable `--set KEY=VALUE` option (experiment key overrides) to `cmd`: one
/// value per flag, so `--set a=1 EXP.yaml` leaves the file positional.
void add_set_option(CLI::App* cmd, std::vector<std::string>& sets,
                    const std::string& help = "Override a key before validation, e.g. --set layout.tp=4 (repeatable)");

// ---- registered subcommands (one line each in main.cpp) ----
Command add_run_command(CLI::App& app);
Command add_sweep_command(CLI::App& app);
Command add_compare_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_merge_command(CLI::App& app);
Command add_validate_command(CLI::App& app);
Command add_collective_command(CLI::App& app);
Command add_explain_command(CLI::App& app);
Command add_verify_command(CLI::App& app);
Command add_calibrate_command(CLI::App& app);
Command add_import_command(CLI::App& app);  // cmd_import.cpp: import megatron
Command add_export_command(CLI::App& app);  // cmd_import.cpp: export megatron
Command add_presets_command(CLI::App& app);

}  // namespace dtsim::cli
