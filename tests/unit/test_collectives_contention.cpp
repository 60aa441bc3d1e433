// Collectives sharing links: two collectives on one NIC finish when max-min fair sharing
// predicts; oversubscribed leaf uplinks slow rings that cross leaves; rail-aligned rings
// never touch a rail-optimized fabric's spine; a folded collective (one representative group
// standing for its siblings) equals simulating every sibling.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim/collectives/collective.hpp"
#include "sim/collectives/nccl_model.hpp"
#include "sim/collectives/simulate.hpp"
#include "topologies/gpu_presets.hpp"
#include "topologies/node_presets.hpp"

namespace dtsim::collectives {
namespace {

ClusterSpec preset(const std::string& node, int64_t nodes, int64_t gpus_per_node = 0, int64_t nics_per_node = 0) {
  ClusterSpec c = cluster_of(node_preset(node), nodes);
  if (gpus_per_node > 0) c.gpus_per_node = gpus_per_node;
  if (nics_per_node > 0) c.nics_per_node = nics_per_node;
  return c;
}

CollectiveRun ring(std::vector<int64_t> members, double bytes, CollOp op = CollOp::AllReduce, int batch = 0) {
  CollectiveRun r;
  r.members = std::move(members);
  r.op = op;
  r.bytes = bytes;
  r.choice.algorithm = op == CollOp::SendRecv ? "p2p" : "ring";
  r.choice.protocol = "simple";
  r.batch = batch;
  return r;
}

// Relative tolerance for simulated-vs-predicted times: the solver's 1e-9 precision, whole
// bytes, and 1 ns of latency per link (sim/platform.hpp) are far below it.
constexpr double kTol = 1e-6;

TEST(CollectiveContention, TwoRingsSharingANicGetHalfEach) {
  // DGX A100 with 4 NICs per node: GPUs 0 and 1 share NIC 0, GPUs 8 and 9 NIC 4.
  const ClusterSpec c = preset("dgx-a100", 2, 8, 4);
  const double B = c.nic.bandwidth * c.nic.efficiency;  // 24 GB/s per NIC (HDR)
  const double S = 1 << 30;
  // Two GPUs: every step crosses the network; 2(n-1) = 2 steps of alpha_net.
  const CommModel m = CommModel::of(c);
  const double lat = 2 * nccl::step_latency(m, nccl::Hw::Net, nccl::Algo::Ring, Protocol::Simple);
  const auto alone = simulate_collectives_isolated(c, {ring({0, 8}, S)});
  EXPECT_NEAR(alone[0].time_s, S / B + lat, kTol * alone[0].time_s);
  // Side by side, same size: each flow gets B/2 on the shared NICs.
  const auto both = simulate_collectives_isolated(c, {ring({0, 8}, S), ring({1, 9}, S)});
  EXPECT_NEAR(both[0].time_s, 2 * S / B + lat, kTol * both[0].time_s);
  EXPECT_NEAR(both[1].time_s, 2 * S / B + lat, kTol * both[1].time_s);
  // Different sizes: the small one ends at 2 (S/2) / B; the large one then runs alone at B:
  // S/B + (S - S/2) / B = 1.5 S/B.
  const auto mixed = simulate_collectives_isolated(c, {ring({0, 8}, S), ring({1, 9}, S / 2)});
  EXPECT_NEAR(mixed[1].time_s, S / B + lat, kTol * mixed[1].time_s);
  EXPECT_NEAR(mixed[0].time_s, 1.5 * S / B + lat, kTol * mixed[0].time_s);
  // GPUs on different NICs do not interact.
  const auto apart = simulate_collectives_isolated(c, {ring({0, 8}, S), ring({2, 10}, S)});
  EXPECT_NEAR(apart[1].time_s, alone[0].time_s, kTol * alone[0].time_s);
}

TEST(CollectiveContention, OversubscribedLeafUplinksSlowCrossLeafRings) {
  // 4 nodes of one GPU and one NIC, 2 nodes per leaf, 4:1 oversubscription: a leaf's
  // uplink carries 2 x 47 / 4 = 23.5 GB/s, half a NIC.
  ClusterSpec c = preset("dgx-h100", 4, 1, 1);
  const double B = c.nic.bandwidth * c.nic.efficiency;
  const double S = 1 << 30, E = 2.0 * 3 / 4 * S;
  const CommModel m = CommModel::of(c);
  const double lat = 6 * nccl::step_latency(m, nccl::Hw::Net, nccl::Algo::Ring, Protocol::Simple);
  const auto flat = simulate_collectives_isolated(c, {ring({0, 1, 2, 3}, S)});
  EXPECT_NEAR(flat[0].time_s, E / B + lat, kTol * flat[0].time_s);
  c.fabric = "leaf-spine";
  c.fabric_shape.nodes_per_leaf = 2;
  c.fabric_shape.oversubscription = 4;
  // Ring 0-1-2-3-0: edges 1->2 and 3->0 cross the leaves, each alone on its uplink.
  const auto tree = simulate_collectives_isolated(c, {ring({0, 1, 2, 3}, S)});
  EXPECT_NEAR(tree[0].time_s, E / (B / 2) + lat, kTol * tree[0].time_s);
  // A ring inside one leaf is not slowed.
  const auto local = simulate_collectives_isolated(c, {ring({0, 1}, S)});
  const double lat2 = 2 * nccl::step_latency(m, nccl::Hw::Net, nccl::Algo::Ring, Protocol::Simple);
  EXPECT_NEAR(local[0].time_s, S / B + lat2, kTol * local[0].time_s);
}

TEST(CollectiveContention, RailAlignedRingsNeverTouchTheSpine) {
  ClusterSpec c = preset("dgx-h100", 2);
  const double S = 1 << 30;
  const auto flat = simulate_collectives_isolated(c, {ring({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, S)});
  c.fabric = "rail-optimized";
  c.fabric_shape.oversubscription = 8;  // a thin spine: each rail leaf's uplink is 2 x 47 / 8 GB/s
  const auto rails = simulate_collectives_isolated(c, {ring({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, S)});
  EXPECT_NEAR(rails[0].time_s, flat[0].time_s, kTol * flat[0].time_s);
  // Rail 0 of node 0 <-> rail 1 of node 1 crosses the spine at 11.75 GB/s each way.
  const double up = 2 * c.nic.bandwidth * c.nic.efficiency / 8;
  const CommModel m = CommModel::of(c);
  const double alpha = nccl::step_latency(m, nccl::Hw::Net, nccl::Algo::Ring, Protocol::Simple);
  const auto cross = simulate_collectives_isolated(c, {ring({0, 9}, S, CollOp::SendRecv)});
  EXPECT_NEAR(cross[0].time_s, S / up + alpha, kTol * cross[0].time_s);
}

TEST(CollectiveContention, FoldedGroupStandsForItsSiblings) {
  // Non-blocking, 2 GPUs per NIC: the folded group {0, 8} scales its NIC bytes by 2.
  {
    const ClusterSpec c = preset("dgx-a100", 2, 8, 4);
    const double S = 256.0 * (1 << 20);
    const auto folded = simulate_collectives_isolated(c, {ring({0, 8}, S)}, true);
    std::vector<CollectiveRun> all;
    for (int64_t g = 0; g < 8; ++g) all.push_back(ring({g, 8 + g}, S));
    const auto every = simulate_collectives_isolated(c, all, false);
    EXPECT_NEAR(folded[0].time_s, every[0].time_s, kTol * every[0].time_s);
  }
  // Oversubscribed leaf-spine: the folded group launches its siblings' flows, so the shared
  // leaf uplinks see all 8 rails.
  {
    ClusterSpec c = preset("dgx-h100", 4);
    c.fabric = "leaf-spine";
    c.fabric_shape.nodes_per_leaf = 2;
    c.fabric_shape.oversubscription = 4;
    const double S = 256.0 * (1 << 20);
    const auto folded = simulate_collectives_isolated(c, {ring({0, 8, 16, 24}, S)}, true);
    std::vector<CollectiveRun> all;
    for (int64_t g = 0; g < 8; ++g) all.push_back(ring({g, 8 + g, 16 + g, 24 + g}, S));
    const auto every = simulate_collectives_isolated(c, all, false);
    EXPECT_NEAR(folded[0].time_s, every[0].time_s, kTol * every[0].time_s);
    const auto alone = simulate_collectives_isolated(c, {ring({0, 8, 16, 24}, S)}, false);
    EXPECT_GT(every[0].time_s, 1.5 * alone[0].time_s);  // the uplinks are the bottleneck
  }
}

// Rail-plane sampling (sim/collective_exec.cpp planes_are_copies): an AllToAll over whole
// nodes runs only plane 0's flows on a non-blocking fabric, and takes the same simulated time
// as launching every plane's flows, folded or not, with 1 or 2 GPUs per NIC, alone or beside
// a second group on the same nodes; a group with unequal members per node runs every flow.
TEST(CollectiveContention, RailPlaneSamplingGivesThePerPairTime) {
  auto a2a = [](std::vector<int64_t> members, double bytes, int batch = 0) {
    CollectiveRun r;
    r.members = std::move(members);
    r.op = CollOp::AllToAll;
    r.bytes = bytes;
    r.choice.algorithm = "direct";
    r.choice.protocol = "simple";
    r.batch = batch;
    return r;
  };
  auto range = [](int64_t from, int64_t to, int64_t step = 1) {
    std::vector<int64_t> v;
    for (int64_t i = from; i < to; i += step) v.push_back(i);
    return v;
  };
  const double S = 512.0 * (1 << 20);
  struct Case {
    ClusterSpec cluster;
    std::vector<CollectiveRun> runs;
  };
  std::vector<Case> cases = {
      {preset("dgx-h100", 4), {a2a(range(0, 32), S)}},                       // EP32 over 4 nodes
      {preset("dgx-a100", 3, 8, 4), {a2a(range(0, 24), S)}},                 // 2 GPUs per NIC
      {preset("dgx-h100", 4), {a2a(range(0, 32, 2), S), a2a(range(1, 32, 2), S / 2)}},  // two groups
      {preset("dgx-h100", 3), {a2a({0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19}, S)}},   // half nodes
      {preset("dgx-h100", 2), {a2a({0, 1, 2, 3, 8, 9, 10, 12}, S)}},        // planes on other rails
      {preset("dgx-h100", 2), {a2a({0, 1, 2, 8}, S)}},                      // not uniform: per pair
  };
  for (size_t i = 0; i < cases.size(); ++i)
    for (bool fold : {false, true}) {
      SCOPED_TRACE("case " + std::to_string(i) + (fold ? " folded" : ""));
      const auto sampled = simulate_collectives_isolated(cases[i].cluster, cases[i].runs, fold, true);
      const auto every = simulate_collectives_isolated(cases[i].cluster, cases[i].runs, fold, false);
      ASSERT_EQ(sampled.size(), every.size());
      for (size_t r = 0; r < every.size(); ++r) {
        EXPECT_GT(every[r].time_s, 0);
        EXPECT_NEAR(sampled[r].time_s, every[r].time_s, kTol * every[r].time_s);
      }
    }
}

}  // namespace
}  // namespace dtsim::collectives
