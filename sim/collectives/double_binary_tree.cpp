// Double binary tree (NCCL_ALGO=Tree, AllReduce only; Sanders, Speck & Traeff 2009, NCCL
// 2.4): inside a node a chain through its k members, across the N nodes two complementary
// binary trees each reducing then broadcasting half of the buffer, pipelined.
//
// Volumes: every chain edge carries S up and S down, so a member's NVLink carries
// 2(k-1)/k S per direction (chain rotated over channels); a tree edge carries S/2 each way,
// so a node with d tree edges (d <= 4: interior in at most one tree) moves d S/2 each way,
// spread over its k members' NICs.
//   T = max(2(k-1)/k S / B_nvlink, D q S / (2k B_net)) / f_tree + latency
// D the largest tree degree, q members per NIC, f_tree NCCL's Tree factor (0.92, and LL /
// LL128 refinements; nccl_model.hpp); LL at most 2S / llMaxBw (NCCL: Tree algbw = busBw / 2).
// Latency (NCCL tuning.cc): base + 2((k-1) alpha_nvlink + floor(log2 N) alpha_net), with
// Tree's hwLat.
// NCCL's tuner converts Tree bus bandwidth to algorithm bandwidth with a fixed 1/2
// (tuning.cc), as if every node and GPU moved 2S; tuner_time uses that (D = 4, chain 2S),
// so the automatic choice is NCCL's. The simulation moves what the trees move: on 2-3 nodes
// fewer bytes per node, where NCCL's measured Tree busbw exceeds the NIC limit
// (sjeaugey, NVIDIA/nccl-tests#196; AddyLaddy, NVIDIA/nccl#812).
#include <algorithm>
#include <bit>

#include "sim/collectives/nccl_model.hpp"
#include "sim/collectives/registry.hpp"
#include "sim/collectives/traffic.hpp"

namespace dtsim::collectives {
namespace {

int64_t floor_log2(int64_t v) { return v <= 1 ? 0 : static_cast<int64_t>(std::bit_width(static_cast<uint64_t>(v))) - 1; }

double latency(const GroupLayout& g, const CommModel& m, Protocol p) {
  using namespace nccl;
  const double k = static_cast<double>(g.per_node());
  return base_latency(Algo::Tree, p) + 2 * ((k - 1) * step_latency(m, Hw::NVLink, Algo::Tree, p) +
                                            static_cast<double>(floor_log2(g.node_count())) *
                                                step_latency(m, Hw::Net, Algo::Tree, p));
}

double floor_time(const GroupLayout& g, double bytes, Protocol p) {
  return p == Protocol::LL ? 2 * bytes / nccl::ll_max_busbw(g.node_count()) : 0.0;
}

double chain_time(const GroupLayout& g, double bytes, const CommModel& m) {
  const double k = static_cast<double>(g.per_node());
  return 2 * (k - 1) / k * bytes / m.intra_bw(g.per_node());  // xgmi mesh: chains over k-1 links
}

class DoubleBinaryTree final : public Algorithm {
 public:
  std::string_view name() const override { return "tree"; }
  std::string_view summary() const override { return "double binary tree (NCCL Tree): AllReduce"; }
  bool tuner_candidate() const override { return true; }
  std::vector<Protocol> protocols() const override { return {Protocol::LL, Protocol::LL128, Protocol::Simple}; }
  std::string unsupported(CollOp op, const GroupLayout& g, const CommModel&) const override {
    if (op != CollOp::AllReduce) return "tree runs AllReduce only (as NCCL's Tree)";
    if (!g.uniform()) return "tree needs the same number of members on every node";
    return "";
  }
  double closed_form(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol p) const override {
    if (g.n() < 2) return 0;
    const double f = nccl::tree_bw_factor(p, g.node_count());
    double t = chain_time(g, bytes, m);
    if (g.node_count() > 1) {
      const double k = static_cast<double>(g.per_node()), q = static_cast<double>(g.max_members_per_nic());
      const double D = static_cast<double>(traffic::double_binary_tree_max_degree(g.node_count()));
      t = std::max(t, D * q * bytes / (2 * k) / m.net_bw);
    }
    return std::max(t / f, floor_time(g, bytes, p)) + latency(g, m, p);
  }
  double tuner_time(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol p) const override {
    if (g.n() < 2) return 0;
    const double f = nccl::tree_bw_factor(p, g.node_count());
    double t = 2 * bytes / m.intra_bw(g.per_node());
    if (g.node_count() > 1) {
      const double k = static_cast<double>(g.per_node()), q = static_cast<double>(g.max_members_per_nic());
      t = std::max(t, 4 * q * bytes / (2 * k) / m.net_bw);
    }
    return std::max(t / f, floor_time(g, bytes, p)) + latency(g, m, p);
  }
  TrafficPlan plan(CollOp, const GroupLayout& g, const CommModel& m, double bytes, Protocol p) const override {
    TrafficPlan t;
    if (g.n() < 2) return t;
    const double f = nccl::tree_bw_factor(p, g.node_count());
    Phase ph;
    ph.intra_s = chain_time(g, bytes, m) / f;
    ph.floor_s = floor_time(g, bytes, p);
    const auto k = static_cast<size_t>(g.per_node());
    const double per = bytes / 2 / static_cast<double>(k) / f;  // half the buffer per tree, split over rails
    for (const auto& [parent, child] : traffic::double_binary_tree(g.node_count())) {
      const auto& a = g.nodes[static_cast<size_t>(parent)];
      const auto& b = g.nodes[static_cast<size_t>(child)];
      for (size_t j = 0; j < k; ++j) {
        ph.flows.push_back({b[j], a[j], per});  // reduce: child to parent
        ph.flows.push_back({a[j], b[j], per});  // broadcast: parent to child
      }
    }
    ph.latency_s = latency(g, m, p);
    t.phases.push_back(std::move(ph));
    return t;
  }
};

}  // namespace

const Algorithm& tree_algorithm() {
  static const DoubleBinaryTree a;
  return a;
}

}  // namespace dtsim::collectives
