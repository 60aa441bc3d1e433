#pragma once
// The engine interface. SimGrid stays behind this header: nothing outside sim/ includes
// <simgrid/...>.
#include "models/experiment.hpp"
#include "models/result.hpp"
#include "models/trace.hpp"

namespace dtsim {

struct EngineOptions {
  /// Simulate one representative rank per pipeline stage; its collectives and sends stand
  /// for the symmetric ranks' (sim/collective_exec.hpp FoldPolicy). tests/unit/
  /// test_engine.cpp checks folded == unfolded on small clusters (exact, or within 1%
  /// where pipeline and TP traffic share an NVLink port, e.g. interleaved schedules).
  bool fold = true;
  /// Record a timeline (one event per kernel, collective, transfer and wait). Kernels are
  /// then simulated one by one instead of in runs, which is slower.
  Trace* trace = nullptr;
};

/// Simulates one training step of `exp` on the SimGrid engine in this process.
/// SimGrid keeps one engine per process: call this at most once per process unless
/// `run_in_child` is used (see simulate_step_isolated).
/// Throws InputError for experiments that cannot be planned; never exits.
StepResult simulate_step(const Experiment& exp, const EngineOptions& opts = {});

/// Same, but runs the simulation in a forked child process and returns its result,
/// so that several simulations can run in one process (tests, sweeps).
StepResult simulate_step_isolated(const Experiment& exp, const EngineOptions& opts = {});

}  // namespace dtsim
