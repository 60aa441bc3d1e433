// Direct pairwise AllToAll (NCCL: ncclSend/ncclRecv to every peer inside one group, as
// nccl-tests alltoall_perf does): each rank sends S/n to each of the n-1 others, all at once.
// Intra-node chunks go over NVLink (on an xgmi mesh each over its pair's own link, so the k-1
// chunks of a member travel at once: B_nvlink below is then (k-1) B_link, CommModel::intra_bw); chunks for another node leave through the sender's own
// NIC towards the same rail of the destination node (rail-aligned, PXN forwards inside the
// destination node). On a node of k members (N nodes, q members per NIC):
//   T = max((k-1) S/n / B_nvlink, q (n-k) S/n / B_net) + alpha
// alpha: one Ring/Simple step of the slowest path (NVLink inside one node, the network
// otherwise): the sends of one group proceed concurrently (NCCL group semantics). A lower
// bound on latency for large n, stated. Simple protocol.
#include <algorithm>
#include <unordered_map>

#include "sim/collectives/nccl_model.hpp"
#include "sim/collectives/registry.hpp"

namespace dtsim::collectives {
namespace {

double latency(const GroupLayout& g, const CommModel& m) { return nccl::alltoall_latency(m, g.node_count() > 1); }

/// The (k-1) chunks a member sends inside its node of k members, at CommModel::intra_bw(k):
/// one NVSwitch port, or k-1 direct links on an xgmi mesh (one chunk per link, all at once).
double nvlink_time(const GroupLayout& g, const CommModel& m, double bytes) {
  double worst = 0;
  for (const auto& nd : g.nodes)
    worst = std::max(worst, static_cast<double>(nd.size() - 1) * bytes / static_cast<double>(g.n()) /
                                m.intra_bw(static_cast<int64_t>(nd.size())));
  return worst;
}

class Direct final : public Algorithm {
 public:
  std::string_view name() const override { return "direct"; }
  std::string_view summary() const override { return "direct pairwise exchange: AllToAll"; }
  bool tuner_candidate() const override { return true; }
  std::vector<Protocol> protocols() const override { return {Protocol::Simple}; }
  std::string unsupported(CollOp op, const GroupLayout&, const CommModel&) const override {
    return op == CollOp::AllToAll ? "" : "direct runs AllToAll only";
  }
  double closed_form(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol) const override {
    if (g.n() < 2) return 0;
    const double n = static_cast<double>(g.n());
    double net = 0;
    if (g.node_count() > 1 && g.uniform() && g.max_members_per_nic() == 1) {
      // Every member on its own NIC, k per node: each sends (n - k) chunks out and, pairing as
      // below, receives one chunk of k from every other node's member j: (n - k) chunks in.
      const double k = static_cast<double>(g.per_node());
      net = (n - k) * bytes / n / m.net_bw;
    } else if (g.node_count() > 1) {
      // Per NIC: every member on it sends (n - k) chunks out and receives as many.
      std::unordered_map<int64_t, double> out, in;
      for (const auto& nd : g.nodes) {
        const double k = static_cast<double>(nd.size());
        for (int64_t mb : nd) out[g.nic_of(mb)] += (n - k) * bytes / n;
      }
      // Receiver side, as the plan pairs senders: member j of node A sends node B's k_B
      // chunks to member j mod k_B of B.
      for (size_t a = 0; a < g.nodes.size(); ++a)
        for (size_t b = 0; b < g.nodes.size(); ++b) {
          if (a == b) continue;
          const auto& B = g.nodes[b];
          for (size_t j = 0; j < g.nodes[a].size(); ++j)
            in[g.nic_of(B[j % B.size()])] += static_cast<double>(B.size()) * bytes / n;
        }
      for (const auto& [nic, l] : out) net = std::max(net, l);
      for (const auto& [nic, l] : in) net = std::max(net, l);
      net /= m.net_bw;
    }
    return std::max(nvlink_time(g, m, bytes), net) + latency(g, m);
  }
  TrafficPlan plan(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol) const override {
    TrafficPlan t;
    if (g.n() < 2) return t;
    const double n = static_cast<double>(g.n());
    Phase ph;
    ph.intra_s = nvlink_time(g, m, bytes);
    for (size_t a = 0; a < g.nodes.size(); ++a)
      for (size_t b = 0; b < g.nodes.size(); ++b) {
        if (a == b) continue;
        const auto& A = g.nodes[a];
        const auto& B = g.nodes[b];
        for (size_t j = 0; j < A.size(); ++j)
          ph.flows.push_back({A[j], B[j % B.size()], static_cast<double>(B.size()) * bytes / n});
      }
    ph.latency_s = latency(g, m);
    t.phases.push_back(std::move(ph));
    return t;
  }
};

}  // namespace

const Algorithm& direct_algorithm() {
  static const Direct a;
  return a;
}

}  // namespace dtsim::collectives
