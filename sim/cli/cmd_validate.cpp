// dtsim validate [PATH]... [--max-mape PCT] [--max-row PCT] [--max-memory-row PCT]
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/errors.hpp"
#include "sim/cli/commands.hpp"
#include "sim/validate.hpp"

namespace dtsim::cli {

namespace {
// A tolerance is a percentage >= 0: a negative one could never pass and is a usage error.
const CLI::Validator kNonNegativePercent(
    [](std::string& v) -> std::string {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !std::isfinite(x)) return "Value " + v + " is not a number";
      if (x < 0) return "Value " + v + " must be a non-negative percentage";
      return std::string();
    },
    "PCT >= 0");

struct ValidateOptions {
  std::vector<std::string> paths{"experiments"};
  double max_mape = 15.0;
  double max_row = 30.0;
  double max_memory_row = 10.0;
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
      ->default_val(15.0)
      ->check(kNonNegativePercent);
  cmd->add_option("--max-row", o->max_row, "Fail (exit 3) when any experiment's error exceeds PCT")
      ->type_name("PCT")
      ->default_val(30.0)
      ->check(kNonNegativePercent);
  cmd->add_option("--max-memory-row", o->max_memory_row,
                  "Fail (exit 3) when any published memory point's error exceeds PCT")
      ->type_name("PCT")
      ->default_val(10.0)
      ->check(kNonNegativePercent);
  return {cmd, [o] {
            const ValidationReport rep = validate_experiments(o->paths);
            // Nothing compared is not a pass: the paths hold no published run.
            if (rep.rows.empty() && rep.memory_rows.empty()) {
              std::string paths;
              for (const auto& p : o->paths) paths += (paths.empty() ? "" : " ") + p;
              throw InputError(paths + ": no experiment with a published: section (step_time_s, tflops_per_gpu or mfu) "
                               "to compare against" +
                               (rep.skipped.empty() ? std::string(" (no .yaml files found)")
                                                    : " (" + std::to_string(rep.skipped.size()) +
                                                          (rep.skipped.size() == 1 ? " .yaml file without one)" : " .yaml files without one)")));
            }
            std::cout << format_validation(rep);
            const bool ok = rep.mape_pct <= o->max_mape && rep.worst_pct <= o->max_row;
            const bool memory_ok = rep.memory_worst_pct <= o->max_memory_row;
            if (!ok)
              std::cout << fmt::format("FAIL: tolerance is MAPE <= {:.1f}% and every row <= {:.1f}%\n", o->max_mape,
                                       o->max_row);
            if (!memory_ok)
              std::cout << fmt::format("FAIL: tolerance is every memory point <= {:.1f}%\n", o->max_memory_row);
            return ok && memory_ok ? kExitOk : 3;
          }};
}

}  // namespace dtsim::cli
