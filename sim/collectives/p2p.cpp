// Point-to-point send/receive (NCCL ncclSend/ncclRecv; nccl-tests sendrecv_perf pattern):
// member i sends S to member i+1 and receives S from member i-1 (cyclic). A pair inside one
// node uses NVLink (closed form S / B_nvlink); a pair across nodes is a flow between the two
// GPUs' NICs. Alone: T = max(S / B_nvlink [if any pair is intra-node], most loaded NIC
// direction / B_net) + alpha (NVLink or network Ring/Simple step). Simple protocol.
// (The training engine moves pipeline activations itself; this entry serves
// `dtsim collective --op sendrecv` and the registry tests.)
#include <algorithm>
#include <unordered_map>

#include "sim/collectives/nccl_model.hpp"
#include "sim/collectives/registry.hpp"

namespace dtsim::collectives {
namespace {

bool same_node(const GroupLayout& g, int64_t a, int64_t b) { return a / g.gpus_per_node == b / g.gpus_per_node; }

class P2p final : public Algorithm {
 public:
  std::string_view name() const override { return "p2p"; }
  std::string_view summary() const override { return "point-to-point send/receive to the next member: SendRecv"; }
  bool tuner_candidate() const override { return true; }
  std::vector<Protocol> protocols() const override { return {Protocol::Simple}; }
  std::string unsupported(CollOp op, const GroupLayout&, const CommModel&) const override {
    return op == CollOp::SendRecv ? "" : "p2p runs SendRecv only";
  }
  double closed_form(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol) const override {
    if (g.n() < 2) return 0;
    std::unordered_map<int64_t, double> out, in;
    bool intra = false;
    for (size_t i = 0; i < g.members.size(); ++i) {
      const int64_t s = g.members[i], d = g.members[(i + 1) % g.members.size()];
      if (same_node(g, s, d)) {
        intra = true;
      } else {
        out[g.nic_of(s)] += bytes;
        in[g.nic_of(d)] += bytes;
      }
    }
    double net = 0;
    for (const auto& [nic, l] : out) net = std::max(net, l);
    for (const auto& [nic, l] : in) net = std::max(net, l);
    const double t = std::max(intra ? bytes / m.intra_bw(2) : 0.0, net / m.net_bw);
    return t + latency(g, m);
  }
  TrafficPlan plan(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol) const override {
    TrafficPlan t;
    if (g.n() < 2) return t;
    Phase ph;
    for (size_t i = 0; i < g.members.size(); ++i) {
      const int64_t s = g.members[i], d = g.members[(i + 1) % g.members.size()];
      if (same_node(g, s, d)) ph.intra_s = bytes / m.intra_bw(2);  // one GPU pair (its own link on a mesh)
      else ph.flows.push_back({s, d, bytes});
    }
    ph.latency_s = latency(g, m);
    t.phases.push_back(std::move(ph));
    return t;
  }

 private:
  static double latency(const GroupLayout& g, const CommModel& m) {
    using namespace nccl;
    return step_latency(m, g.node_count() > 1 ? Hw::Net : Hw::NVLink, Algo::Ring, Protocol::Simple);
  }
};

}  // namespace

const Algorithm& p2p_algorithm() {
  static const P2p a;
  return a;
}

}  // namespace dtsim::collectives
