// dtsim run EXP.yaml [--set key=value]... [--json FILE] [--trace FILE] [--show-groups] [--no-fold] [--quiet]
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/errors.hpp"
#include "models/experiment.hpp"
#include "models/experiment_io.hpp"
#include "models/rank_grid.hpp"
#include "reports/atomic_file.hpp"
#include "reports/json.hpp"
#include "reports/summary.hpp"
#include "reports/trace.hpp"
#include "sim/cli/commands.hpp"
#include "sim/engine.hpp"

namespace dtsim::cli {

void add_set_option(CLI::App* cmd, std::vector<std::string>& sets, const std::string& help) {
  cmd->add_option("--set", sets, help)
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->allow_extra_args(false)  // `--set a=1 EXP.yaml`: the file is not a second value
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void require_input_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(path + ": cannot read input file: " +
                     (std::filesystem::exists(path, ec) ? "not a regular file" : "no such file"));
}

void require_output_dir(const std::string& path, const std::string& option) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
    throw InputError(option + " " + path + ": directory " + dir.string() + " does not exist");
}

// ------------------------------------------------------------------------ dtsim run --
namespace {

struct RunOptions {
  std::string experiment;
  std::vector<std::string> sets;
  std::string json_path;
  bool show_groups = false;
  bool no_fold = false;
  bool quiet = false;
  std::string trace_path;
};

int run_command(const RunOptions& o) {
  require_input_file(o.experiment);
  if (!o.json_path.empty()) require_output_dir(o.json_path, "--json");  // fail before a long run
  if (!o.trace_path.empty()) require_output_dir(o.trace_path, "--trace");

  const Experiment exp = load_experiment(o.experiment, o.sets);
  if (o.show_groups) {
    std::cout << describe_groups(RankGrid(exp.layout), exp.cluster.gpus_per_node);
    std::cout.flush();
  }
  Trace trace;
  const StepResult result =
      simulate_step(exp, EngineOptions{.fold = !o.no_fold, .trace = o.trace_path.empty() ? nullptr : &trace});
  if (!o.json_path.empty()) write_file_atomic(o.json_path, result_json_text(result));
  if (!o.trace_path.empty()) write_trace(o.trace_path, trace);
  if (!o.quiet) {
    std::cout << format_summary(exp, result);
    if (result.wall_clock_s > 0) std::cout << fmt::format("\n  simulated in {} (host)\n", format_duration(result.wall_clock_s));
    if (!o.json_path.empty()) std::cout << fmt::format("  JSON written to {}\n", o.json_path);
    if (!o.trace_path.empty())
      std::cout << fmt::format("  trace written to {} (open in https://ui.perfetto.dev or chrome://tracing)\n",
                               o.trace_path);
  }
  return kExitOk;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  RunOptions& o = *opts;
  CLI::App* run = app.add_subcommand("run", "Simulate one training step of an experiment and print a summary");
  run->add_option("experiment", o.experiment, "Experiment YAML file (sections model, cluster, layout, training)")
      ->required()
      ->type_name("EXP.yaml");
  add_set_option(run, o.sets);
  run->add_option("--json", o.json_path, "Also write the full result as JSON to FILE (atomically)")->type_name("FILE");
  run->add_option("--trace", o.trace_path,
                  "Write a Chrome/Perfetto trace of the step to FILE (one process per simulated rank, one "
                  "thread per stream)")
      ->type_name("FILE");
  run->add_flag("--show-groups", o.show_groups, "Print every TP/CP/DP/PP rank group before simulating");
  run->add_flag("--no-fold", o.no_fold, "Simulate every rank instead of one per pipeline stage (slower)");
  run->add_flag("-q,--quiet", o.quiet, "Print no summary (errors still go to stderr)");
  return {run, [opts] { return run_command(*opts); }};
}

}  // namespace dtsim::cli
