// Start-up of the dtsim executable (issue 17 target: `dtsim --version` under 30 ms on this
// 2-core machine). Each iteration spawns build/dtsim with the arguments below, output to
// /dev/null, and waits for it: process creation, dynamic loading (yaml-cpp, fmt, libstdc++;
// not SimGrid with its ns-3 and Boost libraries, which the first SimGrid simulation loads
// through its plugin, sim/plugin/simgrid_plugin.hpp, nor the CUDA runtime or cuBLASLt, which
// only `dtsim calibrate` loads through its plugin, models/calibration/measure.hpp) and static
// initialisation.
//   ./build/tests/dtsim_bench_startup
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace {

void run_dtsim(std::vector<std::string> args) {
  const std::string exe = std::string(DTSIM_BINARY_DIR) + "/dtsim";
  args.insert(args.begin(), exe);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot start " + exe);
  int status = 0;
  waitpid(pid, &status, 0);
}

void BM_StartupVersion(benchmark::State& state) {
  for (auto _ : state) run_dtsim({"--version"});
}
BENCHMARK(BM_StartupVersion)->Unit(benchmark::kMillisecond)->UseRealTime();

/// A whole small run: GPT-3 175B on 64 A100, folded, summary to /dev/null.
void BM_StartupSmallRun(benchmark::State& state) {
  for (auto _ : state) run_dtsim({"run", std::string(DTSIM_SOURCE_DIR) + "/experiments/gpt3-175b-selective.yaml", "-q"});
}
BENCHMARK(BM_StartupSmallRun)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
