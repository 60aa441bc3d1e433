#include "topologies/collective_names.hpp"

namespace dtsim {

const std::vector<std::string>& collective_algorithm_names() {
  static const std::vector<std::string> names = {"auto", "ring", "tree", "nvls", "hierarchical", "direct", "deepep", "p2p"};
  return names;
}

const std::vector<std::string>& collective_protocol_names() {
  static const std::vector<std::string> names = {"auto", "simple", "ll", "ll128"};
  return names;
}

}  // namespace dtsim
