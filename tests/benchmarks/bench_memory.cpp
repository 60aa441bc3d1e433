// The memory-only path (models/memory.hpp memory_per_stage / peak_memory) for layout sweeps:
// no step plan is built. Target: well under a millisecond per layout.
//   ./build/tests/dtsim_benchmarks --benchmark_filter=Memory
#include <benchmark/benchmark.h>

#include <string>

#include "models/experiment_io.hpp"
#include "models/memory.hpp"

namespace dtsim {
namespace {

// GPT-3 175B (Korthikanti 2022 Table 3 config) on 64 A100s; `pp` pipeline stages.
Experiment gpt3(int64_t tp, int64_t pp, int64_t vp) {
  const std::string yaml =
      "model: {name: GPT-3 175B, layers: 96, hidden: 12288, heads: 96, kv_heads: 96, ffn_hidden: 49152,\n"
      "        activation: gelu, vocab: 51200, tied_embeddings: true, norm: layernorm, position: learned}\n"
      "cluster: {node: dgx-a100, nodes: 8}\n"
      "layout: {dp: " + std::to_string(64 / (tp * pp)) + ", tp: " + std::to_string(tp) + ", pp: " + std::to_string(pp) +
      ", vp: " + std::to_string(vp) + ", zero_stage: 1, sequence_parallel: true, recompute: selective}\n"
      "training: {seq_len: 2048, global_batch: 512, micro_batch: 1, dtype: bf16}\n";
  return parse_experiment(yaml, "bench.yaml");
}

void BM_MemoryPeak_Gpt3_Pp8Vp3(benchmark::State& state) {
  const Experiment e = gpt3(8, 8, 3);
  for (auto _ : state) benchmark::DoNotOptimize(peak_memory(e));
}
BENCHMARK(BM_MemoryPeak_Gpt3_Pp8Vp3);

void BM_MemoryPerStage_Gpt3_Pp32(benchmark::State& state) {
  const Experiment e = gpt3(2, 32, 1);
  for (auto _ : state) benchmark::DoNotOptimize(memory_per_stage(e));
}
BENCHMARK(BM_MemoryPerStage_Gpt3_Pp32);

void BM_MemorySweep_Gpt3_AllLayouts(benchmark::State& state) {
  // Every (tp, pp) with tp * pp dividing 64 and pp dividing 96: one peak_memory per layout.
  std::vector<Experiment> layouts;
  for (int64_t tp : {1, 2, 4, 8})
    for (int64_t pp : {1, 2, 4, 8, 16, 32})
      if (64 % (tp * pp) == 0) layouts.push_back(gpt3(tp, pp, 1));
  for (auto _ : state)
    for (const auto& e : layouts) benchmark::DoNotOptimize(peak_memory(e));
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(layouts.size()));
  state.counters["layouts"] = static_cast<double>(layouts.size());
}
BENCHMARK(BM_MemorySweep_Gpt3_AllLayouts);

}  // namespace
}  // namespace dtsim

BENCHMARK_MAIN();
