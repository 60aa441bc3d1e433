#include "sim/collective_exec.hpp"

#include <simgrid/s4u.hpp>

namespace sg4 = simgrid::s4u;

namespace dtsim::simgrid_engine {

double flow_bytes(const Platform& p, const FoldPolicy& fold, int64_t src, int64_t dst, double bytes) {
  const bool inter = !p.same_node(src, dst);
  return inter && fold.fold ? bytes * static_cast<double>(p.gpus_per_nic) : bytes;
}

void execute_collective(const Platform& p, const FoldPolicy& fold, const std::vector<int64_t>& members,
                        Collective c, double size_bytes) {
  const int64_t n = static_cast<int64_t>(members.size());
  bool intra_node = true;
  for (int64_t m : members) intra_node = intra_node && p.same_node(m, members.front());
  const RingCost rc = ring_cost(c, n, size_bytes);
  if (rc.edge_bytes > 0) {
    std::vector<sg4::CommPtr> comms;
    auto launch = [&](size_t i) {
      const int64_t src = members[i], dst = members[(i + 1) % members.size()];
      comms.push_back(sg4::Comm::sendto_async(p.hosts[static_cast<size_t>(src)], p.hosts[static_cast<size_t>(dst)],
                                              static_cast<uint64_t>(flow_bytes(p, fold, src, dst, rc.edge_bytes))));
    };
    if (fold.fold && intra_node) {
      // Symmetric NVSwitch ring: every edge is alike; one stands for all.
      launch(0);
    } else {
      // Unfolded, or a ring that crosses nodes: every edge of the group.
      for (size_t i = 0; i < members.size(); ++i) launch(i);
    }
    sg4::Comm::wait_all(comms);
  }
  if (rc.steps > 0) sg4::this_actor::sleep_for(static_cast<double>(rc.steps) * p.alpha(intra_node));
}

}  // namespace dtsim::simgrid_engine
