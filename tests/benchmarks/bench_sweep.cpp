// Speed of the sweep machinery (the targets, measured here and never in tests):
//   - analytic engine: >= 50,000 layouts/s on one core, a 70B model on 1,024 GPUs
//     (BM_AnalyticEstimate: the engine alone on every valid layout of
//     experiments/sweeps/llama3-70b-1024-h100.yaml, per-shape costs already cached as in a
//     sweep; BM_AnalyticSweepRow: validation + estimate + row, what the sweep pays per point);
//   - the whole sweep of that file (>= 2,000 valid layouts, SimGrid on the best 20, 2 jobs)
//     within 2 minutes on 2 cores (BM_Sweep70B1024, one iteration, real time);
//   - MoE (issue 16): the ep x etp x tp x pp sweep of DeepSeek-V3 on 2,048 GPUs
//     (experiments/sweeps/deepseek-v3-2048-h100.yaml) at >= 50,000 layouts/s in the analytic
//     engine (BM_AnalyticEstimateDeepSeekV3 on its valid layouts, BM_AnalyticSweepRowDeepSeekV3
//     on every point, invalid ones included).
//   - the output path (issue: sweep output at engine speed): an analytic-only sweep of that
//     file, journal and every final output included, in under 0.1 s (BM_AnalyticOnlySweep70B:
//     run_sweep with refine_top 0 + write_outputs into a fresh directory, as
//     `dtsim sweep ... --refine-top 0 -q` without the process start; BM_SweepWriteOutputs70B:
//     write_outputs alone, results.csv, ranked.csv, sweep.json, report.html and report.md
//     from the finished outcome).
// Run: build/tests/dtsim_bench_sweep --benchmark_filter=Analytic|Sweep
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "models/sweep_spec.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/sweep/runner.hpp"
#include "sim/sweep/sweep.hpp"

namespace {

namespace fs = std::filesystem;
using namespace dtsim;

const std::string kSweep = std::string(DTSIM_SOURCE_DIR) + "/experiments/sweeps/llama3-70b-1024-h100.yaml";

const std::string kMoeSweep = std::string(DTSIM_SOURCE_DIR) + "/experiments/sweeps/deepseek-v3-2048-h100.yaml";

struct Fixture {
  explicit Fixture(const std::string& file = kSweep);
  SweepSpec spec;
  std::vector<sweep::LayoutPoint> points;
  std::vector<sweep::LayoutPoint> valid;
};

Fixture::Fixture(const std::string& file)
    : spec(load_sweep_spec(file, SpecKind::sweep)), points(sweep::enumerate_layouts(spec)) {
  sweep::Evaluator ev(spec);
  for (const auto& p : points)
    if (ev.analytic(p).valid()) valid.push_back(p);
}

const Fixture& fixture() {
  static const Fixture f;
  return f;
}
const Fixture& moe_fixture() {
  static const Fixture f(kMoeSweep);
  return f;
}

void analytic_estimate(benchmark::State& state, const Fixture& f) {
  AnalyticEngine eng(f.spec.clusters[0].base);
  for (const auto& p : f.valid) eng.estimate(p.layout, p.micro_batch);  // warm the shape cache
  size_t i = 0;
  for (auto _ : state) {
    const auto& p = f.valid[i++ % f.valid.size()];
    benchmark::DoNotOptimize(eng.estimate(p.layout, p.micro_batch));
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["valid_layouts"] = static_cast<double>(f.valid.size());
}
void BM_AnalyticEstimate(benchmark::State& state) { analytic_estimate(state, fixture()); }
void BM_AnalyticEstimateDeepSeekV3(benchmark::State& state) { analytic_estimate(state, moe_fixture()); }
BENCHMARK(BM_AnalyticEstimate);
BENCHMARK(BM_AnalyticEstimateDeepSeekV3);

void analytic_sweep_row(benchmark::State& state, const Fixture& f) {
  sweep::Evaluator ev(f.spec);
  for (const auto& p : f.points) ev.analytic(p);
  size_t i = 0;
  for (auto _ : state) {
    const auto& p = f.points[i++ % f.points.size()];
    benchmark::DoNotOptimize(ev.analytic(p));
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["points"] = static_cast<double>(f.points.size());
}
void BM_AnalyticSweepRow(benchmark::State& state) { analytic_sweep_row(state, fixture()); }
void BM_AnalyticSweepRowDeepSeekV3(benchmark::State& state) { analytic_sweep_row(state, moe_fixture()); }
BENCHMARK(BM_AnalyticSweepRow);
BENCHMARK(BM_AnalyticSweepRowDeepSeekV3);

void BM_Sweep70B1024(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) {
    std::string tmpl = (fs::temp_directory_path() / "dtsim-bench-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) state.SkipWithError("mkdtemp failed");
    sweep::RunOptions o;
    o.out_dir = tmpl;
    o.progress = false;
    o.jobs = 2;
    o.refine_top = 20;
    const sweep::Outcome out = sweep::run_sweep(f.spec, o);
    sweep::write_outputs(f.spec, out, tmpl);
    int64_t valid = 0;
    for (const auto& r : out.analytic) valid += r.valid() ? 1 : 0;
    state.counters["layouts"] = static_cast<double>(out.analytic.size());
    state.counters["valid"] = static_cast<double>(valid);
    state.counters["refined"] = static_cast<double>(out.simgrid.size());
    fs::remove_all(tmpl);
  }
}
BENCHMARK(BM_Sweep70B1024)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

std::string temp_dir(benchmark::State& state) {
  std::string tmpl = (fs::temp_directory_path() / "dtsim-bench-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) state.SkipWithError("mkdtemp failed");
  return tmpl;
}

void BM_AnalyticOnlySweep70B(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) {
    state.PauseTiming();
    const std::string dir = temp_dir(state);
    state.ResumeTiming();
    sweep::RunOptions o;
    o.out_dir = dir;
    o.progress = false;
    o.refine_top = 0;
    const sweep::Outcome out = sweep::run_sweep(f.spec, o);
    sweep::write_outputs(f.spec, out, dir);
    state.PauseTiming();
    state.counters["layouts"] = static_cast<double>(out.analytic.size());
    fs::remove_all(dir);
    state.ResumeTiming();
  }
}
BENCHMARK(BM_AnalyticOnlySweep70B)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_SweepWriteOutputs70B(benchmark::State& state) {
  const Fixture& f = fixture();
  const std::string run_dir = temp_dir(state);
  sweep::RunOptions o;
  o.out_dir = run_dir;
  o.progress = false;
  o.refine_top = 0;
  const sweep::Outcome out = sweep::run_sweep(f.spec, o);
  for (auto _ : state) {
    state.PauseTiming();
    const std::string dir = temp_dir(state);
    state.ResumeTiming();
    sweep::write_outputs(f.spec, out, dir);
    state.PauseTiming();
    fs::remove_all(dir);
    state.ResumeTiming();
  }
  state.counters["rows"] = static_cast<double>(out.analytic.size() + out.simgrid.size());
  fs::remove_all(run_dir);
}
BENCHMARK(BM_SweepWriteOutputs70B)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
