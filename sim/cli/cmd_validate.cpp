// dtsim validate [PATH]... [--max-mape PCT] [--max-row PCT]
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sim/cli/commands.hpp"
#include "sim/validate.hpp"

namespace dtsim::cli {

namespace {
struct ValidateOptions {
  std::vector<std::string> paths{"experiments"};
  double max_mape = 15.0;
  double max_row = 30.0;
};
}  // namespace

Command add_validate_command(CLI::App& app) {
  auto o = std::make_shared<ValidateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "validate", "Simulate every experiment with a published: section and compare with the published figures");
  cmd->add_option("paths", o->paths, "Experiment files or directories (default: experiments)")
      ->type_name("PATH...");
  cmd->add_option("--max-mape", o->max_mape, "Fail (exit 3) when the mean absolute percentage error exceeds PCT")
      ->type_name("PCT")
      ->default_val(15.0);
  cmd->add_option("--max-row", o->max_row, "Fail (exit 3) when any experiment's error exceeds PCT")
      ->type_name("PCT")
      ->default_val(30.0);
  return {cmd, [o] {
            const ValidationReport rep = validate_experiments(o->paths);
            std::cout << format_validation(rep);
            const bool ok = rep.mape_pct <= o->max_mape && rep.worst_pct <= o->max_row;
            if (!ok)
              std::cout << fmt::format("FAIL: tolerance is MAPE <= {:.1f}% and every row <= {:.1f}%\n", o->max_mape,
                                       o->max_row);
            return ok ? kExitOk : 3;
          }};
}

}  // namespace dtsim::cli
