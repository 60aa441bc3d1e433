// Kernel-time band (models/time_band.hpp): each compute op's time at the fast and slow end
// of its source's data, the step's band from the closed form's ratios, in the summary and
// the JSON, and whether a sweep's top layouts keep their order within it.
#include <gtest/gtest.h>

#include <string>

#include "models/experiment_io.hpp"
#include "models/plan.hpp"
#include "models/sweep_spec.hpp"
#include "models/time_band.hpp"
#include "reports/json.hpp"
#include "reports/json_read.hpp"
#include "reports/summary.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/engine.hpp"
#include "sim/sweep/runner.hpp"
#include "sim/sweep/sweep.hpp"
#include "tests/unit/temp_dir.hpp"

namespace dtsim {
namespace {

const std::string kRoot = DTSIM_SOURCE_DIR;
using calib::TimeSource;

TEST(TimeBand, FactorsFollowTheSourcesData) {
  // Tables: the chosen collection against the median of all, 90% within -18%..+6%.
  EXPECT_DOUBLE_EQ(time_band_factor(TimeSource::table_exact, KernelKind::gemm, TimeScenario::fast), 1 / 1.06);
  EXPECT_DOUBLE_EQ(time_band_factor(TimeSource::table_interpolated, KernelKind::gemm, TimeScenario::slow), 1 / 0.82);
  // Roofline GEMMs and attention: the achieved-rate spread over training-like shapes.
  EXPECT_NEAR(time_band_factor(TimeSource::roofline, KernelKind::attention, TimeScenario::fast), 0.926, 1e-3);
  EXPECT_NEAR(time_band_factor(TimeSource::roofline, KernelKind::gemm, TimeScenario::slow), 1.094, 1e-3);
  // No spread recorded: memory-bound roofline kernels, calibrate profiles; nominal is 1.
  EXPECT_EQ(time_band_factor(TimeSource::roofline, KernelKind::memory, TimeScenario::slow), 1.0);
  EXPECT_EQ(time_band_factor(TimeSource::profile_exact, KernelKind::gemm, TimeScenario::slow), 1.0);
  EXPECT_EQ(time_band_factor(TimeSource::table_exact, KernelKind::gemm, TimeScenario::nominal), 1.0);
}

TEST(TimeBand, ThePlanCarriesTheScaledTimes) {
  Experiment e = load_experiment(kRoot + "/experiments/validation/megatron-core-h100-gpt-1.7b.yaml");
  const StepPlan nominal = build_step_plan(e);
  e.time_scenario = TimeScenario::slow;
  const StepPlan slow = build_step_plan(e);
  ASSERT_EQ(nominal.stages[0].ops.size(), slow.stages[0].ops.size());
  for (size_t i = 0; i < nominal.stages[0].ops.size(); ++i) {
    const Op& a = nominal.stages[0].ops[i];
    const Op& b = slow.stages[0].ops[i];
    if (a.type != OpType::compute) continue;
    EXPECT_DOUBLE_EQ(b.time_s, a.time_s * time_band_factor(a.time_source, a.kernel, TimeScenario::slow)) << a.name;
  }
}

TEST(TimeBand, EveryStepComesWithItsBand) {
  const Experiment e = load_experiment(kRoot + "/experiments/validation/megatron-core-h100-gpt-1.7b.yaml");
  const StepResult d = simulate_step_isolated(e);
  // A compute-bound step timed mostly from the tables: close to the tables' own range.
  EXPECT_LT(d.step_time_lo_s, d.step_time_s);
  EXPECT_GT(d.step_time_hi_s, d.step_time_s);
  EXPECT_GT(d.step_time_lo_s, d.step_time_s / 1.06 * 0.99);
  EXPECT_LT(d.step_time_hi_s, d.step_time_s / 0.82);
  EXPECT_GT(d.step_time_hi_s, d.step_time_s * 1.10);
  const StepResult a = simulate_step_analytic(e);
  EXPECT_NEAR(a.step_time_hi_s / a.step_time_s, d.step_time_hi_s / d.step_time_s, 1e-12);  // the same ratios
  EXPECT_NE(format_summary(e, d).find("band"), std::string::npos);
  const StepResult back = result_from_json_text(result_json_text(d));
  EXPECT_DOUBLE_EQ(back.step_time_lo_s, d.step_time_lo_s);
  EXPECT_DOUBLE_EQ(back.step_time_hi_s, d.step_time_hi_s);
  // A communication-bound step moves less than its compute: the band of a DP-heavy ZeRO-3
  // layout on slow NICs is narrower than the compute-bound one's.
  Experiment comm = e;
  comm.layout.zero_stage = 3;
  comm.training.overlap_param_gather = false;
  comm.cluster.nic.bandwidth /= 16;
  const auto [lo, hi] = kernel_band_ratios(comm);
  EXPECT_LT(hi - lo, (d.step_time_hi_s - d.step_time_lo_s) / d.step_time_s);
}

TEST(TimeBand, TheBandIsOrderedAndHoldsTheStep) {
  // A host-bound step need not move with its kernels (faster kernels, longer waits for the
  // CPU): this layout once gave a band of [1.01173, 1.01091] s around a 1.01152 s step.
  const Experiment e = load_experiment(kRoot + "/experiments/examples/llama3.2-1b-host-bound.yaml",
                                       {"layout.dp=auto", "layout.tp=1", "layout.recompute=full", "layout.cp=4"});
  for (const StepResult& r : {simulate_step_isolated(e), simulate_step_analytic(e)}) {
    EXPECT_LE(r.step_time_lo_s, r.step_time_s);
    EXPECT_GE(r.step_time_hi_s, r.step_time_s);
    EXPECT_GT(r.step_time_lo_s, 0.0);
  }
}

TEST(TimeBand, SweepRankingRobustness) {
  const SweepSpec spec = load_sweep_spec(kRoot + "/experiments/sweeps/gpt-2.7b-32-a100.yaml", SpecKind::sweep);
  const test_files::TempDir dir;
  sweep::RunOptions ro;
  ro.out_dir = (dir.path() / "out").string();
  ro.refine_top = 0;
  ro.progress = false;
  const sweep::Outcome out = sweep::run_sweep(spec, ro);
  const auto ranked = sweep::final_ranking(out, spec.rank_by);
  ASSERT_GE(ranked.size(), 5u);
  sweep::Evaluator ev(spec);
  const sweep::RankingBand b = sweep::ranking_band(ev, ranked, spec.rank_by);
  ASSERT_EQ(b.rows, 5u);
  for (size_t i = 0; i < b.rows; ++i) {
    EXPECT_LT(b.fast[i], 1.0);
    EXPECT_GT(b.slow[i], 1.0);
  }
  // The order under each end is the rows' own metric scaled by their own ratios.
  for (const auto* o : {&b.order_fast, &b.order_slow}) {
    const auto& r = o == &b.order_fast ? b.fast : b.slow;
    for (size_t i = 1; i < o->size(); ++i)
      EXPECT_LE(ranked[(*o)[i - 1]].step_time_s * r[(*o)[i - 1]], ranked[(*o)[i]].step_time_s * r[(*o)[i]] * (1 + 1e-12));
  }
  const std::string text = sweep::ranking_band_text(b);
  EXPECT_NE(text.find(b.holds() ? "keep their order" : "change order"), std::string::npos) << text;
  // Identical ratios cannot reorder anything.
  sweep::RankingBand same = b;
  same.order_fast = same.order_slow = {0, 1, 2, 3, 4};
  EXPECT_TRUE(same.holds());
}

}  // namespace
}  // namespace dtsim
