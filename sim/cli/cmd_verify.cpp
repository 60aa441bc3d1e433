// dtsim verify EXP.yaml [--set key=value]... [--inject BUG] [--steps N] [--threads N] [--json FILE] [--quiet]
//
// Runs the experiment's step plan on a shrunk model in double precision and checks every
// rule (models/verify/verify.hpp). Exit codes: 0 every applicable rule passed; 3 at least
// one rule failed (with --inject this is the expected outcome: the bug was detected);
// 2 invalid input (including an injection that cannot show on the layout); 1 other failures.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/experiment_io.hpp"
#include "models/verify/verify.hpp"
#include "reports/atomic_file.hpp"
#include "reports/verify_report.hpp"
#include "sim/cli/commands.hpp"

namespace dtsim::cli {

namespace {

constexpr int kExitRuleFailed = 3;

struct VerifyOptionsCli {
  std::string experiment;
  std::vector<std::string> sets;
  std::string inject = "none";
  int steps = 3;
  int threads = 0;
  std::string json_path;
  bool quiet = false;
};

int verify_command(const VerifyOptionsCli& o) {
  require_input_file(o.experiment);
  const Experiment exp = load_experiment(o.experiment, o.sets);
  if (!o.json_path.empty()) require_output_file(o.json_path, "--json", true);
  verify::VerifyOptions vo;
  vo.inject = verify::parse_injection(o.inject);
  vo.steps = o.steps;
  vo.threads = o.threads;
  const verify::VerifyReport rep = verify::verify_experiment(exp, vo);
  if (!o.json_path.empty()) write_output_file(o.json_path, verify_report_json_text(rep), "--json", true);
  // With `--json -` standard output holds only the JSON; the text goes to stderr.
  if (!o.quiet) (o.json_path == "-" ? std::cerr : std::cout) << format_verify_report(rep);
  return rep.passed() ? kExitOk : kExitRuleFailed;
}

}  // namespace

Command add_verify_command(CLI::App& app) {
  auto opts = std::make_shared<VerifyOptionsCli>();
  VerifyOptionsCli& o = *opts;
  std::string bugs;
  for (verify::Injection i : verify::all_injections()) bugs += (bugs.empty() ? "" : ", ") + std::string(verify::to_string(i));
  CLI::App* cmd = app.add_subcommand(
      "verify", "Run the experiment's step plan on a shrunk model in double precision and check its math against one "
                "device (exit 0: all rules pass, 3: a rule failed)");
  cmd->add_option("experiment", o.experiment, "Experiment YAML file")->required()->type_name("EXP.yaml");
  add_set_option(cmd, o.sets);
  cmd->add_option("--inject", o.inject, "Run a known-wrong variant, which must fail: " + bugs)->type_name("BUG");
  cmd->add_option("--steps", o.steps, "Optimizer steps to run (default 3)")->check(CLI::Range(1, 100));
  cmd->add_option("--threads", o.threads,
                  "Threads for the pipeline stages and the reference step (default 0: the machine's hardware "
                  "threads); the report is the same for every value")
      ->check(CLI::Range(0, 256));
  cmd->add_option("--json", o.json_path, "Also write the report as JSON to FILE (atomically; - for standard output)")
      ->type_name("FILE")->check(output_path_check());
  cmd->add_flag("-q,--quiet", o.quiet, "Print no report (the exit code still tells)");
  return {cmd, [opts] { return verify_command(*opts); }};
}

}  // namespace dtsim::cli
