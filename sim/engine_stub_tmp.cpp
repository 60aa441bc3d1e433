// TEMPORARY stub until sim/simgrid_engine.cpp lands (owner: lead). Do not edit.
#include <stdexcept>
#include "sim/engine.hpp"
namespace dtsim {
StepResult simulate_step(const Experiment&, const EngineOptions&) { throw std::logic_error("engine not built yet"); }
StepResult simulate_step_isolated(const Experiment&, const EngineOptions&) { throw std::logic_error("engine not built yet"); }
}
