// dtsim run EXP.yaml [--set key=value]... [--json FILE] [--trace FILE] [--show-groups] [--no-fold] [--quiet]
//           [--megatron-args]
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/checked.hpp"
#include "models/errors.hpp"
#include "models/experiment.hpp"
#include "models/experiment_io.hpp"
#include "models/path_problem.hpp"
#include "models/plan.hpp"
#include "models/rank_grid.hpp"
#include "reports/atomic_file.hpp"
#include "models/megatron_args.hpp"
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
  // "no such file", "a symlink loop (...)", "a directory, not a file", ...
  if (auto why = input_path_problem(path)) throw InputError(path + ": cannot read input file: " + *why);
}

void require_output_file(const std::string& path, const std::string& option, bool allow_stdout) {
  check_output_file(path, option, allow_stdout);
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
  bool megatron_args = false;  // also print the Megatron-LM flags that launch it
  std::string trace_path;
};

int run_command(const RunOptions& o) {
  require_input_file(o.experiment);
  if (o.json_path == "-" && o.trace_path == "-")
    throw InputError("--json - --trace -: only one output can go to standard output");
  // One file cannot hold both outputs: the second write would replace the first.
  if (!o.json_path.empty() && !o.trace_path.empty() && o.json_path != "-" && o.trace_path != "-") {
    std::error_code ec1, ec2;
    const auto a = std::filesystem::weakly_canonical(o.json_path, ec1);
    const auto b = std::filesystem::weakly_canonical(o.trace_path, ec2);
    if (ec1 || ec2 ? o.json_path == o.trace_path : a == b)
      throw InputError("--json " + o.json_path + " and --trace " + o.trace_path +
                       " name the same file: each output needs its own path");
  }
  const Experiment exp = load_experiment(o.experiment, o.sets);
  // The engine's limits (rank-operations, memory), before any other work.
  check_engine_limits(exp, EngineOptions{.fold = !o.no_fold}, o.experiment);
  // Fail before a long run (the input files are known now; the writes check again).
  if (!o.json_path.empty()) require_output_file(o.json_path, "--json", true);
  if (!o.trace_path.empty()) require_output_file(o.trace_path, "--trace", true);
  // With `--json -` or `--trace -` standard output holds only that file; the text goes to stderr.
  std::ostream& text = o.json_path == "-" || o.trace_path == "-" ? std::cerr : std::cout;
  if (o.show_groups) {
    text << describe_groups(RankGrid(exp.layout), exp.cluster.gpus_per_node);
    text.flush();
  }
  Trace trace;
  const StepResult result =
      simulate_step(exp, EngineOptions{.fold = !o.no_fold, .trace = o.trace_path.empty() ? nullptr : &trace});
  if (!o.json_path.empty()) write_output_file(o.json_path, result_json_text(result), "--json", true);
  if (!o.trace_path.empty()) write_output_file(o.trace_path, trace_to_json(trace).dump(), "--trace", true);
  if (!o.quiet) {
    text << format_summary(exp, result);
    if (result.wall_clock_s > 0) text << fmt::format("\n  simulated in {} (host)\n", format_duration(result.wall_clock_s));
    if (!o.json_path.empty() && o.json_path != "-") text << fmt::format("  JSON written to {}\n", o.json_path);
    if (!o.trace_path.empty() && o.trace_path != "-")
      text << fmt::format("  trace written to {} (open in https://ui.perfetto.dev or chrome://tracing)\n",
                               o.trace_path);
  }
  if (o.megatron_args) text << "  megatron_args: " << shell_join(megatron_args(exp)) << "\n";
  // A layout that does not fit is a result, not an input error: the outputs are written,
  // and the exit code says so (README "Exit codes").
  const auto oom = std::count_if(result.stages.begin(), result.stages.end(),
                                 [](const StageResult& s) { return !s.memory.fits; });
  if (oom > 0) {
    if (o.quiet)  // the summary, which carries the warning, was not printed
      std::cerr << fmt::format("warning: {} of {} pipeline stage{} exceed GPU memory (OOM)\n", oom,
                               result.stages.size(), result.stages.size() == 1 ? "" : "s");
    return kExitDoesNotFit;
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
  run->add_option("--json", o.json_path,
                  "Also write the full result as JSON to FILE (atomically; - for standard output, the summary then "
                  "goes to stderr)")
      ->type_name("FILE")->check(output_path_check());
  run->add_option("--trace", o.trace_path,
                  "Write a Chrome/Perfetto trace of the step to FILE (one process per simulated rank, one "
                  "thread per stream; - for standard output)")
      ->type_name("FILE")->check(output_path_check());
  run->add_flag("--show-groups", o.show_groups, "Print every TP/CP/DP/PP rank group before simulating");
  run->add_flag("--no-fold", o.no_fold, "Simulate every rank instead of one per pipeline stage (slower)");
  run->add_flag("-q,--quiet", o.quiet, "Print no summary (errors still go to stderr)");
  run->add_flag("--megatron-args", o.megatron_args,
                "Also print the Megatron-LM flags that launch this experiment (models/megatron_args.hpp)");
  return {run, [opts] { return run_command(*opts); }};
}

}  // namespace dtsim::cli
