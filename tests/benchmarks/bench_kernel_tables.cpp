// The shipped GEMM kernel tables (models/calibration/gemm_table.hpp): parsing one embedded
// table (done once per process, on first use) and one lookup (done for every GEMM op of a
// plan). Targets: parsing well under 100 ms per table; a lookup well under a microsecond.
//   ./build/tests/dtsim_bench_kernel_tables
#include <benchmark/benchmark.h>

#include <string>

#include "models/calibration/embedded_tables.hpp"
#include "models/calibration/gemm_table.hpp"

namespace dtsim::calib {
namespace {

void BM_KernelTableParse(benchmark::State& state) {
  const EmbeddedTable& t = embedded_tables().front();
  for (auto _ : state) benchmark::DoNotOptimize(GemmTable::parse(t.text, std::string(t.name)));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(t.text.size()));
}
BENCHMARK(BM_KernelTableParse)->Unit(benchmark::kMillisecond);

void BM_KernelTableLookup(benchmark::State& state) {
  const GemmTable* t = shipped_gemm_table("h100_sxm", Dtype::bf16);
  // Off-grid in m and k (interpolated), on the grid in n: a Llama-3 8B TP2 MLP GEMM.
  const GemmShape g{8192, 7168, 4096};
  for (auto _ : state) benchmark::DoNotOptimize(t->lookup(g));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_KernelTableLookup);

}  // namespace
}  // namespace dtsim::calib

BENCHMARK_MAIN();
