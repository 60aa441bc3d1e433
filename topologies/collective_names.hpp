#pragma once
// The names cluster.collectives accepts, for the experiment reader (models/ cannot see the
// algorithm registry in sim/collectives/registry.cpp, which tests/unit/test_collectives.cpp
// checks against this list).
#include <string>
#include <vector>

namespace dtsim {

/// "auto" then every registered collective algorithm: auto, ring, tree, nvls, hierarchical,
/// direct, p2p.
const std::vector<std::string>& collective_algorithm_names();
/// NCCL protocols: auto, simple, ll, ll128.
const std::vector<std::string>& collective_protocol_names();

}  // namespace dtsim
