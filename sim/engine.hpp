#pragma once
// The engine interface. SimGrid stays behind this header: nothing outside sim/ includes
// <simgrid/...>.
#include <cstddef>
#include <exception>
#include <functional>
#include <string>

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

/// What one SimGrid step of `exp` costs before it runs: ranks simulated, rank-operations
/// (models/checked.hpp kMaxSimulatedOps) and the engine's memory estimate in bytes (the
/// step plan at ~150 B per op plus kEngineBytesPerRank per simulated rank).
struct EngineBudget {
  int64_t simulated_ranks = 0;
  int64_t simulated_ops = 0;
  int64_t memory_bytes = 0;
};
EngineBudget engine_budget(const Experiment& exp, const EngineOptions& opts);

/// Throws InputError, naming `where` (the experiment file), the option, the figure and the
/// limit, when the step would exceed what this machine allows: simulated ranks above
/// limits::kMaxSimulatedRanks, rank-operations above limits::kMaxSimulatedOps, or the
/// memory estimate above the machine's physical memory
/// (sysconf _SC_PHYS_PAGES). simulate_step checks it before planning; dtsim run before
/// anything else.
/// `physical_bytes` > 0 stands for the machine's memory (tests).
void check_engine_limits(const Experiment& exp, const EngineOptions& opts, const std::string& where,
                         int64_t physical_bytes = 0);

/// Simulates one training step of `exp` on the SimGrid engine in this process.
/// SimGrid keeps one engine per process: call this at most once per process unless
/// `run_in_child` is used (see simulate_step_isolated).
/// Throws InputError for experiments that cannot be planned; never exits.
StepResult simulate_step(const Experiment& exp, const EngineOptions& opts = {});

/// Same, but runs the simulation in a forked child process and returns its result,
/// so that several simulations can run in one process (tests, sweeps).
StepResult simulate_step_isolated(const Experiment& exp, const EngineOptions& opts = {});

/// Several simulate_step_isolated at once without threads: experiment i (`experiment(i)`,
/// called in this process in index order) is planned here and simulated in a child process
/// of its own, at most `jobs` children at a time, all forked by the calling thread
/// (sim/child_process.hpp run_in_children: why no thread may fork). `done(i, result, error)`
/// runs here as each ends, in completion order; `error` holds what simulate_step_isolated
/// would have thrown (or what `experiment(i)` threw), `result` is then empty. An exception
/// from `done` kills the children still running and propagates.
void simulate_steps_isolated(size_t count, int jobs, const std::function<Experiment(size_t)>& experiment,
                             const std::function<void(size_t, StepResult&&, std::exception_ptr)>& done,
                             const EngineOptions& opts = {});

}  // namespace dtsim
