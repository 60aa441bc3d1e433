// Three-tier Clos: leaves of nodes_per_leaf nodes, pods of leaves_per_pod leaves (the pod's
// spine layer), a core above the pods. Leaf uplinks carry the NIC capacity below divided by
// `oversubscription`, pod uplinks the leaf uplink capacity below divided by
// `pod_oversubscription` (Llama 3 paper Sec 3.3.1: full bisection inside a pod, 1:7 at the
// aggregation layer).
#include <string>

#include "models/errors.hpp"
#include "topologies/fabrics/fabric.hpp"

namespace dtsim {
namespace {

void build(const ClusterSpec& c, Topology& topo) {
  const auto& s = c.fabric_shape;
  if (s.nodes_per_leaf <= 0)
    throw InputError("cluster.fabric.nodes_per_leaf=" + std::to_string(s.nodes_per_leaf) +
                     " must be a positive integer (fabric clos)");
  if (s.leaves_per_pod <= 0)
    throw InputError("cluster.fabric.leaves_per_pod=" + std::to_string(s.leaves_per_pod) +
                     " must be a positive integer (fabric clos)");
  std::vector<int64_t> leaf_of(static_cast<size_t>(topo.nics()));
  for (int64_t i = 0; i < topo.nics(); ++i) leaf_of[static_cast<size_t>(i)] = (i / topo.nics_per_node()) / s.nodes_per_leaf;
  build_switch_tree(c, topo, leaf_of, s.oversubscription, s.leaves_per_pod, s.pod_oversubscription);
}

}  // namespace

const FabricType& clos_fabric() {
  static const FabricType t{"clos", "leaves, pods of leaves and a core, each tier with its oversubscription",
                            {"nodes_per_leaf", "oversubscription", "leaves_per_pod", "pod_oversubscription"},
                            {"nodes_per_leaf", "leaves_per_pod"},
                            &build};
  return t;
}

}  // namespace dtsim
