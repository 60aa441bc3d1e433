// Speed of the collective simulation (issue 4 targets, one core):
//   - a 16,384-GPU ring AllReduce (2,048 DGX H100 nodes): <= 2 s wall;
//   - 128 concurrent 8-GPU groups x 1,000 AllReduces each: <= 10 s wall.
// Each iteration forks a child with a fresh SimGrid engine (one engine per process), so the
// figures include the fork, the platform build (topology graph + SimGrid links) and the
// simulation. Run: ./build/tests/dtsim_bench_collectives
#include <benchmark/benchmark.h>

#include <vector>

#include "sim/collectives/collective.hpp"
#include "sim/collectives/simulate.hpp"
#include "sim/collectives/tuner.hpp"
#include "topologies/gpu_presets.hpp"
#include "topologies/node_presets.hpp"

namespace dtsim::collectives {
namespace {

ClusterSpec dgx_h100(int64_t nodes) { return cluster_of(node_preset("dgx-h100"), nodes); }

void BM_CollectiveRingAllReduce16kGpus(benchmark::State& state) {
  const ClusterSpec c = dgx_h100(2048);
  CollectiveRun r;
  for (int64_t g = 0; g < c.gpus(); ++g) r.members.push_back(g);
  r.bytes = 1 << 30;
  r.choice.algorithm = "ring";
  r.choice.protocol = "simple";
  double simulated = 0;
  for (auto _ : state) simulated = simulate_collectives_isolated(c, {r})[0].time_s;
  state.counters["simulated_s"] = simulated;
  state.counters["flows"] = static_cast<double>(c.gpus());  // one per NIC at node boundaries
}
BENCHMARK(BM_CollectiveRingAllReduce16kGpus)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);

/// 128 groups of 8 GPUs, 1,000 AllReduces of 64 MiB each, all groups at once. Arg 0: one
/// group per DGX H100 node (NVLink: closed form); arg 1: each group one GPU on 8 nodes (rail
/// rings across nodes: flows on the NICs).
void BM_CollectiveConcurrentGroups(benchmark::State& state) {
  const bool across = state.range(0) == 1;
  const ClusterSpec c = dgx_h100(128);
  std::vector<CollectiveRun> runs;
  for (int64_t grp = 0; grp < 128; ++grp) {
    CollectiveRun r;
    for (int64_t i = 0; i < 8; ++i) {
      // across: block of 8 nodes grp / 8, rail grp % 8.
      r.members.push_back(across ? ((grp / 8) * 8 + i) * 8 + grp % 8 : grp * 8 + i);
    }
    r.bytes = 64.0 * (1 << 20);
    r.repeat = 1000;
    runs.push_back(std::move(r));
  }
  double simulated = 0;
  for (auto _ : state) simulated = simulate_collectives_isolated(c, runs)[0].time_s;
  state.counters["simulated_s_per_allreduce"] = simulated;
}
BENCHMARK(BM_CollectiveConcurrentGroups)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

/// `dtsim collective --cluster dgx-h100 --gpus N --op OP` as the command runs it (issue 17
/// targets, this 2-core machine): every GPU in the group, the automatic algorithm, one size
/// (state.range(2) = 1: 1 GiB) or nccl-tests' default 31 sizes (8 B to 8 GiB by 2; 0).
/// Args: op (0 AllReduce, 1 AllToAll), GPUs, one size. Targets: AllToAll over 1,024 GPUs at
/// one size < 1 s; AllReduce over 16,384 GPUs, 31 sizes < 60 s.
void BM_CollectiveCommand(benchmark::State& state) {
  const CollOp op = state.range(0) == 1 ? CollOp::AllToAll : CollOp::AllReduce;
  const int64_t n = state.range(1);
  const ClusterSpec c = dgx_h100(n / 8);
  std::vector<double> sizes;
  if (state.range(2) == 1) sizes.push_back(1 << 30);
  else
    for (double b = 8; b <= 8.0 * (1 << 30); b *= 2) sizes.push_back(b);
  std::vector<CollectiveRun> runs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    CollectiveRun r;
    for (int64_t g = 0; g < n; ++g) r.members.push_back(g);
    r.op = op;
    r.bytes = sizes[i];
    r.batch = static_cast<int>(i);
    runs.push_back(std::move(r));
  }
  double simulated = 0;
  for (auto _ : state) simulated = simulate_collectives_isolated(c, runs).back().time_s;
  state.counters["sizes"] = static_cast<double>(sizes.size());
  state.counters["simulated_s_largest"] = simulated;
}
BENCHMARK(BM_CollectiveCommand)
    ->Args({1, 1024, 1})
    ->Args({0, 1024, 0})
    ->Args({1, 1024, 0})
    ->Args({1, 16384, 1})
    ->Args({0, 16384, 0})
    ->ArgNames({"alltoall", "gpus", "one_size"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);

/// The tuner's choice for one 8-GPU AllReduce (closed forms of every candidate).
void BM_CollectiveTunerChoice(benchmark::State& state) {
  const ClusterSpec c = dgx_h100(1);
  const GroupLayout g = GroupLayout::first(8, 8, 1);
  const CommModel m = CommModel::of(c);
  const CollectiveChoice want;
  double bytes = 8;
  for (auto _ : state) {
    benchmark::DoNotOptimize(choose(CollOp::AllReduce, g, m, bytes, want, false));
    bytes = bytes < 1e10 ? bytes * 2 : 8;
  }
}
BENCHMARK(BM_CollectiveTunerChoice);

}  // namespace
}  // namespace dtsim::collectives

BENCHMARK_MAIN();
