// The analytic engine against the SimGrid engine on the shipped experiments too large for the
// default suite (accumulation steps x layers > 15,000: 530B, 1T, 1008B; seconds each in
// SimGrid). Same 10% bound as tests/unit/test_analytic.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "models/experiment_io.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/engine.hpp"

namespace dtsim {
namespace {

namespace fs = std::filesystem;

TEST(AnalyticSlow, AgreesWithSimGridOnLargeShippedExperiments) {
  std::vector<fs::path> files;
  for (const char* d : {"experiments", "experiments/validation"})
    for (const auto& e : fs::directory_iterator(fs::path(DTSIM_SOURCE_DIR) / d))
      if (e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  int checked = 0;
  for (const auto& f : files) {
    const Experiment e = load_experiment(f.string());
    if (e.training.accumulation(e.layout) * e.model.layers <= 15000) continue;  // in the default suite
    const StepResult des = simulate_step_isolated(e);
    const StepResult an = simulate_step_analytic(e);
    EXPECT_NEAR(an.step_time_s / des.step_time_s, 1.0, 0.10)
        << f.filename() << ": analytic " << an.step_time_s << " s, SimGrid " << des.step_time_s << " s";
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace dtsim
