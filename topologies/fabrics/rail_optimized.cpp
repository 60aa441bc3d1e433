// Rail-optimized: NIC r of every node of a group of nodes_per_leaf nodes hangs off rail leaf
// r of that group (NVIDIA DGX SuperPOD reference architecture: scalable units of 32 nodes,
// one leaf per rail); rail leaves join a spine with `oversubscription`. Traffic between the
// same rail of two nodes in one group crosses only its rail leaf; anything else goes
// through the spine. nodes_per_leaf 0 puts every node in one group.
#include <string>

#include "models/errors.hpp"
#include "topologies/fabrics/fabric.hpp"

namespace dtsim {
namespace {

void build(const ClusterSpec& c, Topology& topo) {
  const auto& s = c.fabric_shape;
  if (s.nodes_per_leaf < 0)
    throw InputError("cluster.fabric.nodes_per_leaf=" + std::to_string(s.nodes_per_leaf) +
                     " must be >= 0 (fabric rail-optimized; 0 = all nodes in one rail group)");
  const int64_t group = s.nodes_per_leaf > 0 ? s.nodes_per_leaf : topo.nodes();
  const int64_t rails = topo.nics_per_node();
  std::vector<int64_t> leaf_of(static_cast<size_t>(topo.nics()));
  for (int64_t i = 0; i < topo.nics(); ++i) {
    const int64_t node = i / rails, rail = i % rails;
    leaf_of[static_cast<size_t>(i)] = (node / group) * rails + rail;
  }
  build_switch_tree(c, topo, leaf_of, s.oversubscription, 0, 1);
}

}  // namespace

const FabricType& rail_optimized_fabric() {
  static const FabricType t{"rail-optimized", "NIC r of each node on rail leaf r, rail leaves into a spine",
                            {"nodes_per_leaf", "oversubscription"}, {}, &build};
  return t;
}

}  // namespace dtsim
