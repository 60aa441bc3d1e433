#pragma once
// The cross-section checks of an experiment (models/experiment_check.cpp): every constraint
// that joins keys of different sections (the layout against the model and the cluster, the
// training against the layout, the stated count limits of models/checked.hpp, the published
// figures), each problem naming its keys and the violated constraint. Read by
// models/experiment_io.cpp after parsing (parse_experiment, validate_experiment,
// experiment_problems); sweeps re-check each generated layout through validate_experiment.
#include <set>
#include <string>

#include "models/errors.hpp"
#include "models/experiment.hpp"

namespace dtsim {

/// Adds to `p` every constraint `e` violates. `bad`: dotted keys (or whole sections) that
/// already have a parse problem; checks that read them are skipped, so that one mistake gives
/// one message. Never throws for a bad experiment (the caller throws ProblemList's list).
void check_experiment(const Experiment& e, ProblemList& p, const std::set<std::string>& bad);

}  // namespace dtsim
