// Accuracy against published training runs (dtsim validate). Tolerances:
//  - issue 2: the two GPT-3 175B runs of Korthikanti 2022 within 25% of 13.75 s and 18.13 s;
//  - every published experiment shipped in experiments/: MAPE <= 15% and no row beyond 30%
//    (issue 5). No constant is fitted to any row: efficiencies belong to the GPU, the
//    kernel kind or the framework and cite their sources.
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
  ASSERT_GE(rep.rows.size(), 6u);
  std::cout << format_validation(rep);
  EXPECT_LE(rep.mape_pct, 15.0);
  for (const auto& row : rep.rows) EXPECT_LE(std::fabs(row.error_pct), 30.0) << row.file;
}

}  // namespace
}  // namespace dtsim
