// The dtsim executable's SimGrid engine: sim/engine.hpp and sim/collectives/simulate.hpp
// forwarded to the plugin libdtsim_simgrid.so beside the executable
// (sim/plugin/simgrid_plugin.hpp), loaded on the first call that needs it. The executable
// itself does not link SimGrid (CMakeLists.txt), so that a command without a SimGrid
// simulation starts without it. These definitions take the place of the engine's own, which
// the library tests link directly.

#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>

#include "models/plugin_loader.hpp"
#include "sim/plugin/simgrid_plugin.hpp"

namespace dtsim {

namespace {

const SimgridPlugin& plugin() {
  static std::once_flag once;
  static const SimgridPlugin* loaded = nullptr;
  static std::string why;
  std::call_once(once, [] {
    const std::string path = path_beside_executable(kSimgridPluginFile);
    void* sym = open_plugin_symbol(path, kSimgridPluginSymbol, "the SimGrid engine",
                                   "it is built with dtsim and must sit beside the dtsim executable", why);
    if (!sym && why.rfind("cannot load", 0) == 0) return;
    using Entry = const SimgridPlugin* (*)();
    auto entry = reinterpret_cast<Entry>(sym);
    const SimgridPlugin* p = entry ? entry() : nullptr;
    const SimgridPlugin want = simgrid_plugin_layout();
    if (!p || p->abi != want.abi || p->experiment_size != want.experiment_size ||
        p->options_size != want.options_size || p->result_size != want.result_size ||
        p->cluster_size != want.cluster_size || p->run_size != want.run_size ||
        p->timing_size != want.timing_size || p->flow_size != want.flow_size || !p->simulate_step ||
        !p->simulate_step_isolated || !p->simulate_steps_isolated || !p->engine_budget ||
        !p->check_engine_limits || !p->simulate_collectives || !p->simulate_collectives_isolated ||
        !p->simulate_transfers_isolated) {
      why = path + " is not the SimGrid engine of this dtsim build (entry point " + kSimgridPluginSymbol +
            " missing or its interface differs): rebuild dtsim and the plugin together";
      return;
    }
    loaded = p;
  });
  if (!loaded) throw std::runtime_error(why);
  return *loaded;
}

}  // namespace

EngineBudget engine_budget(const Experiment& exp, const EngineOptions& opts) {
  return plugin().engine_budget(exp, opts);
}

void check_engine_limits(const Experiment& exp, const EngineOptions& opts, const std::string& where,
                         int64_t physical_bytes) {
  plugin().check_engine_limits(exp, opts, where, physical_bytes);
}

StepResult simulate_step(const Experiment& exp, const EngineOptions& opts) { return plugin().simulate_step(exp, opts); }

StepResult simulate_step_isolated(const Experiment& exp, const EngineOptions& opts) {
  return plugin().simulate_step_isolated(exp, opts);
}

void simulate_steps_isolated(size_t count, int jobs, const std::function<Experiment(size_t)>& experiment,
                             const std::function<void(size_t, StepResult&&, std::exception_ptr)>& done,
                             const EngineOptions& opts) {
  if (count == 0) return;  // nothing to simulate (e.g. a sweep with --refine-top 0): no engine loaded
  plugin().simulate_steps_isolated(count, jobs, experiment, done, opts);
}

namespace collectives {

std::vector<CollectiveTiming> simulate_collectives(const ClusterSpec& cluster, const std::vector<CollectiveRun>& runs,
                                                   bool fold, bool sample_planes) {
  return plugin().simulate_collectives(cluster, runs, fold, sample_planes);
}

std::vector<CollectiveTiming> simulate_collectives_isolated(const ClusterSpec& cluster,
                                                            const std::vector<CollectiveRun>& runs, bool fold,
                                                            bool sample_planes) {
  return plugin().simulate_collectives_isolated(cluster, runs, fold, sample_planes);
}

std::vector<double> simulate_transfers_isolated(const ClusterSpec& cluster, const std::vector<Flow>& flows) {
  return plugin().simulate_transfers_isolated(cluster, flows);
}

}  // namespace collectives

}  // namespace dtsim
