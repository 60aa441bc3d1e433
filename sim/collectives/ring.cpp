// Ring (NCCL_ALGO=Ring): AllReduce as ReduceScatter then AllGather around a ring, each
// rank sending (n-1)/n of the buffer twice (Patarasuk & Yuan, JPDC 69(2), 2009); ReduceScatter
// and AllGather the single pass; Broadcast and Reduce a pipelined chain carrying the whole
// buffer over every edge.
//
// Edge volume E and steps (nccl-tests PERFORMANCE.md; NCCL tuning.cc nsteps):
//   AllReduce 2(n-1)/n S, 2(n-1) steps; ReduceScatter, AllGather (n-1)/n S, n-1 steps;
//   Broadcast, Reduce S, n-1 steps (chain, not closed).
// Across nodes NCCL runs one ring channel per NIC, each entering and leaving a node on its
// own rail; channels rotate which member leaves the node, so every member of a node carries
// (k-1)/k E over NVLink and E/k through its NIC:
//   T = max((k-1)/k E / B_nvlink, max_NIC load / B_net) / f_proto + latency
// with NCCL's protocol factor f_proto (nccl_model.hpp), LL's bus-bandwidth cap, and latency
//   base + (steps - s_net) alpha_nvlink + s_net alpha_net,
// s_net = 2(N-1) for AllReduce, N-1 otherwise (steps that cross the network; N nodes).
// One node: T = E / (B_nvlink f_proto) + steps alpha_nvlink + base.
// On an xgmi mesh B_nvlink is the node's ring rate (k-1) B_link for k members on it
// (CommModel::intra_bw, from RCCL's MI300X ring permutations; collective.hpp).
#include <algorithm>

#include "sim/collectives/nccl_model.hpp"
#include "sim/collectives/registry.hpp"
#include "sim/collectives/traffic.hpp"

namespace dtsim::collectives {
namespace {

struct RingShape {
  double edge = 0;
  int64_t steps = 0, net_steps = 0;
  bool cyclic = true;
};

RingShape shape(CollOp op, const GroupLayout& g, double bytes) {
  const int64_t n = g.n(), N = g.node_count();
  const double dn = static_cast<double>(n);
  RingShape r;
  switch (op) {
    case CollOp::AllReduce:
      r.edge = 2 * (dn - 1) / dn * bytes;
      r.steps = 2 * (n - 1);
      r.net_steps = 2 * (N - 1);
      break;
    case CollOp::ReduceScatter:
    case CollOp::AllGather:
      r.edge = (dn - 1) / dn * bytes;
      r.steps = n - 1;
      r.net_steps = N - 1;
      break;
    default:  // Broadcast, Reduce
      r.edge = bytes;
      r.steps = n - 1;
      r.net_steps = N - 1;
      r.cyclic = false;
      break;
  }
  return r;
}

double ppn(const GroupLayout& g) { return static_cast<double>(g.n()) / static_cast<double>(g.node_count()); }

/// Longest NVLink time of any member: E inside one node (the ring closes over NVLink);
/// (k-1)/k E on a node of k members of a ring across nodes (1/k leaves through the NIC); at
/// the node's intra-node ring rate (CommModel::intra_bw: on an xgmi mesh RCCL's rings spread
/// E over the k-1 links among the node's members).
double nvlink_time(const GroupLayout& g, double edge, const CommModel& m) {
  if (g.node_count() == 1) return edge / m.intra_bw(g.n());
  double worst = 0;
  for (const auto& nd : g.nodes) {
    const double k = static_cast<double>(nd.size());
    worst = std::max(worst, (k - 1) / k * edge / m.intra_bw(static_cast<int64_t>(nd.size())));
  }
  return worst;
}

double latency(const RingShape& r, const CommModel& m, Protocol p) {
  using namespace nccl;
  return base_latency(Algo::Ring, p) +
         static_cast<double>(r.steps - r.net_steps) * step_latency(m, Hw::NVLink, Algo::Ring, p) +
         static_cast<double>(r.net_steps) * step_latency(m, Hw::Net, Algo::Ring, p);
}

/// LL's cap on the bus bandwidth: the ring moves E per rank, so at most E / llMaxBw.
double floor_time(const RingShape& r, const GroupLayout& g, Protocol p) {
  return p == Protocol::LL ? r.edge / nccl::ll_max_busbw(g.node_count()) : 0.0;
}

class Ring final : public Algorithm {
 public:
  std::string_view name() const override { return "ring"; }
  std::string_view summary() const override {
    return "ring (NCCL Ring): AllReduce, ReduceScatter, AllGather, Broadcast, Reduce";
  }
  bool tuner_candidate() const override { return true; }
  std::vector<Protocol> protocols() const override { return {Protocol::LL, Protocol::LL128, Protocol::Simple}; }
  std::string unsupported(CollOp op, const GroupLayout&, const CommModel&) const override {
    if (op == CollOp::AllToAll || op == CollOp::SendRecv) return "ring runs AllReduce, ReduceScatter, AllGather, Broadcast and Reduce";
    return "";
  }
  double closed_form(CollOp op, const GroupLayout& g, const CommModel& m, double bytes, Protocol p) const override {
    if (g.n() < 2) return 0;
    const RingShape r = shape(op, g, bytes);
    const double f = nccl::ring_bw_factor(p, op, g.node_count(), ppn(g));
    double bw_time;
    if (g.uniform() && g.node_count() > 1) {
      // Uniform groups: k members per node, at most q of them on one NIC.
      const double k = static_cast<double>(g.per_node());
      const double q = static_cast<double>(g.max_members_per_nic());
      bw_time = std::max((k - 1) / k * r.edge / m.intra_bw(g.per_node()), q * r.edge / k / m.net_bw);
    } else {
      bw_time = std::max(nvlink_time(g, r.edge, m),
                         traffic::ring_boundaries_time(g, r.edge, r.cyclic, m.net_bw));
    }
    return std::max(bw_time / f, floor_time(r, g, p)) + latency(r, m, p);
  }
  TrafficPlan plan(CollOp op, const GroupLayout& g, const CommModel& m, double bytes, Protocol p) const override {
    TrafficPlan t;
    if (g.n() < 2) return t;
    const RingShape r = shape(op, g, bytes);
    const double f = nccl::ring_bw_factor(p, op, g.node_count(), ppn(g));
    Phase ph;
    ph.intra_s = nvlink_time(g, r.edge, m) / f;
    ph.floor_s = floor_time(r, g, p);
    // Protocol overhead as extra bytes on the wire: on links calibrated for Simple, a flow
    // of E / f takes E / (f B).
    traffic::ring_boundaries(g, r.edge / f, r.cyclic, ph.flows);
    ph.latency_s = latency(r, m, p);
    t.phases.push_back(std::move(ph));
    return t;
  }
};

}  // namespace

const Algorithm& ring_algorithm() {
  static const Ring a;
  return a;
}

}  // namespace dtsim::collectives
