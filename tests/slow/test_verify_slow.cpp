// dtsim verify's injected bugs on the shipped experiments whose layouts are too large to
// rerun once per bug in the default suite (tests/unit/test_verify.cpp covers the others,
// and checks that every shipped experiment, these included, passes as planned): every
// injected bug that can show fails; and the largest layouts give the same report on one
// thread as on several.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
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
    Experiment e = load_experiment(p.string());
    e.model.mtp_layers = 0;  // verify does not execute MTP depths (test_verify.cpp MtpFilesPassWithoutTheirDepths)
    const Experiment s = shrink_experiment(e);
    if (s.layout.dp * s.layout.tp * s.layout.cp * s.layout.pp <= kUnitSuiteMaxWorld) continue;
    const StepPlan plan = build_step_plan(s);
    for (Injection inj : all_injections()) {
      if (!injection_inapplicable(inj, s).empty()) continue;
      EXPECT_FALSE(verify_plan(plan, {.steps = steps_to_show(inj), .inject = inj}).passed()) << p << " " << to_string(inj);
    }
  }
}

TEST(VerifyShippedLarge, TheReportDoesNotDependOnTheThreadCount) {
  // The largest pipelines (3072 ranks, interleaved schedule; 2240 ranks with sequence
  // parallelism): one thread and the machine's threads give the same report, bit for bit
  // (tests/unit/test_verify.cpp checks the same on small layouts and on failing plans).
  for (const auto& [file, steps] : {std::pair{"validation/narayanan-gpt-1008b.yaml", 2},
                                    std::pair{"validation/korthikanti-gpt-530b-selective-dp8.yaml", 1}}) {
    const Experiment e = load_experiment((fs::path(DTSIM_SOURCE_DIR) / "experiments" / file).string());
    const VerifyReport one = verify_experiment(e, {.steps = steps, .threads = 1});
    const VerifyReport many = verify_experiment(e, {.steps = steps, .threads = 0});
    EXPECT_TRUE(one.passed()) << file;
    ASSERT_EQ(one.rules.size(), many.rules.size()) << file;
    for (size_t i = 0; i < one.rules.size(); ++i) {
      const RuleResult &a = one.rules[i], &b = many.rules[i];
      EXPECT_EQ(a.passed, b.passed) << file << " " << a.name;
      EXPECT_EQ(a.values, b.values) << file << " " << a.name;
      EXPECT_EQ(std::memcmp(&a.max_abs_error, &b.max_abs_error, sizeof(double)), 0) << file << " " << a.name;
      EXPECT_EQ(a.worst, b.worst) << file << " " << a.name;
      EXPECT_EQ(a.problems, b.problems) << file << " " << a.name;
    }
    EXPECT_EQ(one.notes, many.notes) << file;
  }
}

}  // namespace
}  // namespace dtsim::verify
