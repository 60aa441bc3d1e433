// Non-blocking (full-bisection) fat tree: every NIC into one ideal switch. At flow level a
// full-bisection fat tree (Al-Fares et al., SIGCOMM 2008) never constrains traffic above the
// NICs, so only the NIC links remain.
#include "topologies/fabrics/fabric.hpp"

namespace dtsim {
namespace {

void build(const ClusterSpec& c, Topology& topo) {
  const double nic_bw = c.nic.bandwidth * c.nic.efficiency;
  const TopoVertexId core = topo.add_switch(VertexKind::core, 0);
  for (int64_t i = 0; i < topo.nics(); ++i)
    topo.connect(topo.nic_vertex(i), core, nic_bw, LinkKind::nic_up, LinkKind::nic_down);
}

}  // namespace

const FabricType& non_blocking_fabric() {
  static const FabricType t{"non-blocking", "full-bisection fat tree: only the NIC links constrain", {}, {}, &build};
  return t;
}

}  // namespace dtsim
