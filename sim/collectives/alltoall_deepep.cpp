// DeepEP's normal (training) dispatch and combine kernels: the MoE token AllToAll sent once
// per node and once per rank a token reaches, not once per expert (deepseek-ai/DeepEP
// csrc/kernels/internode.cu `dispatch` / `combine`: RDMA senders, NVLink forwarders and
// receivers in one kernel; tests/legacy/test_internode.py counts its bytes the same way).
// A token bound for experts on another node crosses the network once, to the member of that
// node with the sender's local index (rail-aligned), which forwards it over NVLink to every
// member holding one of its experts; the combine runs the same traffic backwards (the
// forwarding rank adds up its node's expert outputs before the RDMA send, which does not
// change the bytes). HybridEP (DeepEP hybrid-ep branch, docs/README_Hybrid-EP.md) keeps
// the same per-node deduplication and is costed the same way.
//
// Counts, for n members on N nodes, E experts (E/n per member, E/N per node) and top-k
// routing, a token's experts drawn without replacement (random scores, as DeepEP's benchmark
// draws them; C(a, b) binomials):
//   unlimited routing: nodes reached D = N (1 - C(E - E/N, k) / C(E, k))
//   group-limited (G groups, t chosen, X = t E/G eligible experts): each chosen group holds
//     one of the token's experts (groups are chosen by their best experts), so
//       G >= N (G/N groups per node): D = N (1 - C(G - G/N, t) / C(G, t))
//       G <  N (s = N/G nodes a group): D = t (1 + (s-1)(1 - C(X-t-E/N, k-t) / C(X-t, k-t)))
//   members reached R = X/(E/n) (1 - C(X - E/n, k) / C(X, k))   (X = E unlimited)
//   remote nodes D (N-1)/N; members other than the sender R (n-1)/n.
// Groups are consecutive members: exact for groups aligned with nodes (DeepSeek-V3 on 8
// nodes with 8 groups; DeepEP's benchmark: `num_topk_groups` of `num_nodes` groups), a
// mean-field estimate otherwise. `bytes` is the per-rank buffer of the plan (tokens x k
// copies, models/blocks/moe.cpp), so one token's payload is bytes / k. Per GPU:
//   network = bytes / k x D (N-1)/N   (the busiest NIC, sending or receiving)
//   NVLink  = bytes / k x R (n-1)/n   (every delivery to another member, forwarded or direct)
//   T = max(network / B_net, NVLink / B_nvlink) + alpha
// the two stages being pipelined in chunks inside one kernel; alpha as the direct AllToAll
// (one Ring/Simple step of the slowest path). The SMs the kernels take from the compute
// beside them are the plan's (Op::comm_sms: training.moe_deepep_num_sms /
// moe_hybridep_num_sms), applied by the engines. Not modelled: DeepEP's low-latency
// (inference) kernels.
#include <algorithm>
#include <unordered_map>
#include <vector>

#include "sim/collectives/nccl_model.hpp"
#include "sim/collectives/registry.hpp"

namespace dtsim::collectives {
namespace {

/// C(x - d, k) / C(x, k): the chance that k draws without replacement from x items miss a
/// given set of d.
double miss(double x, double d, int64_t k) {
  double p = 1;
  for (int64_t i = 0; i < k; ++i) {
    const double num = x - d - static_cast<double>(i);
    if (num <= 0) return 0;
    p *= num / (x - static_cast<double>(i));
  }
  return p;
}

}  // namespace

DeepEpFanout deepep_fanout(int64_t members, int64_t node_count, const TokenRouting& r) {
  const double n = static_cast<double>(members);
  const double N = static_cast<double>(node_count);
  const double E = static_cast<double>(r.experts);
  const double per_node = E / N, per_member = E / n;
  double nodes = 0, X = E;  // nodes reached; experts a token may reach
  if (r.groups > 0 && r.group_topk > 0 && r.group_topk < r.groups) {
    // Group-limited: the chosen groups are those holding the token's best experts (Megatron-
    // Core moe_utils.py group_limited_topk scores a group by its top experts), so each holds
    // at least one of them; the other k - t experts fall anywhere in the chosen groups.
    const double G = static_cast<double>(r.groups);
    X = static_cast<double>(r.group_topk) * E / G;
    const int64_t held = std::min(r.group_topk, r.topk);  // chosen groups holding an expert
    const double t = static_cast<double>(held);
    if (G >= N) {
      nodes = N * (1 - miss(G, G / N, held));  // t of G groups, G / N per node
    } else {
      const double s = N / G;  // nodes per group
      nodes = t * (1 + (s - 1) * (1 - miss(X - t, per_node, r.topk - held)));
    }
  } else {
    nodes = N * (1 - miss(E, per_node, r.topk));
  }
  nodes = std::min({nodes, N, static_cast<double>(r.topk)});
  DeepEpFanout f;
  f.remote_nodes = nodes * (N - 1) / N;
  f.other_members = X / per_member * (1 - miss(X, per_member, r.topk)) * (n - 1) / n;
  return f;
}

namespace {

DeepEpFanout fanout(const GroupLayout& g) { return deepep_fanout(g.n(), g.node_count(), g.routing); }

/// The RDMA traffic: member j of node A sends node B's share of its `remote` bytes (one
/// token copy per remote node reached) to B's member j (rail-aligned, as DeepEP's RDMA ranks
/// pair up; j mod B's size where nodes hold different numbers of members).
std::vector<Flow> rdma_flows(const GroupLayout& g, double remote) {
  std::vector<Flow> flows;
  const size_t N = g.nodes.size();
  if (N < 2) return flows;
  const double per_node = remote / static_cast<double>(N - 1);
  for (size_t a = 0; a < N; ++a)
    for (size_t b = 0; b < N; ++b) {
      if (a == b) continue;
      for (size_t j = 0; j < g.nodes[a].size(); ++j)
        flows.push_back({g.nodes[a][j], g.nodes[b][j % g.nodes[b].size()], per_node});
    }
  return flows;
}

double latency(const GroupLayout& g, const CommModel& m) { return nccl::alltoall_latency(m, g.node_count() > 1); }

class DeepEp final : public Algorithm {
 public:
  std::string_view name() const override { return "deepep"; }
  std::string_view summary() const override {
    return "DeepEP / HybridEP token AllToAll: once per node over RDMA, then NVLink to the experts' ranks";
  }
  // Chosen by training.moe_token_dispatcher (deepep, hybridep), never by NCCL's tuner.
  bool tuner_candidate() const override { return false; }
  std::vector<Protocol> protocols() const override { return {Protocol::Simple}; }
  std::string unsupported(CollOp op, const GroupLayout& g, const CommModel&) const override {
    if (op != CollOp::AllToAll) return "deepep runs the MoE token AllToAll only";
    const TokenRouting& r = g.routing;
    if (r.topk < 1 || r.experts < r.topk)
      return "deepep needs the token routing of an MoE expert-parallel group (top-k of the experts)";
    if (g.n() > 0 && r.experts % g.n() != 0) return "deepep needs the experts split evenly over the group";
    return "";
  }
  double closed_form(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol) const override {
    if (g.n() < 2) return 0;
    const DeepEpFanout f = fanout(g);
    const double token = bytes / static_cast<double>(g.routing.topk);
    const double nvl = token * f.other_members / m.intra_bw(g.per_node());
    // The busiest NIC, sending or receiving, over the flows plan() launches.
    std::unordered_map<int64_t, double> out, in;
    for (const Flow& fl : rdma_flows(g, token * f.remote_nodes)) {
      out[g.nic_of(fl.src)] += fl.bytes;
      in[g.nic_of(fl.dst)] += fl.bytes;
    }
    double net = 0;
    for (const auto& [nic, b] : out) net = std::max(net, b);
    for (const auto& [nic, b] : in) net = std::max(net, b);
    return std::max(nvl, net / m.net_bw) + latency(g, m);
  }
  TrafficPlan plan(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol) const override {
    TrafficPlan t;
    if (g.n() < 2) return t;
    const DeepEpFanout f = fanout(g);
    const double token = bytes / static_cast<double>(g.routing.topk);
    Phase ph;
    ph.intra_s = token * f.other_members / m.intra_bw(g.per_node());
    ph.flows = rdma_flows(g, token * f.remote_nodes);
    ph.latency_s = latency(g, m);
    t.phases.push_back(std::move(ph));
    return t;
  }
};

}  // namespace

const Algorithm& deepep_algorithm() {
  static const DeepEp a;
  return a;
}

}  // namespace dtsim::collectives
