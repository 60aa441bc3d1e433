#pragma once
// The SimGrid engine as a plugin: libdtsim_simgrid.so beside the dtsim executable, which
// loads it with dlopen the first time a command simulates with SimGrid
// (sim/cli/engine_loader.cpp). Commands that never simulate with SimGrid (an analytic-only
// sweep, validate, presets, ...) then start without loading libsimgrid and the ns-3 and Boost
// libraries it needs (about 25 ms of dynamic linking per process on a 2-core machine). The
// library tests and benchmarks link the engine directly (sim/engine.hpp), as before.
//
// The plugin exports one C symbol, kSimgridPluginSymbol, returning this table: the engine's
// public functions (sim/engine.hpp, sim/collectives/simulate.hpp) and the sizes of the types
// they pass, which the loader checks so that a plugin from another build is refused.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "sim/collectives/simulate.hpp"
#include "sim/engine.hpp"

namespace dtsim {

inline constexpr int kSimgridPluginAbi = 1;
inline constexpr const char* kSimgridPluginSymbol = "dtsim_simgrid_plugin";
inline constexpr const char* kSimgridPluginFile = "libdtsim_simgrid.so";

struct SimgridPlugin {
  int abi = 0;
  size_t experiment_size = 0, options_size = 0, result_size = 0, cluster_size = 0, run_size = 0,
         timing_size = 0, flow_size = 0;
  StepResult (*simulate_step)(const Experiment&, const EngineOptions&) = nullptr;
  StepResult (*simulate_step_isolated)(const Experiment&, const EngineOptions&) = nullptr;
  void (*simulate_steps_isolated)(size_t, int, const std::function<Experiment(size_t)>&,
                                  const std::function<void(size_t, StepResult&&, std::exception_ptr)>&,
                                  const EngineOptions&) = nullptr;
  EngineBudget (*engine_budget)(const Experiment&, const EngineOptions&) = nullptr;
  void (*check_engine_limits)(const Experiment&, const EngineOptions&, const std::string&, int64_t) = nullptr;
  std::vector<collectives::CollectiveTiming> (*simulate_collectives)(const ClusterSpec&,
                                                                     const std::vector<collectives::CollectiveRun>&,
                                                                     bool, bool) = nullptr;
  std::vector<collectives::CollectiveTiming> (*simulate_collectives_isolated)(
      const ClusterSpec&, const std::vector<collectives::CollectiveRun>&, bool, bool) = nullptr;
  std::vector<double> (*simulate_transfers_isolated)(const ClusterSpec&, const std::vector<collectives::Flow>&) = nullptr;
};

/// The table as this build fills it (the plugin's entry point returns it; the loader compares
/// its abi and sizes with its own).
inline SimgridPlugin simgrid_plugin_layout() {
  SimgridPlugin p;
  p.abi = kSimgridPluginAbi;
  p.experiment_size = sizeof(Experiment);
  p.options_size = sizeof(EngineOptions);
  p.result_size = sizeof(StepResult);
  p.cluster_size = sizeof(ClusterSpec);
  p.run_size = sizeof(collectives::CollectiveRun);
  p.timing_size = sizeof(collectives::CollectiveTiming);
  p.flow_size = sizeof(collectives::Flow);
  return p;
}

}  // namespace dtsim
