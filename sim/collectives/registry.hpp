#pragma once
// The registry of collective algorithms by name (one file each in sim/collectives/):
// ring, tree, nvls, hierarchical, direct, deepep, p2p. An unknown name lists the valid ones.
#include <string>
#include <string_view>
#include <vector>

#include "sim/collectives/collective.hpp"

namespace dtsim::collectives {

/// Every registered algorithm, in registry order (the tuner breaks ties in this order).
const std::vector<const Algorithm*>& algorithms();
/// The algorithm named `name`, or nullptr.
const Algorithm* find_algorithm(std::string_view name);
/// Throws InputError(`unknown collective algorithm "X" (valid: ring, tree, ...)`).
const Algorithm& algorithm(std::string_view name);
std::vector<std::string> algorithm_names();
std::string algorithm_list();

// One per file; listed in registry.cpp.
const Algorithm& ring_algorithm();
const Algorithm& tree_algorithm();
const Algorithm& nvls_algorithm();
const Algorithm& hierarchical_algorithm();
const Algorithm& direct_algorithm();
const Algorithm& deepep_algorithm();
const Algorithm& p2p_algorithm();

}  // namespace dtsim::collectives
