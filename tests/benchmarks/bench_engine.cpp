// Speed of one simulated training step on the SimGrid engine (issue 5 targets):
//   Llama-3-405B-size on 16,384 H100 (TP8 PP16 DP128): <= 60 s wall, <= 4 GiB RSS;
//   GPT-3 175B on 1,024 A100: <= 5 s wall.
//   DeepSeek-V3 on 2,048 H100 (TP1 PP16 EP64 DP128, 120 micro-batches, issue 16): < 5 s wall.
// Each iteration simulates in a forked child (one SimGrid engine per process), so the
// time includes fork and plan building; child_max_rss_MiB is the largest child RSS.
//
// Unfolded (every rank simulated, issue 17), the 405B file at 512 / 4,096 / 16,384 GPUs with
// the data-parallel size scaled (16 micro-batches per rank throughout, so the work per rank
// is constant and the cost exponent reads off the three points), dense ZeRO-1, ZeRO-3 and
// CP 2: BM_StepUnfolded/<gpus>/<variant> (variant 0 dense, 1 ZeRO-3, 2 CP 2). The 16,384
// runs take minutes: run them by name, e.g.
//   ./build/tests/dtsim_bench_engine --benchmark_filter='Unfolded/(512|4096)/'
//   ./build/tests/dtsim_bench_engine
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <string>

#include "models/experiment_io.hpp"
#include "sim/engine.hpp"

namespace {

void simulate_file(benchmark::State& state, const std::string& rel, bool fold) {
  const auto exp = dtsim::load_experiment(std::string(DTSIM_SOURCE_DIR) + "/" + rel);
  double step = 0;
  for (auto _ : state) step = dtsim::simulate_step_isolated(exp, dtsim::EngineOptions{.fold = fold}).step_time_s;
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  state.counters["child_max_rss_MiB"] = static_cast<double>(ru.ru_maxrss) / 1024.0;
  state.counters["simulated_step_s"] = step;
}

void BM_StepLlama405B_16K_H100(benchmark::State& s) { simulate_file(s, "experiments/scale/llama3-405b-16k-h100.yaml", true); }
void BM_StepGpt3_175B_1024_A100(benchmark::State& s) { simulate_file(s, "experiments/scale/gpt3-175b-1024-a100.yaml", true); }
void BM_StepDeepSeekV3_2048_H100(benchmark::State& s) {
  simulate_file(s, "experiments/scale/deepseek-v3-2048-h100.yaml", true);
}
void BM_StepGpt3_175B_64_A100(benchmark::State& s) { simulate_file(s, "experiments/gpt3-175b-selective.yaml", true); }
void BM_StepGpt3_175B_64_A100_Unfolded(benchmark::State& s) {
  simulate_file(s, "experiments/gpt3-175b-selective.yaml", false);
}

void BM_StepUnfolded(benchmark::State& state) {
  auto exp = dtsim::load_experiment(std::string(DTSIM_SOURCE_DIR) + "/experiments/scale/llama3-405b-16k-h100.yaml");
  const int64_t gpus = state.range(0);
  const int64_t variant = state.range(1);
  exp.cluster.nodes = gpus / exp.cluster.gpus_per_node;
  exp.layout.dp = gpus / (exp.layout.tp * exp.layout.pp);
  if (variant == 1) exp.layout.zero_stage = 3;
  if (variant == 2) {
    exp.layout.cp = 2;
    exp.layout.dp /= 2;
  }
  exp.training.global_batch = exp.layout.dp * 16;
  double step = 0;
  int64_t ranks = 0;
  for (auto _ : state) {
    const auto r = dtsim::simulate_step_isolated(exp, dtsim::EngineOptions{.fold = false});
    step = r.step_time_s;
    ranks = r.simulated_ranks;
  }
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  state.counters["child_max_rss_MiB"] = static_cast<double>(ru.ru_maxrss) / 1024.0;
  state.counters["simulated_step_s"] = step;
  state.counters["simulated_ranks"] = static_cast<double>(ranks);
}

BENCHMARK(BM_StepLlama405B_16K_H100)->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(BM_StepUnfolded)
    ->ArgsProduct({{512, 4096, 16384}, {0, 1, 2}})
    ->ArgNames({"gpus", "variant"})
    ->Unit(benchmark::kSecond)
    ->Iterations(1);
BENCHMARK(BM_StepGpt3_175B_1024_A100)->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(BM_StepDeepSeekV3_2048_H100)->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK(BM_StepGpt3_175B_64_A100)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_StepGpt3_175B_64_A100_Unfolded)->Unit(benchmark::kSecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
