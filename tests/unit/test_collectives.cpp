// Collective algorithms (sim/collectives/): every registered algorithm simulated alone on
// SimGrid reproduces its closed form over several group shapes, sizes and protocols (one
// parameterised test over the registry, as SimGrid tests every SMPI collective); the tuner
// chooses as NCCL's does; nccl-tests busbw factors; names known to the YAML reader.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "sim/collectives/collective.hpp"
#include "sim/collectives/nccl_model.hpp"
#include "sim/collectives/registry.hpp"
#include "sim/collectives/simulate.hpp"
#include "sim/collectives/traffic.hpp"
#include "sim/collectives/tuner.hpp"
#include "topologies/collective_names.hpp"
#include "topologies/gpu_presets.hpp"
#include "topologies/node_presets.hpp"

namespace dtsim::collectives {
namespace {

ClusterSpec preset(const std::string& node, int64_t nodes, int64_t nics_per_node = 0) {
  ClusterSpec c = cluster_of(node_preset(node), nodes);
  if (nics_per_node > 0) c.nics_per_node = nics_per_node;
  return c;
}

std::vector<int64_t> range(int64_t from, int64_t to, int64_t step = 1) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; i += step) v.push_back(i);
  return v;
}

GroupLayout layout(const ClusterSpec& c, std::vector<int64_t> members) {
  return GroupLayout::of(std::move(members), c.gpus_per_node, c.gpus_per_node / c.nics_per_node);
}

TEST(Collectives, RegistryNamesMatchTheYamlReader) {
  std::vector<std::string> expected = {"auto"};
  for (const auto& n : algorithm_names()) expected.push_back(n);
  EXPECT_EQ(collective_algorithm_names(), expected);
  EXPECT_EQ(algorithm_list(), "ring, tree, nvls, hierarchical, direct, deepep, p2p");
  EXPECT_THROW(algorithm("bruck"), InputError);
  try {
    algorithm("bruck");
  } catch (const InputError& e) {
    EXPECT_EQ(e.problems().front(),
              "unknown collective algorithm \"bruck\" (valid: ring, tree, nvls, hierarchical, direct, deepep, p2p)");
  }
}

TEST(Collectives, NcclTestsBusBandwidthFactors) {
  // nccl-tests doc/PERFORMANCE.md (nccl_busbw.csv formula rows).
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::AllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::ReduceScatter, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::AllGather, 16), 15.0 / 16);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::AllToAll, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::Reduce, 8), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(CollOp::SendRecv, 8), 1.0);
  EXPECT_EQ(parse_op("all_reduce"), CollOp::AllReduce);
  EXPECT_EQ(parse_op("AllToAll"), CollOp::AllToAll);
  EXPECT_FALSE(parse_op("scan").has_value());
}

TEST(Collectives, DoubleBinaryTreeIsInteriorInAtMostOneTree) {
  for (int64_t N : {2, 3, 4, 5, 8, 13, 64}) {
    std::vector<int> children(static_cast<size_t>(2 * N), 0);
    const auto edges = traffic::double_binary_tree(N);
    ASSERT_EQ(edges.size(), static_cast<size_t>(2 * (N - 1)));
    for (size_t i = 0; i < edges.size(); ++i) children[static_cast<size_t>((i < edges.size() / 2 ? 0 : N) + edges[i].first)]++;
    for (int64_t v = 0; v < N; ++v)
      EXPECT_FALSE(children[static_cast<size_t>(v)] > 0 && children[static_cast<size_t>(N + v)] > 0) << N << " " << v;
    EXPECT_LE(traffic::double_binary_tree_max_degree(N), 4);
  }
}

// ---- every algorithm against its closed form ----

struct Case {
  std::vector<int64_t> members;
  CollOp op;
  double bytes;
  Protocol proto;
};

/// Group shapes on one cluster: a node, part of a node, whole nodes, one GPU per node, two
/// per node, and an uneven group (8 + 4).
std::vector<std::vector<int64_t>> shapes(const ClusterSpec& c) {
  const int64_t g = c.gpus_per_node;
  std::vector<std::vector<int64_t>> s = {range(0, g), range(0, g / 2), range(0, c.gpus()), range(0, c.gpus(), g),
                                         {0, 1, g, g + 1, 2 * g, 2 * g + 1}, range(0, g + g / 2)};
  return s;
}

/// Returns the number of cases run.
size_t check_algorithm(const Algorithm& a, const ClusterSpec& cluster) {
  const CommModel m = CommModel::of(cluster);
  std::vector<Case> cases;
  // Token routing for the algorithms that read it (deepep): top-8 of 5040 experts (divisible
  // by every group size below), group-limited to 2 of 4 groups.
  const TokenRouting routing{8, 5040, 4, 2};
  for (const auto& members : shapes(cluster)) {
    GroupLayout g = layout(cluster, members);
    g.routing = routing;
    for (CollOp op : {CollOp::AllReduce, CollOp::ReduceScatter, CollOp::AllGather, CollOp::Broadcast, CollOp::Reduce,
                      CollOp::AllToAll, CollOp::SendRecv}) {
      if (!a.unsupported(op, g, m).empty()) continue;
      for (double bytes : {4096.0, 4.0 * 1024 * 1024, 512.0 * 1024 * 1024})
        for (Protocol p : a.protocols()) cases.push_back({members, op, bytes, p});
    }
  }
  if (cases.empty()) return 0;  // e.g. NVLS on NVSwitch gen 2
  std::vector<CollectiveRun> runs;
  for (size_t i = 0; i < cases.size(); ++i) {
    CollectiveRun r;
    r.members = cases[i].members;
    r.op = cases[i].op;
    r.bytes = cases[i].bytes;
    r.choice.algorithm = std::string(a.name());
    r.choice.protocol = cases[i].proto == Protocol::LL ? "ll" : cases[i].proto == Protocol::LL128 ? "ll128" : "simple";
    r.batch = static_cast<int>(i);  // one at a time: alone on the platform
    r.routing = routing;
    runs.push_back(r);
  }
  const auto t = simulate_collectives_isolated(cluster, runs);
  EXPECT_EQ(t.size(), cases.size());
  if (t.size() != cases.size()) return 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    GroupLayout g = layout(cluster, c.members);
    g.routing = routing;
    const double closed = a.closed_form(c.op, g, m, c.bytes, c.proto);
    EXPECT_EQ(t[i].algorithm, a.name());
    EXPECT_EQ(t[i].protocol, c.proto);
    EXPECT_GT(closed, 0);
    // Tolerance: 1e-6 relative (max-min solver precision 1e-9, bytes rounded to whole
    // bytes) plus 10 ns absolute: every link carries 1 ns of latency so that CM02 shares
    // fairly (sim/platform.hpp), and a route has up to 6 links.
    EXPECT_NEAR(t[i].time_s, closed, 1e-6 * closed + 1e-8)
        << a.name() << " " << to_string(c.op) << " " << to_string(c.proto) << " " << c.bytes << " B on "
        << c.members.size() << " GPUs from GPU " << c.members.front() << " (" << cluster.nodes << " x "
        << cluster.gpus_per_node << ", " << cluster.nics_per_node << " NICs/node)";
  }
  return cases.size();
}

class EveryAlgorithm : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryAlgorithm, SimulatedAloneEqualsClosedForm) {
  const Algorithm& a = algorithm(GetParam());
  // DGX H100 (NVLS, one NIC per GPU) and DGX A100 with 4 NICs per node (2 GPUs per NIC).
  const size_t ran = check_algorithm(a, preset("dgx-h100", 3)) + check_algorithm(a, preset("dgx-a100", 3, 4));
  EXPECT_GE(ran, 3u) << a.name() << " was hardly exercised";
}

INSTANTIATE_TEST_SUITE_P(Registry, EveryAlgorithm, ::testing::ValuesIn(algorithm_names()),
                         [](const auto& info) { return info.param; });

// A collective alone on the fabric (the only run of its batch) runs plane 0 of a complete
// exchange as one flow per node to the next (sim/collective_exec.cpp run_traffic,
// FoldPolicy::alone): N - 1 x fewer flows, the same time as the N (N - 1) per-pair flows it
// runs beside another run (a second run in its batch, on a node of its own, moves nothing over
// the NICs). Exact up to the solver's precision, on one and two GPUs per NIC, 3-5 nodes.
TEST(Collectives, AloneCompleteExchangeAsNodeRingTakesThePerPairTime) {
  for (const auto& [node, nics] : std::vector<std::pair<std::string, int64_t>>{{"dgx-h100", 0}, {"dgx-a100", 4}}) {
    for (int64_t nodes : {3, 4, 5}) {
      const ClusterSpec c = preset(node, nodes + 1, nics);
      const int64_t g = c.gpus_per_node;
      std::vector<CollectiveRun> runs;
      for (double bytes : {1.0 * (1 << 20), 256.0 * (1 << 20)}) {
        CollectiveRun a2a;
        a2a.members = range(0, nodes * g);
        a2a.op = CollOp::AllToAll;
        a2a.bytes = bytes;
        a2a.batch = static_cast<int>(runs.size());
        runs.push_back(a2a);  // alone
        CollectiveRun beside = a2a;
        beside.batch = static_cast<int>(runs.size());
        runs.push_back(beside);
        CollectiveRun other;  // inside the last node: no flow on any NIC
        other.members = range(nodes * g, nodes * g + 2);
        other.op = CollOp::AllReduce;
        other.bytes = 4096;
        other.batch = beside.batch;
        runs.push_back(other);
      }
      const auto t = simulate_collectives_isolated(c, runs);
      ASSERT_EQ(t.size(), runs.size());
      for (size_t i = 0; i < t.size(); i += 3) {
        EXPECT_EQ(t[i].algorithm, "direct");
        EXPECT_GT(t[i].time_s, 0);
        EXPECT_NEAR(t[i].time_s, t[i + 1].time_s, 1e-9 * t[i + 1].time_s + 1e-9)
            << node << " x " << nodes << ", " << runs[i].bytes << " B";
      }
    }
  }
}

// ---- tuner ----

TEST(CollectiveTuner, ChoosesAsNcclDoesOnOneDgxH100) {
  const ClusterSpec c = preset("dgx-h100", 1);
  const CommModel m = CommModel::of(c);
  const GroupLayout g = layout(c, range(0, 8));
  const CollectiveChoice auto_choice;
  // Small messages: the low-latency protocol of the ring (NCCL hwLat Ring/LL 0.6 us).
  const Choice small = choose(CollOp::AllReduce, g, m, 8, auto_choice, true);
  EXPECT_EQ(small.algorithm->name(), "ring");
  EXPECT_EQ(small.protocol, Protocol::LL);
  // Large messages: NVLS (in-switch reduction) beats the ring on H100.
  const Choice large = choose(CollOp::AllReduce, g, m, 1 << 30, auto_choice, true);
  EXPECT_EQ(large.algorithm->name(), "nvls");
  // AllGather: NVLS moves S per GPU, the ring (n-1)/n S at a higher rate: ring wins.
  EXPECT_EQ(choose(CollOp::AllGather, g, m, 1 << 30, auto_choice, true).algorithm->name(), "ring");
  // Only one algorithm runs AllToAll / SendRecv.
  EXPECT_EQ(choose(CollOp::AllToAll, g, m, 1 << 20, auto_choice, true).algorithm->name(), "direct");
  EXPECT_EQ(choose(CollOp::SendRecv, g, m, 1 << 20, auto_choice, true).algorithm->name(), "p2p");
}

TEST(CollectiveTuner, RingOnA100AndTreeForMidSizesAcrossManyNodes) {
  const ClusterSpec a100 = preset("dgx-a100", 1);
  const CollectiveChoice auto_choice;
  EXPECT_EQ(choose(CollOp::AllReduce, layout(a100, range(0, 8)), CommModel::of(a100), 1 << 30, auto_choice, true)
                .algorithm->name(),
            "ring");  // no NVLS on NVSwitch gen 2
  // 64 nodes, one GPU each: the tree's log2(N) latency wins at medium sizes, the ring's
  // bandwidth at large ones (NCCL's tuner behaviour on many nodes).
  const ClusterSpec big = preset("dgx-h100", 64);
  const GroupLayout dp = layout(big, range(0, big.gpus(), 8));
  const CommModel m = CommModel::of(big);
  EXPECT_EQ(choose(CollOp::AllReduce, dp, m, 1 << 20, auto_choice, true).algorithm->name(), "tree");
  EXPECT_EQ(choose(CollOp::AllReduce, dp, m, 4.0 * (1 << 30), auto_choice, true).algorithm->name(), "ring");
  // Hierarchical is never chosen automatically (not an NCCL algorithm).
  for (double bytes : {1e3, 1e6, 1e9, 1e10})
    EXPECT_NE(choose(CollOp::AllReduce, layout(big, range(0, big.gpus())), m, bytes, auto_choice, true).algorithm->name(),
              "hierarchical");
}

TEST(CollectiveTuner, ForcedChoicesAndTheirErrors) {
  const ClusterSpec c = preset("dgx-h100", 2);
  const CommModel m = CommModel::of(c);
  const GroupLayout two_nodes = layout(c, range(0, 16));
  CollectiveChoice want;
  want.algorithm = "nvls";
  // NVLS cannot span nodes: strict names the reason, lenient falls back to the tuner.
  try {
    choose(CollOp::AllReduce, two_nodes, m, 1 << 30, want, true, "--algo");
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.problems().front(),
              "--algo: algorithm nvls cannot run AllReduce on 16 GPUs over 2 node(s): nvls runs inside one NVLink "
              "domain (the group spans 2 nodes)");
  }
  EXPECT_EQ(choose(CollOp::AllReduce, two_nodes, m, 1 << 30, want, false).algorithm->name(), "ring");
  // NCCL disables NVLS on 2 GPUs.
  EXPECT_THROW(choose(CollOp::AllReduce, layout(c, {0, 1}), m, 1 << 30, want, true), InputError);
  // A forced protocol.
  want.algorithm = "ring";
  want.protocol = "ll128";
  const Choice r = choose(CollOp::AllReduce, two_nodes, m, 1 << 30, want, true);
  EXPECT_EQ(r.algorithm->name(), "ring");
  EXPECT_EQ(r.protocol, Protocol::LL128);
  want.algorithm = "hierarchical";
  want.protocol = "auto";
  EXPECT_EQ(choose(CollOp::AllReduce, two_nodes, m, 1 << 30, want, true).algorithm->name(), "hierarchical");
  want.algorithm = "auto";
  want.protocol = "ll";
  EXPECT_THROW(choose(CollOp::AllToAll, two_nodes, m, 1 << 20, want, true), InputError);  // direct is Simple only
  want.protocol = "fast";
  EXPECT_THROW(choose(CollOp::AllReduce, two_nodes, m, 1 << 20, want, false), InputError);
}

TEST(CollectiveTuner, ProtocolFactorsAreNcclsTuningModel) {
  // NVIDIA/nccl src/graph/tuning.cc @b6475625.
  EXPECT_DOUBLE_EQ(nccl::ring_bw_factor(Protocol::LL, CollOp::AllReduce, 1, 8), 0.25);
  EXPECT_DOUBLE_EQ(nccl::ring_bw_factor(Protocol::LL, CollOp::AllGather, 1, 8), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(nccl::ring_bw_factor(Protocol::LL128, CollOp::AllReduce, 2, 8), 0.92);
  EXPECT_DOUBLE_EQ(nccl::ring_bw_factor(Protocol::LL128, CollOp::AllReduce, 2, 1), 0.7);
  EXPECT_DOUBLE_EQ(nccl::tree_bw_factor(Protocol::Simple, 4), 0.92);
  EXPECT_DOUBLE_EQ(nccl::hw_latency_us(nccl::Hw::NVLink, nccl::Algo::Ring, Protocol::Simple), 3.4);
  EXPECT_DOUBLE_EQ(nccl::hw_latency_us(nccl::Hw::Net, nccl::Algo::Ring, Protocol::Simple), 14.0);
  EXPECT_DOUBLE_EQ(nccl::hw_latency_us(nccl::Hw::NVLink, nccl::Algo::Nvls, Protocol::Simple), 23.0);
  // A user's latency scales NCCL's row: half the NVLink latency, half every NVLink step.
  CommModel m = CommModel::of(preset("dgx-h100", 1));
  const double ll = nccl::step_latency(m, nccl::Hw::NVLink, nccl::Algo::Ring, Protocol::LL);
  m.nvlink_latency /= 2;
  EXPECT_DOUBLE_EQ(nccl::step_latency(m, nccl::Hw::NVLink, nccl::Algo::Ring, Protocol::LL), ll / 2);
}

TEST(Collectives, RingClosedFormIsTheTextbookAlphaBeta) {
  // One node of 8 H100, Simple: 2(n-1)/n S / B + 2(n-1) alpha (Patarasuk & Yuan 2009).
  const ClusterSpec c = preset("dgx-h100", 1);
  const CommModel m = CommModel::of(c);
  const double S = 1 << 30;
  const double expect = 2.0 * 7 / 8 * S / (450e9 * 370.0 / 450.0) + 14 * 3.4e-6;
  EXPECT_NEAR(ring_algorithm().closed_form(CollOp::AllReduce, layout(c, range(0, 8)), m, S, Protocol::Simple), expect,
              1e-12 * expect);
}

}  // namespace
}  // namespace dtsim::collectives
