// dtsim explain EXP.yaml [--set key=value]...
// Prints the design source's judgment method for one experiment, read from the same step
// plan `dtsim run` simulates (reports/explain.hpp). Builds the plan; runs no simulation.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "models/experiment_io.hpp"
#include "models/plan.hpp"
#include "reports/explain.hpp"
#include "sim/cli/commands.hpp"

namespace dtsim::cli {
namespace {

struct ExplainOptions {
  std::string experiment;
  std::vector<std::string> sets;
};

int explain_command(const ExplainOptions& o) {
  require_input_file(o.experiment);
  const Experiment exp = load_experiment(o.experiment, o.sets);
  const StepPlan plan = build_step_plan(exp);
  std::cout << format_explain(exp, plan);
  return kExitOk;
}

}  // namespace

Command add_explain_command(CLI::App& app) {
  auto opts = std::make_shared<ExplainOptions>();
  ExplainOptions& o = *opts;
  CLI::App* cmd = app.add_subcommand(
      "explain", "Explain a layout from its step plan: what each rank holds, every collective (reduce op, group, "
                 "bytes, calls per step, critical path), the rank grid and per-stage memory with formulas");
  cmd->add_option("experiment", o.experiment, "Experiment YAML file (sections model, cluster, layout, training)")
      ->required()
      ->type_name("EXP.yaml");
  add_set_option(cmd, o.sets);
  return {cmd, [opts] { return explain_command(*opts); }};
}

}  // namespace dtsim::cli
