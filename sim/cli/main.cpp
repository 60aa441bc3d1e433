// dtsim: the command line. The only place that turns errors into messages and exit codes.
//
//   dtsim run EXP.yaml [--set key=value]... [--json FILE] [--show-groups] [--no-fold] [--quiet]
//   dtsim --version
//
// Exit codes: 0 success; 1 internal or I/O failure; 2 invalid input (every problem is
// printed on its own "error: " line); CLI11's own codes for command-line usage errors.
//
// Each subcommand is one `Command` (its options + a function) registered in main();
// sweep / compare / explain / collective are added the same way.
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "models/errors.hpp"
#include "models/experiment.hpp"
#include "models/experiment_io.hpp"
#include "models/rank_grid.hpp"
#include "reports/atomic_file.hpp"
#include "reports/json.hpp"
#include "reports/summary.hpp"
#include "sim/engine.hpp"

#ifndef DTSIM_VERSION
#define DTSIM_VERSION "0.1.0"  // keep in step with project(VERSION) in CMakeLists.txt
#endif

namespace dtsim::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitInput = 2;

/// A subcommand: its CLI11 node and what runs when it was given.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// ------------------------------------------------------------------------ dtsim run --
struct RunOptions {
  std::string experiment;
  std::vector<std::string> sets;
  std::string json_path;
  bool show_groups = false;
  bool no_fold = false;
  bool quiet = false;
};

int run_command(const RunOptions& o) {
  // A clear message for the most common mistake, before any parsing.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(o.experiment, ec))
    throw InputError(o.experiment + ": cannot read experiment file: " +
                     (std::filesystem::exists(o.experiment, ec) ? "not a regular file" : "no such file"));

  // Fail before a long simulation rather than after it.
  if (!o.json_path.empty()) {
    const std::filesystem::path dir = std::filesystem::path(o.json_path).parent_path();
    if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
      throw InputError("--json " + o.json_path + ": directory " + dir.string() + " does not exist");
  }

  const Experiment exp = load_experiment(o.experiment, o.sets);
  if (o.show_groups) {
    std::cout << describe_groups(RankGrid(exp.layout), exp.cluster.gpus_per_node);
    std::cout.flush();
  }
  const StepResult result = simulate_step(exp, EngineOptions{.fold = !o.no_fold});
  if (!o.json_path.empty()) write_file_atomic(o.json_path, result_json_text(result));
  if (!o.quiet) {
    std::cout << format_summary(exp, result);
    if (result.wall_clock_s > 0) std::cout << fmt::format("\n  simulated in {} (host)\n", format_duration(result.wall_clock_s));
    if (!o.json_path.empty()) std::cout << fmt::format("  JSON written to {}\n", o.json_path);
  }
  return kExitOk;
}

Command add_run_command(CLI::App& app, RunOptions& o) {
  CLI::App* run = app.add_subcommand("run", "Simulate one training step of an experiment and print a summary");
  run->add_option("experiment", o.experiment, "Experiment YAML file (sections model, cluster, layout, training)")
      ->required()
      ->type_name("EXP.yaml");
  run->add_option("--set", o.sets, "Override a key before validation, e.g. --set layout.tp=4 (repeatable)")
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->allow_extra_args(false)  // `--set a=1 EXP.yaml`: the file is not a second value
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  run->add_option("--json", o.json_path, "Also write the full result as JSON to FILE (atomically)")->type_name("FILE");
  run->add_flag("--show-groups", o.show_groups, "Print every TP/CP/DP/PP rank group before simulating");
  run->add_flag("--no-fold", o.no_fold, "Simulate every rank instead of one per pipeline stage (slower)");
  run->add_flag("-q,--quiet", o.quiet, "Print no summary (errors still go to stderr)");
  return {run, [&o] { return run_command(o); }};
}

// ------------------------------------------------------------------------ errors -----
/// Runs `f`, turning exceptions into "error: " lines on stderr and an exit code.
int guarded(const std::function<int()>& f) {
  try {
    return f();
  } catch (const InputError& e) {
    std::cout.flush();
    if (e.problems().empty()) std::cerr << "error: invalid input\n";
    for (const auto& p : e.problems()) std::cerr << "error: " << p << '\n';
    return kExitInput;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "error: " << e.what() << '\n';
    return kExitFailure;
  }
}

}  // namespace dtsim::cli

int main(int argc, char** argv) {
  using namespace dtsim::cli;
  CLI::App app{"dtsim: a discrete-event simulator and cost model for distributed Transformer training"};
  app.name("dtsim");
  app.set_version_flag("--version", std::string("dtsim ") + DTSIM_VERSION);
  app.require_subcommand(1);

  RunOptions run_options;
  std::vector<Command> commands;
  commands.push_back(add_run_command(app, run_options));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const auto& c : commands)
    if (c.app->parsed()) return guarded(c.run);
  return kExitFailure;  // unreachable: require_subcommand(1)
}
