// Leaf-spine: all NICs of nodes_per_leaf consecutive nodes on one leaf; each leaf's uplink
// capacity is the NIC capacity below it divided by `oversubscription`; the spine layer is
// non-blocking.
#include <string>

#include "models/errors.hpp"
#include "topologies/fabrics/fabric.hpp"

namespace dtsim {
namespace {

void build(const ClusterSpec& c, Topology& topo) {
  const auto& s = c.fabric_shape;
  if (s.nodes_per_leaf <= 0)
    throw InputError("cluster.fabric.nodes_per_leaf=" + std::to_string(s.nodes_per_leaf) +
                     " must be a positive integer (fabric leaf-spine)");
  std::vector<int64_t> leaf_of(static_cast<size_t>(topo.nics()));
  for (int64_t i = 0; i < topo.nics(); ++i) leaf_of[static_cast<size_t>(i)] = (i / topo.nics_per_node()) / s.nodes_per_leaf;
  build_switch_tree(c, topo, leaf_of, s.oversubscription, 0, 1);
}

}  // namespace

const FabricType& leaf_spine_fabric() {
  static const FabricType t{"leaf-spine", "nodes_per_leaf nodes per leaf, leaf uplinks oversubscribed into a spine",
                            {"nodes_per_leaf", "oversubscription"}, {"nodes_per_leaf"}, &build};
  return t;
}

}  // namespace dtsim
