// dtsim: the command line. The only place that turns errors into messages and exit codes.
//
//   dtsim run EXP.yaml [--set key=value]... [--json FILE] [--show-groups] [--no-fold] [--quiet]
//   dtsim explain EXP.yaml [--set key=value]...
//   dtsim --version
//
// Exit codes: 0 success; 1 internal or I/O failure; 2 invalid input (every problem is
// printed on its own "error: " line); CLI11's own codes for command-line usage errors.
//
// Each subcommand is one `Command` (its options + a function) in sim/cli/cmd_*.cpp,
// declared in sim/cli/commands.hpp and registered in main() with one line.
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "models/errors.hpp"
#include "reports/terminal_text.hpp"
#include "sim/cli/commands.hpp"

#ifndef DTSIM_VERSION
#define DTSIM_VERSION "0.1.0"  // keep in step with project(VERSION) in CMakeLists.txt
#endif

namespace dtsim::cli {
namespace {
// ------------------------------------------------------------------------ errors -----
/// Runs `f`, turning exceptions into "error: " lines on stderr and an exit code.
int guarded(const std::function<int()>& f) {
  try {
    return f();
  } catch (const InputError& e) {
    std::cout.flush();
    if (e.problems().empty()) std::cerr << "error: invalid input\n";
    // Problems quote user text: no raw control characters on the terminal (one line each).
    for (const auto& p : e.problems()) std::cerr << "error: " << dtsim::printable(p) << '\n';
    return kExitInput;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "error: " << dtsim::printable(e.what()) << '\n';
    return kExitFailure;
  }
}

}  // namespace
}  // namespace dtsim::cli

int main(int argc, char** argv) {
  using namespace dtsim::cli;
  CLI::App app{"dtsim: a discrete-event simulator and cost model for distributed Transformer training"};
  app.name("dtsim");
  app.set_version_flag("--version", std::string("dtsim ") + DTSIM_VERSION);
  app.require_subcommand(1);

  std::vector<Command> commands;
  // Registered subcommands: one line each.
  commands.push_back(add_run_command(app));
  commands.push_back(add_sweep_command(app));
  commands.push_back(add_compare_command(app));
  commands.push_back(add_plan_command(app));
  commands.push_back(add_merge_command(app));
  commands.push_back(add_validate_command(app));
  commands.push_back(add_collective_command(app));
  commands.push_back(add_explain_command(app));
  commands.push_back(add_verify_command(app));
  commands.push_back(add_calibrate_command(app));
  commands.push_back(add_import_command(app));
  commands.push_back(add_export_command(app));
  commands.push_back(add_presets_command(app));

  // The words after `--` as typed (kWordMark).
  std::vector<std::string> words(argv, argv + argc);
  bool after_dashes = false;
  for (auto& w : words) {
    if (after_dashes && w.size() >= 2 && w.front() == '[' && w.back() == ']') w.insert(w.begin(), kWordMark);
    if (w == "--") after_dashes = true;
  }
  std::vector<char*> marked;
  for (auto& w : words) marked.push_back(w.data());
  marked.push_back(nullptr);
  try {
    app.parse(argc, marked.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const auto& c : commands)
    if (c.app->parsed()) return guarded(c.run);
  return kExitFailure;  // unreachable: require_subcommand(1)
}
