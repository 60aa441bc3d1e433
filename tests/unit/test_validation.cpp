// Accuracy against published training runs (dtsim validate). Tolerances:
//  - the two GPT-3 175B runs of Korthikanti 2022 within 25% of 13.75 s and 18.13 s;
//  - every published experiment shipped in experiments/: the project's target (issue 5,
//    `dtsim validate`'s defaults), MAPE <= 15% and every row within 30%. Measured when
//    this test was written: MAPE 11.7% over 25 rows, worst row +28.7% (Megatron-Core's
//    GPT 1.7B on 48 H100); with the shipped kernel tables MAPE 10.0% over 30 rows (13.8% over 35 with the MegaScale-MoE baseline series, a known gap), the
//    dense 25 at 8.4%, worst dense row +25.7% (the same GPT 1.7B). MoE rows (issue 16) count in the MAPE; the rows of kKnownGaps may
//    reach 50% each, listed with why (a gap of the model, not a tolerance to grow).
// No constant is fitted to any row: efficiencies belong to the GPU, the kernel kind or the
// framework and cite their sources.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "models/trace.hpp"
#include "sim/child_process.hpp"
#include "sim/engine.hpp"
#include "sim/validate.hpp"
#include "tests/unit/temp_dir.hpp"

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

// Published rows dtsim misses by more than 30%, each with its measured error and the work it
// needs. Qwen3-235B-A22B TP4 PP8 VP4 EP8 (Megatron-MoE-ModelZoo, 29.0 s, 167 TFLOP/s per GPU):
// dtsim 16.5 s (-43% with the shipped kernel tables timing each expert's GEMM; -49% on the
// roofline; -44% before the DeepEP dispatcher sent each token once per node, -46%
// before the parameter gathers followed Megatron's aligned interleaved prefetch); fine-grained
// experts (128 x 1536, 16 per rank, ~512 rows per expert per micro-batch) on TP4 attention: the
// grouped-GEMM efficiency at small rows and the permute / unpermute and router kernels are not
// yet modelled from measurements.
// MegaScale-MoE's Megatron-LM baseline (arXiv 2505.11432 Table 3; 352B, TP8 ETP8 EP1 PP15 on
// 240-1440 H800): dtsim is 34-39% faster on every row of the strong-scaling series (24.37 vs
// 39.94 s on 240 GPUs, 5.22 vs 7.90 s on 1440), measured when added. The baseline's
// micro-batch, recomputation, optimizer sharding and token dispatcher are not published
// (Megatron's defaults assumed; full recomputation would give 33.6 s on 240 GPUs, but nothing
// says it ran, and it fits without); expert TP 8 slices each of the 32 experts to 1792 columns.
const std::vector<std::string> kKnownGaps = {"modelzoo-qwen3-235b-a22b-tp4-pp8-ep8", "megascale-moe-352b-megatron-"};

TEST(Validation, PublishedRunsWithinTolerance) {
  const auto rep = validate_experiments({kRoot + "/experiments"});
  ASSERT_GE(rep.rows.size(), 35u);
  std::cout << format_validation(rep);
  EXPECT_LE(rep.mape_pct, 15.0);
  for (const auto& row : rep.rows) {
    const bool gap = std::any_of(kKnownGaps.begin(), kKnownGaps.end(),
                                 [&](const std::string& g) { return row.file.find(g) != std::string::npos; });
    EXPECT_LE(std::fabs(row.error_pct), gap ? 50.0 : 30.0) << row.file;
  }
  // Published per-GPU memory (Korthikanti 2022 Fig. 1 on the four SP + selective runs):
  // `dtsim validate`'s default, every point within 10% (measured: MAPE 2.4%, worst +8.9%,
  // 22B activations, which on its single stage include the fp32 logits and one layer's
  // recompute working set that the figure leaves out).
  ASSERT_GE(rep.memory_rows.size(), 8u);
  for (const auto& row : rep.memory_rows) EXPECT_LE(std::fabs(row.error_pct), 10.0) << row.file << " " << row.metric;
}

TEST(Validation, MemoryOnlyExperimentIsComparedWithoutSimulating) {
  const std::string dir = ::testing::TempDir() + "/dtsim_memory_only";
  std::filesystem::create_directories(dir);
  std::string text;
  {
    std::ifstream in(kRoot + "/experiments/validation/korthikanti-gpt-22b-selective.yaml");
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  // Keep the memory figures only.
  for (const char* key : {"  step_time_s: 1.1\n", "  mfu: 0.415\n"}) {
    const auto at = text.find(key);
    ASSERT_NE(at, std::string::npos) << key;
    text.erase(at, std::string(key).size());
  }
  std::ofstream(dir + "/mem.yaml") << text;
  const auto rep = validate_experiments({dir + "/mem.yaml"});
  EXPECT_TRUE(rep.rows.empty());
  ASSERT_EQ(rep.memory_rows.size(), 2u);
  EXPECT_EQ(rep.memory_rows[0].metric, "model states (GiB)");
  EXPECT_NEAR(rep.memory_rows[0].published, 45.5625, 1e-12);
  EXPECT_NE(format_validation(rep).find("2 memory points compared"), std::string::npos);
  // A stage the layout does not have is an input error naming the key.
  std::string bad = text;
  bad.replace(bad.find("model_states: {stage: 0"), std::string("model_states: {stage: 0").size(),
              "model_states: {stage: 3");
  std::ofstream(dir + "/bad.yaml") << bad;
  try {
    validate_experiments({dir + "/bad.yaml"});
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("published.memory.model_states.stage=3 is not a pipeline stage (layout.pp=1"),
              std::string::npos)
        << e.what();
  }
}

// The forced-balance vs dropless pair of Mixtral-8x22B (ModelZoo: 465 vs 445 TFLOP/s, dropless
// 4.3% slower) shows the imbalance cost in the right direction: dropless is slower and the
// padded capacity-factor-1.0 run costs what forced balance costs, but for the token
// dispatcher's host synchronisation that drop-and-pad avoids (Op::host_sync; the forced run
// routes dropless): equal with free launches, padded faster with the node's launch cost. Its
// size is too large today (dtsim: 34% slower; models/moe.hpp's aux-loss MaxVio 0.72 comes from
// a 64-expert 1B model, Wang et al. 2024 Table 1); the test states the direction, not the size.
TEST(Validation, MoeImbalanceCostHasTheRightDirection) {
  const std::string src = kRoot + "/experiments/validation/";
  const test_files::TempDir tmp;
  const std::string dir = tmp.path().string();
  auto tflops = [&](const std::string& tag, const ValidationReport& rep) {
    for (const auto& r : rep.rows)
      if (r.file.find(tag) != std::string::npos) return r.simulated;
    ADD_FAILURE() << tag << " missing";
    return 0.0;
  };
  for (const bool free_launches : {true, false}) {
    std::vector<std::string> files;
    for (const char* name : {"modelzoo-mixtral-8x22b-forced.yaml", "modelzoo-mixtral-8x22b-dropless.yaml",
                             "modelzoo-mixtral-8x22b-capacity1.yaml"}) {
      std::ifstream in(src + name);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t at = text.find("\ncluster:\n");
      ASSERT_NE(at, std::string::npos) << name;
      if (free_launches) text.insert(at + 10, "  host_dispatch: 0 s\n");
      files.push_back(dir + "/" + name);
      std::ofstream(files.back()) << text;
    }
    const auto rep = validate_experiments(files);
    ASSERT_EQ(rep.rows.size(), 3u);
    const double forced = tflops("-forced", rep), dropless = tflops("-dropless", rep), padded = tflops("-capacity1", rep);
    EXPECT_LT(dropless, forced);  // TFLOP/s: dropless is slower
    if (free_launches) EXPECT_NEAR(padded, forced, 1e-9 * forced);
    else EXPECT_GT(padded, forced);
  }
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
