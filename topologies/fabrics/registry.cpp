// The fabric registry and the switch-tree helper the tiered fabrics share.
#include <algorithm>
#include <string>

#include "models/errors.hpp"
#include "topologies/fabrics/fabric.hpp"

namespace dtsim {

const std::vector<const FabricType*>& fabric_types() {
  // One line per fabric type (each defined in its own file).
  static const std::vector<const FabricType*> types = {&non_blocking_fabric(), &leaf_spine_fabric(),
                                                       &rail_optimized_fabric(), &clos_fabric()};
  return types;
}

const FabricType* find_fabric_type(std::string_view name) {
  for (const FabricType* t : fabric_types())
    if (name == t->name) return t;
  return nullptr;
}

std::string fabric_type_list() {
  std::string out;
  for (const FabricType* t : fabric_types()) {
    if (!out.empty()) out += ", ";
    out += t->name;
  }
  return out;
}

void build_switch_tree(const ClusterSpec& c, Topology& topo, const std::vector<int64_t>& leaf_of,
                       double leaf_oversubscription, int64_t leaves_per_pod, double pod_oversubscription) {
  if (!(leaf_oversubscription >= 1) || !(pod_oversubscription >= 1))
    throw InputError("cluster.fabric: oversubscription must be >= 1 (downlink : uplink capacity), got " +
                     std::to_string(leaf_oversubscription) + " and " + std::to_string(pod_oversubscription));
  const double nic_bw = c.nic.bandwidth * c.nic.efficiency;
  const int64_t leaves = leaf_of.empty() ? 0 : *std::max_element(leaf_of.begin(), leaf_of.end()) + 1;
  std::vector<TopoVertexId> leaf(static_cast<size_t>(leaves));
  std::vector<double> below(static_cast<size_t>(leaves), 0.0);
  for (int64_t l = 0; l < leaves; ++l) leaf[static_cast<size_t>(l)] = topo.add_switch(VertexKind::leaf, l);
  for (size_t i = 0; i < leaf_of.size(); ++i) {
    const auto l = static_cast<size_t>(leaf_of[i]);
    topo.connect(topo.nic_vertex(static_cast<int64_t>(i)), leaf[l], nic_bw, LinkKind::nic_up, LinkKind::nic_down);
    below[l] += nic_bw;
  }
  const TopoVertexId top = topo.add_switch(leaves_per_pod > 0 ? VertexKind::core : VertexKind::spine, 0);
  if (leaves_per_pod <= 0) {
    for (int64_t l = 0; l < leaves; ++l)
      topo.connect(leaf[static_cast<size_t>(l)], top, below[static_cast<size_t>(l)] / leaf_oversubscription,
                   LinkKind::leaf_up, LinkKind::leaf_down);
    return;
  }
  const int64_t pods = (leaves + leaves_per_pod - 1) / leaves_per_pod;
  std::vector<TopoVertexId> pod(static_cast<size_t>(pods));
  std::vector<double> pod_below(static_cast<size_t>(pods), 0.0);
  for (int64_t p = 0; p < pods; ++p) pod[static_cast<size_t>(p)] = topo.add_switch(VertexKind::spine, p);
  for (int64_t l = 0; l < leaves; ++l) {
    const double up = below[static_cast<size_t>(l)] / leaf_oversubscription;
    const auto p = static_cast<size_t>(l / leaves_per_pod);
    topo.connect(leaf[static_cast<size_t>(l)], pod[p], up, LinkKind::leaf_up, LinkKind::leaf_down);
    pod_below[p] += up;
  }
  for (int64_t p = 0; p < pods; ++p)
    topo.connect(pod[static_cast<size_t>(p)], top, pod_below[static_cast<size_t>(p)] / pod_oversubscription,
                 LinkKind::pod_up, LinkKind::pod_down);
}

}  // namespace dtsim
