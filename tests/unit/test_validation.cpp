// Accuracy against published training runs (dtsim validate). Tolerances:
//  - the two GPT-3 175B runs of Korthikanti 2022 within 25% of 13.75 s and 18.13 s;
//  - every published experiment shipped in experiments/: the accuracy measured when this
//    test was written, as a regression guard: MAPE <= 20% and no row beyond 50% (measured:
//    MAPE 16.9%, worst +46.0% on the Megatron-Core H100 1.7B row). The project's target is
//    MAPE <= 15% and every row <= 30% (`dtsim validate`'s defaults); it is not met yet:
//    A100 runs come out 9-26% fast and small-hidden H100 runs far too fast, which points
//    at per-shape GEMM efficiency (calibration), not at a constant to tune.
// No constant is fitted to any row: efficiencies belong to the GPU, the kernel kind or the
// framework and cite their sources.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "sim/validate.hpp"

namespace dtsim {
namespace {

const std::string kRoot = DTSIM_SOURCE_DIR;

TEST(Validation, Gpt3OnSixtyFourA100WithinTwentyFivePercent) {
  const auto rep = validate_experiments(
      {kRoot + "/experiments/gpt3-175b-selective.yaml", kRoot + "/experiments/gpt3-175b-full-recompute.yaml"});
  ASSERT_EQ(rep.rows.size(), 2u);
  for (const auto& row : rep.rows) {
    EXPECT_EQ(row.metric, "step time (s)");
    EXPECT_LE(std::fabs(row.error_pct), 25.0) << row.file << ": simulated " << row.simulated << " s vs published "
                                              << row.published << " s";
  }
}

TEST(Validation, PublishedRunsWithinTolerance) {
  const auto rep = validate_experiments({kRoot + "/experiments"});
  ASSERT_GE(rep.rows.size(), 24u);
  std::cout << format_validation(rep);
  EXPECT_LE(rep.mape_pct, 20.0);
  for (const auto& row : rep.rows) EXPECT_LE(std::fabs(row.error_pct), 50.0) << row.file;
}

}  // namespace
}  // namespace dtsim
