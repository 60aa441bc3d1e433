// Hierarchical AllReduce (2D / "rail" AllReduce: Horovod's hierarchical allreduce, Sergeev &
// Del Balso 2018; the scheme of Megatron/DeepSpeed 2D collectives): ReduceScatter inside each
// node (ring over its k members), AllReduce of each 1/k shard across the N nodes on its own
// rail (k concurrent rings, member j of every node), AllGather inside each node. Not an NCCL
// algorithm: never chosen by the tuner, only when named.
//   T = 2 [(k-1)/k S / B_nvlink + (k-1) alpha_nvlink]                       (intra phases)
//     + q 2(N-1)/N (S/k) / B_net + 2(N-1) alpha_net                         (rail phase)
// q = members per NIC. Ring/Simple latencies (nccl_model.hpp); Simple protocol.
#include "sim/collectives/nccl_model.hpp"
#include "sim/collectives/registry.hpp"

namespace dtsim::collectives {
namespace {

struct Parts {
  double intra_s = 0, intra_lat = 0, rail_edge = 0, rail_s = 0, rail_lat = 0;
};

Parts parts(const GroupLayout& g, const CommModel& m, double bytes) {
  using namespace nccl;
  const double k = static_cast<double>(g.per_node()), N = static_cast<double>(g.node_count());
  const double q = static_cast<double>(g.max_members_per_nic());
  Parts p;
  p.intra_s = (k - 1) / k * bytes / m.intra_bw(g.per_node());
  p.intra_lat = (k - 1) * step_latency(m, Hw::NVLink, Algo::Ring, Protocol::Simple);
  p.rail_edge = 2 * (N - 1) / N * bytes / k;
  p.rail_s = q * p.rail_edge / m.net_bw;
  p.rail_lat = 2 * (N - 1) * step_latency(m, Hw::Net, Algo::Ring, Protocol::Simple);
  return p;
}

class Hierarchical final : public Algorithm {
 public:
  std::string_view name() const override { return "hierarchical"; }
  std::string_view summary() const override {
    return "intra-node ReduceScatter, AllReduce per rail across nodes, intra-node AllGather: AllReduce";
  }
  bool tuner_candidate() const override { return false; }
  std::vector<Protocol> protocols() const override { return {Protocol::Simple}; }
  std::string unsupported(CollOp op, const GroupLayout& g, const CommModel&) const override {
    if (op != CollOp::AllReduce) return "hierarchical runs AllReduce only";
    if (g.node_count() < 2 || g.per_node() < 2) return "hierarchical needs at least 2 nodes with at least 2 members each";
    if (!g.uniform()) return "hierarchical needs the same number of members on every node";
    return "";
  }
  double closed_form(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol) const override {
    const Parts p = parts(g, m, bytes);
    return 2 * (p.intra_s + p.intra_lat) + p.rail_s + p.rail_lat;
  }
  TrafficPlan plan(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol) const override {
    const Parts p = parts(g, m, bytes);
    TrafficPlan t;
    Phase rs;
    rs.intra_s = p.intra_s;
    rs.latency_s = p.intra_lat;
    Phase rail;
    const size_t N = g.nodes.size(), k = g.nodes.front().size();
    for (size_t i = 0; i < N; ++i)
      for (size_t j = 0; j < k; ++j) rail.flows.push_back({g.nodes[i][j], g.nodes[(i + 1) % N][j], p.rail_edge});
    rail.latency_s = p.rail_lat;
    Phase ag = rs;
    t.phases = {rs, std::move(rail), ag};
    return t;
  }
};

}  // namespace

const Algorithm& hierarchical_algorithm() {
  static const Hierarchical a;
  return a;
}

}  // namespace dtsim::collectives
