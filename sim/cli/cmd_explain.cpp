// dtsim explain EXP.yaml [--set key=value]...
// Prints the design source's judgment method for one experiment, read from the same step
// plan `dtsim run` simulates (reports/explain.hpp). Builds the plan; runs no simulation.
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "models/experiment_io.hpp"
#include "models/plan.hpp"
#include "models/rank_grid.hpp"
#include "reports/explain.hpp"
#include "sim/cli/commands.hpp"
#include "sim/collectives/collective.hpp"

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
  // The deepep / hybridep dispatch's token reach over rank 0's EP group, from the engines'
  // model of it (sim/collectives/alltoall_deepep.cpp).
  if (exp.model.moe.enabled() && exp.layout.ep > 1 && exp.training.moe_token_dispatcher != "alltoall") {
    const std::vector<int64_t> group = RankGrid(exp.layout).group_of(0, GroupKind::EP);
    std::set<int64_t> nodes;
    for (int64_t r : group) nodes.insert(r / std::max<int64_t>(1, exp.cluster.gpus_per_node));
    ExplainEpReach reach;
    reach.members = static_cast<int64_t>(group.size());
    reach.nodes = static_cast<int64_t>(nodes.size());
    const collectives::DeepEpFanout f =
        collectives::deepep_fanout(reach.members, reach.nodes, collectives::ep_token_routing(exp));
    reach.remote_nodes = f.remote_nodes;
    reach.other_members = f.other_members;
    std::cout << format_explain(exp, plan, &reach);
    return kExitOk;
  }
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
