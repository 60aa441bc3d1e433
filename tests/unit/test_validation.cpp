// Accuracy against published training runs (dtsim validate). Tolerances:
//  - the two GPT-3 175B runs of Korthikanti 2022 within 25% of 13.75 s and 18.13 s;
//  - every published experiment shipped in experiments/: the project's target (issue 5,
//    `dtsim validate`'s defaults), MAPE <= 15% and every row within 30%. Measured when
//    this test was written: MAPE 11.7% over 25 rows, worst row +28.7% (Megatron-Core's
//    GPT 1.7B on 48 H100).
// No constant is fitted to any row: efficiencies belong to the GPU, the kernel kind or the
// framework and cite their sources.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "models/experiment_io.hpp"
#include "models/trace.hpp"
#include "sim/child_process.hpp"
#include "sim/engine.hpp"
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
  ASSERT_GE(rep.rows.size(), 25u);
  std::cout << format_validation(rep);
  EXPECT_LE(rep.mape_pct, 15.0);
  for (const auto& row : rep.rows) EXPECT_LE(std::fabs(row.error_pct), 30.0) << row.file;
}

/// Forward and backward time of one transformer layer (layer 10, micro-batch 0, rank 0) in
/// the simulated timeline: the span from the first to the last event (kernels and the TP
/// collectives the compute stream waits for) of each of its two bursts, forward, then
/// backward (with its recomputed forward when recomputing).
std::pair<double, double> layer_times(const Experiment& e) {
  const std::string out = run_in_child(
      [&] {
        Trace trace;
        EngineOptions opts;
        opts.trace = &trace;
        simulate_step(e, opts);
        std::vector<const TraceEvent*> ev;
        for (const auto& x : trace.events)
          if (x.rank == 0 && x.layer == 10 && x.micro_batch == 0) ev.push_back(&x);
        std::sort(ev.begin(), ev.end(), [](auto* a, auto* b) { return a->start_s < b->start_s; });
        std::vector<std::pair<double, double>> bursts;  // [start, end]
        for (const auto* x : ev) {
          // Another layer's work runs between the forward and the backward burst.
          if (bursts.empty() || x->start_s > bursts.back().second + 200e-6) bursts.push_back({x->start_s, x->start_s});
          bursts.back().second = std::max(bursts.back().second, x->start_s + x->duration_s);
        }
        if (bursts.size() != 2) throw std::runtime_error("expected 2 bursts, got " + std::to_string(bursts.size()));
        std::ostringstream os;
        os.precision(17);
        os << bursts[0].second - bursts[0].first << " " << bursts[1].second - bursts[1].first;
        return os.str();
      },
      "layer_times");
  std::istringstream is(out);
  std::pair<double, double> r;
  is >> r.first >> r.second;
  return r;
}

// Korthikanti et al. 2022 (arXiv 2205.05198) Table 4: one transformer layer of GPT 22B
// (a = 64, h = 6144, s = 2048) with TP 8 on a DGX A100, micro-batch 4, forward and backward
// milliseconds (shared/validation/layer_times.csv). The layer is where the kernel cost model
// (wave-quantised GEMMs, memory-bound kernels) and the TP collectives meet, with no pipeline
// or data-parallel effects. Tolerance 10% per figure (measured: 3.2-6.5% low).
TEST(Validation, LayerTimesMatchKorthikantiTable4) {
  struct Row {
    const char* experiment;
    const char* recompute;
    bool sp;
    double fwd_ms, bwd_ms;
  };
  const Row rows[] = {
      {"Baseline no recompute", "none", false, 7.7, 11.9},
      {"Sequence Parallelism", "none", true, 7.2, 11.8},
      {"Baseline with recompute", "full", false, 7.7, 19.5},
      {"Selective Recompute", "selective", false, 7.7, 13.2},
      {"Selective + Sequence", "selective", true, 7.2, 13.1},
  };
  for (const Row& r : rows) {
    const Experiment e = load_experiment(kRoot + "/experiments/validation/korthikanti-gpt-22b-full.yaml",
                                         {std::string("layout.recompute=") + r.recompute,
                                          std::string("layout.sequence_parallel=") + (r.sp ? "true" : "false")});
    const auto [fwd, bwd] = layer_times(e);
    std::cout << r.experiment << ": forward " << fwd * 1e3 << " ms (published " << r.fwd_ms << "), backward "
              << bwd * 1e3 << " ms (published " << r.bwd_ms << ")\n";
    EXPECT_NEAR(fwd * 1e3 / r.fwd_ms, 1.0, 0.10) << r.experiment << ": forward " << fwd * 1e3 << " ms";
    EXPECT_NEAR(bwd * 1e3 / r.bwd_ms, 1.0, 0.10) << r.experiment << ": backward " << bwd * 1e3 << " ms";
  }
}

}  // namespace
}  // namespace dtsim
