// The entry point of libdtsim_simgrid.so (sim/plugin/simgrid_plugin.hpp): the SimGrid
// engine's functions, linked in from dtsim_sim, behind one exported C symbol.
#include "sim/plugin/simgrid_plugin.hpp"

extern "C" __attribute__((visibility("default"))) const dtsim::SimgridPlugin* dtsim_simgrid_plugin() {
  static const dtsim::SimgridPlugin plugin = [] {
    dtsim::SimgridPlugin p = dtsim::simgrid_plugin_layout();
    p.simulate_step = &dtsim::simulate_step;
    p.simulate_step_isolated = &dtsim::simulate_step_isolated;
    p.simulate_steps_isolated = &dtsim::simulate_steps_isolated;
    p.engine_budget = &dtsim::engine_budget;
    p.check_engine_limits = &dtsim::check_engine_limits;
    p.simulate_collectives = &dtsim::collectives::simulate_collectives;
    p.simulate_collectives_isolated = &dtsim::collectives::simulate_collectives_isolated;
    p.simulate_transfers_isolated = &dtsim::collectives::simulate_transfers_isolated;
    return p;
  }();
  return &plugin;
}
