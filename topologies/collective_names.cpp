#include "topologies/collective_names.hpp"

namespace dtsim {

const std::vector<std::string>& collective_algorithm_names() {
  // "auto" and the names of sim/collectives/registry.cpp, in its order (no figures; the test
  // Collectives.RegistryNamesMatchTheYamlReader keeps the two lists equal).
  static const std::vector<std::string> names = {"auto", "ring", "tree", "nvls", "hierarchical", "direct", "deepep", "p2p"};
  return names;
}

const std::vector<std::string>& collective_protocol_names() {
  static const std::vector<std::string> names = {"auto", "simple", "ll", "ll128"};
  return names;
}

}  // namespace dtsim
