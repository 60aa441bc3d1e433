// dtsim verify's injected bugs on the shipped experiments whose layouts are too large to
// rerun once per bug in the default suite (tests/unit/test_verify.cpp covers the others,
// and checks that every shipped experiment, these included, passes as planned): every
// injected bug that can show fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/plan.hpp"
#include "models/verify/tiny_model.hpp"
#include "models/verify/verify.hpp"

namespace dtsim::verify {
namespace {

namespace fs = std::filesystem;

/// Steps an injected bug needs to show: one, except skipped ZeRO-1/2 parameter gathers,
/// whose stale shards are only used by the next step's forward.
int steps_to_show(Injection inj) { return inj == Injection::zero_skip_param_gather ? 2 : 1; }

constexpr int64_t kUnitSuiteMaxWorld = 1024;  // as tests/unit/test_verify.cpp

TEST(VerifyShippedLarge, EveryApplicableBugFails) {
  const fs::path root = fs::path(DTSIM_SOURCE_DIR) / "experiments";
  std::vector<fs::path> files;
  for (const auto& ent : fs::recursive_directory_iterator(root))
    if (ent.is_regular_file() && ent.path().extension() == ".yaml" && ent.path().parent_path().filename() != "sweeps")
      files.push_back(ent.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) {
    const Experiment e = load_experiment(p.string());
    const Experiment s = shrink_experiment(e);
    if (s.layout.dp * s.layout.tp * s.layout.cp * s.layout.pp <= kUnitSuiteMaxWorld) continue;
    const StepPlan plan = build_step_plan(s);
    for (Injection inj : all_injections()) {
      if (!injection_inapplicable(inj, s).empty()) continue;
      EXPECT_FALSE(verify_plan(plan, {.steps = steps_to_show(inj), .inject = inj}).passed()) << p << " " << to_string(inj);
    }
  }
}

}  // namespace
}  // namespace dtsim::verify
