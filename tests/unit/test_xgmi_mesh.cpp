// AMD Instinct nodes (cluster.intra_node = xgmi-mesh; topologies/topology.hpp, sim/platform.cpp,
// sim/collectives/collective.hpp CommModel::intra_bw): the graph has one link per GPU pair, a
// transfer between two GPUs crosses only their link on the SimGrid platform, RCCL's rings and
// the AllToAll use every link of the mesh, the tuner knows the mesh (no NVLS, no LL128), the
// YAML key, the presets, and the two engines agree on the shipped MI300X example.
#include <gtest/gtest.h>

#include <boost/graph/graph_traits.hpp>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "sim/analytic_engine.hpp"
#include "sim/collectives/collective.hpp"
#include "sim/collectives/registry.hpp"
#include "sim/collectives/simulate.hpp"
#include "sim/collectives/tuner.hpp"
#include "sim/engine.hpp"
#include "topologies/gpu_presets.hpp"
#include "topologies/node_presets.hpp"
#include "topologies/topology.hpp"

namespace dtsim {
namespace {

using collectives::CollOp;
using collectives::CommModel;
using collectives::GroupLayout;
using collectives::Protocol;

ClusterSpec preset(const std::string& node, int64_t nodes) { return cluster_of(node_preset(node), nodes); }

std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

GroupLayout layout(const ClusterSpec& c, std::vector<int64_t> members) {
  return GroupLayout::of(std::move(members), c.gpus_per_node, c.gpus_per_node / c.nics_per_node);
}

// Per-direction rate of one MI300X xGMI link as RCCL sustains it (topologies/nodes/mi300x.yaml):
// 64 GB/s x 318.98 / 448.
constexpr double kLinkBw = 64e9 * 318.98 / 448.0;

TEST(XgmiMesh, PresetsAreMeshNodes) {
  for (const char* name : {"mi300x", "mi325x", "mi355x"}) {
    const NodePreset& n = node_preset(name);
    EXPECT_EQ(n.intra_node, IntraNode::xgmi_mesh) << name;
    EXPECT_EQ(n.gpus_per_node, 8) << name;
    EXPECT_EQ(n.nics_per_node, 8) << name;
    EXPECT_EQ(n.nvls_efficiency, 0.0) << name;
    EXPECT_NE(find_gpu_preset(n.gpu), nullptr) << name;
  }
  EXPECT_DOUBLE_EQ(node_preset("mi300x").nvlink.bandwidth, 64e9);
  EXPECT_DOUBLE_EQ(node_preset("mi355x").nvlink.bandwidth, 76.8e9);
  EXPECT_EQ(preset("mi300x", 2).intra_node, IntraNode::xgmi_mesh);
  EXPECT_EQ(preset("dgx-h100", 2).intra_node, IntraNode::nvswitch);
  const GpuSpec& mi300 = gpu_preset("mi300x");
  EXPECT_DOUBLE_EQ(mi300.peak_bf16_flops, 1307.4e12);
  EXPECT_EQ(mi300.sm_count, 304);
  EXPECT_FALSE(mi300.microscaling);
  const GpuSpec& mi355 = gpu_preset("MI355X");
  EXPECT_TRUE(mi355.microscaling);
  EXPECT_DOUBLE_EQ(mi355.peak_fp4_flops, 10100e12);
  EXPECT_EQ(mi355.sm_count, 256);
  EXPECT_DOUBLE_EQ(gpu_preset("MI325X").hbm_bytes, 256.0 * 1024 * 1024 * 1024);
}

TEST(XgmiMesh, GraphHasOneLinkPerGpuPairAndNoSwitch) {
  const Topology t(preset("mi300x", 2));
  EXPECT_EQ(t.intra_node(), IntraNode::xgmi_mesh);
  int64_t switches = 0, xgmi = 0;
  for (auto [v, end] = boost::vertices(t.graph()); v != end; ++v) switches += t.graph()[*v].kind == VertexKind::nvswitch;
  EXPECT_EQ(switches, 0);
  for (const TopoLink& l : t.links()) {
    if (l.kind != LinkKind::xgmi) continue;
    ++xgmi;
    EXPECT_NEAR(l.bandwidth, kLinkBw, 1e-3);
  }
  EXPECT_EQ(xgmi, 2 * 8 * 7);                          // every ordered pair of each node
  EXPECT_EQ(t.links().size(), static_cast<size_t>(2 * 8 * 7 + 16 * 2));  // + NIC up/down
  // Inside a node: the pair's own link, a different one for every ordered pair.
  std::set<int64_t> seen;
  for (int64_t a = 8; a < 16; ++a)
    for (int64_t b = 8; b < 16; ++b) {
      if (a == b) continue;
      const auto r = t.route(a, b);
      ASSERT_EQ(r.size(), 1u);
      EXPECT_EQ(r[0], t.mesh_link(a, b));
      EXPECT_EQ(t.links()[static_cast<size_t>(r[0])].kind, LinkKind::xgmi);
      seen.insert(r[0]);
    }
  EXPECT_EQ(seen.size(), 56u);
  EXPECT_EQ(t.mesh_link(1, 9), -1);  // different nodes
  // Across nodes the NICs, as on NVSwitch nodes.
  const auto r = t.route(3, 11);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(t.links()[static_cast<size_t>(r[0])].kind, LinkKind::nic_up);
  EXPECT_EQ(t.links()[static_cast<size_t>(r[1])].kind, LinkKind::nic_down);
}

TEST(XgmiMesh, TwoGpuTransferUsesOnlyItsPairLink) {
  const double S = 1 << 30;
  // Alone: S / link rate (plus the 1 ns latency of its one link, sim/platform.hpp).
  const auto alone = collectives::simulate_transfers_isolated(preset("mi300x", 1), {{0, 1, S}});
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_NEAR(alone[0], S / kLinkBw, 1e-6 * S / kLinkBw);
  // Several transfers from and to the same GPUs at once: distinct pairs, distinct links, so
  // none slows another.
  const std::vector<collectives::Flow> fan = {{0, 1, S}, {0, 2, S}, {0, 7, S}, {3, 1, S}, {5, 4, S}};
  for (double t : collectives::simulate_transfers_isolated(preset("mi300x", 1), fan))
    EXPECT_NEAR(t, S / kLinkBw, 1e-6 * S / kLinkBw);
  // On an NVSwitch node GPU 0's one port into the switch is shared by its two transfers.
  const double nv = 450e9 * 370.0 / 450.0;
  const auto sw = collectives::simulate_transfers_isolated(preset("dgx-h100", 1), {{0, 1, S}, {0, 2, S}});
  ASSERT_EQ(sw.size(), 2u);
  EXPECT_NEAR(sw[0], 2 * S / nv, 1e-6 * S / nv);
  EXPECT_NEAR(sw[1], 2 * S / nv, 1e-6 * S / nv);
}

TEST(XgmiMesh, RingAllReduceRunsOnEveryLinkAsRcclsRings) {
  // RCCL's rings over the 8-GPU mesh cover every directed link equally (rome_model_79/81,
  // CommModel): the ring's per-GPU rate is 7 links. One node, Simple:
  //   T = 2(n-1)/n S / ((n-1) B_link) + 2(n-1) alpha,   alpha = 2.1 us (RCCL tuning_model_5).
  const ClusterSpec c = preset("mi300x", 1);
  const CommModel m = CommModel::of(c);
  EXPECT_TRUE(m.mesh);
  EXPECT_NEAR(m.intra_bw(8), 7 * kLinkBw, 1e-3);
  EXPECT_NEAR(m.intra_bw(4), 3 * kLinkBw, 1e-3);
  EXPECT_NEAR(m.intra_bw(2), kLinkBw, 1e-3);
  const double S = 16.0 * (1 << 30);
  const double expect = 2.0 * 7 / 8 * S / (7 * kLinkBw) + 14 * 2.1e-6;
  const double t = collectives::ring_algorithm().closed_form(CollOp::AllReduce, layout(c, range(0, 8)), m, S,
                                                            Protocol::Simple);
  EXPECT_NEAR(t, expect, 1e-12 * expect);
  // busbw = 2(n-1)/n S / T: the measured 318.98 GB/s at 16 GiB (rccl-tests, AMD ROCm blog) up
  // to the latency term.
  EXPECT_NEAR(2.0 * 7 / 8 * S / t / 1e9, 318.98, 0.1);
  // Four GPUs of the node: their 3 links each (RCCL README: a fraction of the bandwidth).
  const double t4 = collectives::ring_algorithm().closed_form(CollOp::AllReduce, layout(c, range(0, 4)), m, S,
                                                             Protocol::Simple);
  EXPECT_NEAR(t4, 2.0 * 3 / 4 * S / (3 * kLinkBw) + 6 * 2.1e-6, 1e-9 * t4);
  // The tuner picks the ring for a large AllReduce; never NVLS (no switch) nor LL128 (RCCL's
  // MI300X tuning model gives it no bandwidth).
  for (double bytes : {4096.0, 65536.0, 1.0 * (1 << 20), 16.0 * (1 << 20), S}) {
    const auto ch = collectives::choose(CollOp::AllReduce, layout(c, range(0, 8)), m, bytes, {}, false);
    EXPECT_NE(ch.algorithm->name(), "nvls") << bytes;
    EXPECT_NE(ch.protocol, Protocol::LL128) << bytes;
  }
  EXPECT_EQ(collectives::choose(CollOp::AllReduce, layout(c, range(0, 8)), m, S, {}, false).algorithm->name(), "ring");
  EXPECT_FALSE(collectives::nvls_algorithm().unsupported(CollOp::AllReduce, layout(c, range(0, 8)), m).empty());
  try {
    collectives::choose(CollOp::AllReduce, layout(c, range(0, 8)), m, S, {"ring", "ll128"}, true);
    ADD_FAILURE() << "LL128 forced on a mesh ran";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("protocol LL128 does not run on an xgmi mesh"), std::string::npos) << e.what();
  }
  // Not strict (cluster.collectives in a training step): the automatic choice, as NCCL falls back.
  EXPECT_NE(collectives::choose(CollOp::AllReduce, layout(c, range(0, 8)), m, S, {"ring", "ll128"}, false).protocol,
            Protocol::LL128);
}

TEST(XgmiMesh, AllToAllUsesAllSevenLinksAtOnce) {
  // Each GPU sends 7 chunks of S/8, one over each of its 7 links, all at once: S/8 / B_link.
  const ClusterSpec c = preset("mi300x", 1);
  const CommModel m = CommModel::of(c);
  const double S = 1 << 30;
  const double t = collectives::direct_algorithm().closed_form(CollOp::AllToAll, layout(c, range(0, 8)), m, S,
                                                              Protocol::Simple);
  EXPECT_NEAR(t, S / 8 / kLinkBw + 2.1e-6, 1e-12 * t);
  // A pair: S/2 over its one link.
  const double t2 = collectives::direct_algorithm().closed_form(CollOp::AllToAll, layout(c, {0, 5}), m, S,
                                                               Protocol::Simple);
  EXPECT_NEAR(t2, S / 2 / kLinkBw + 2.1e-6, 1e-12 * t2);
}

TEST(XgmiMesh, SimulatedCollectivesEqualTheirClosedForms) {
  // Two MI300X nodes: ring AllReduce inside a node and across both, the AllToAll across both,
  // alone on the platform, match their closed forms (as every algorithm does on NVSwitch
  // nodes, tests/unit/test_collectives.cpp).
  const ClusterSpec c = preset("mi300x", 2);
  const CommModel m = CommModel::of(c);
  struct Case {
    std::vector<int64_t> members;
    CollOp op;
    std::string algo;
  };
  const std::vector<Case> cases = {{range(0, 8), CollOp::AllReduce, "ring"},
                                   {range(0, 16), CollOp::AllReduce, "ring"},
                                   {{0, 1, 2, 3, 8, 9, 10, 11}, CollOp::AllGather, "ring"},
                                   {range(0, 16), CollOp::AllToAll, "direct"},
                                   {range(0, 16), CollOp::AllReduce, "tree"}};
  const double S = 256.0 * (1 << 20);
  std::vector<collectives::CollectiveRun> runs;
  for (size_t i = 0; i < cases.size(); ++i) {
    collectives::CollectiveRun r;
    r.members = cases[i].members;
    r.op = cases[i].op;
    r.bytes = S;
    r.choice = {cases[i].algo, "simple"};
    r.batch = static_cast<int>(i);
    runs.push_back(r);
  }
  const auto t = collectives::simulate_collectives_isolated(c, runs);
  ASSERT_EQ(t.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const double closed = collectives::algorithm(cases[i].algo).closed_form(cases[i].op, layout(c, cases[i].members), m,
                                                                           S, Protocol::Simple);
    EXPECT_NEAR(t[i].time_s, closed, 1e-6 * closed + 1e-8) << cases[i].algo << " case " << i;
  }
}

TEST(XgmiMesh, YamlKeyAndItsErrors) {
  const std::string model =
      "model: {name: tiny, layers: 4, hidden: 1024, heads: 16, kv_heads: 16, ffn_hidden: 4096, activation: gelu,\n"
      "        vocab: 8192, tied_embeddings: false, norm: layernorm, position: learned}\n"
      "layout: {dp: 8, tp: 1, pp: 1}\ntraining: {seq_len: 1024, global_batch: 16, micro_batch: 1}\n";
  const Experiment e = parse_experiment(model + "cluster: {node: mi300x, nodes: 1}\n", "a.yaml");
  EXPECT_EQ(e.cluster.intra_node, IntraNode::xgmi_mesh);
  EXPECT_EQ(e.cluster.gpu.name, "MI300X");
  const Experiment h = parse_experiment(model + "cluster: {node: dgx-h100, nodes: 1}\n", "b.yaml");
  EXPECT_EQ(h.cluster.intra_node, IntraNode::nvswitch);
  const Experiment o = parse_experiment(model + "cluster: {node: dgx-h100, nodes: 1, intra_node: xgmi-mesh, "
                                                "nvlink: {nvls_efficiency: 0}}\n",
                                        "c.yaml");
  EXPECT_EQ(o.cluster.intra_node, IntraNode::xgmi_mesh);
  auto problems = [&](const std::string& cluster) -> std::vector<std::string> {
    try {
      parse_experiment(model + cluster, "exp.yaml");
    } catch (const InputError& err) {
      return err.problems();
    }
    return {};
  };
  const auto bad = problems("cluster: {node: mi300x, nodes: 1, intra_node: torus}\n");
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_NE(bad[0].find("cluster.intra_node=\"torus\" is not one of nvswitch, xgmi-mesh"), std::string::npos) << bad[0];
  const auto nvls = problems("cluster: {node: mi300x, nodes: 1, nvlink: {nvls_efficiency: 0.5}}\n");
  ASSERT_EQ(nvls.size(), 1u);
  EXPECT_NE(nvls[0].find("must be 0 with cluster.intra_node=xgmi-mesh"), std::string::npos) << nvls[0];
}

TEST(XgmiMesh, AnalyticAgreesWithSimGridOnTheMi300xExample) {
  // The bound of tests/unit/test_analytic.cpp (10%) on the shipped MI300X example.
  const Experiment e =
      load_experiment((std::filesystem::path(DTSIM_SOURCE_DIR) / "experiments/examples/mi300x-llama3-70b.yaml").string());
  EXPECT_EQ(e.cluster.intra_node, IntraNode::xgmi_mesh);
  const StepResult des = simulate_step_isolated(e);
  const StepResult an = simulate_step_analytic(e);
  RecordProperty("analytic_s", std::to_string(an.step_time_s));
  RecordProperty("simgrid_s", std::to_string(des.step_time_s));
  EXPECT_NEAR(an.step_time_s / des.step_time_s, 1.0, 0.10)
      << "analytic " << an.step_time_s << " s, SimGrid " << des.step_time_s << " s";
}

}  // namespace
}  // namespace dtsim
