// Cluster graphs (topologies/topology.hpp): shape per preset and fabric, routes, uplink
// capacities, and the YAML keys that describe them.
#include <gtest/gtest.h>

#include <boost/graph/graph_traits.hpp>

#include <string>
#include <vector>

#include "models/errors.hpp"
#include "models/experiment_io.hpp"
#include "topologies/fabrics/fabric.hpp"
#include "topologies/node_presets.hpp"
#include "topologies/topology.hpp"

namespace dtsim {
namespace {

ClusterSpec preset(const std::string& node, int64_t nodes) { return cluster_of(node_preset(node), nodes); }

std::vector<LinkKind> kinds(const Topology& t, int64_t src, int64_t dst) {
  std::vector<LinkKind> out;
  for (int64_t l : t.route(src, dst)) out.push_back(t.links()[static_cast<size_t>(l)].kind);
  return out;
}

int64_t count_vertices(const Topology& t, VertexKind k) {
  int64_t n = 0;
  for (auto [v, end] = boost::vertices(t.graph()); v != end; ++v) n += t.graph()[*v].kind == k ? 1 : 0;
  return n;
}

TEST(Topology, DgxH100NonBlockingShapeAndRoutes) {
  const Topology t(preset("dgx-h100", 4));
  EXPECT_EQ(t.gpus(), 32);
  EXPECT_EQ(t.nics(), 32);
  EXPECT_EQ(count_vertices(t, VertexKind::gpu), 32);
  EXPECT_EQ(count_vertices(t, VertexKind::nvswitch), 4);
  EXPECT_EQ(count_vertices(t, VertexKind::nic), 32);
  EXPECT_EQ(count_vertices(t, VertexKind::core), 1);
  // 2 NVLink + 2 NIC links per GPU (one NIC per GPU), plus one PCIe edge per GPU.
  EXPECT_EQ(t.links().size(), 32u * 4);
  EXPECT_EQ(boost::num_edges(t.graph()), 32u * 5);
  EXPECT_FALSE(t.has_switch_uplinks());
  // Inside a node: NVLink up then down; the per-direction rate is line x efficiency.
  EXPECT_EQ(kinds(t, 1, 6), (std::vector<LinkKind>{LinkKind::nvlink_up, LinkKind::nvlink_down}));
  EXPECT_NEAR(t.links()[static_cast<size_t>(t.route(1, 6)[0])].bandwidth, 370e9, 1e3);  // 450 GB/s x 370/450
  // Across nodes: the two NICs (rail of the source, rail of the destination).
  EXPECT_EQ(kinds(t, 3, 11), (std::vector<LinkKind>{LinkKind::nic_up, LinkKind::nic_down}));
  EXPECT_NEAR(t.links()[static_cast<size_t>(t.route(3, 11)[0])].bandwidth, 47e9, 1e3);  // NDR 50 GB/s x 0.94
  EXPECT_TRUE(t.route(5, 5).empty());
}

TEST(Topology, SharedNicsMapGpusInOrder) {
  ClusterSpec c = preset("dgx-a100", 2);
  c.nics_per_node = 4;
  const Topology t(c);
  EXPECT_EQ(t.gpus_per_nic(), 2);
  EXPECT_EQ(t.nic_of(0), 0);
  EXPECT_EQ(t.nic_of(1), 0);
  EXPECT_EQ(t.nic_of(7), 3);
  EXPECT_EQ(t.nic_of(8), 4);
  EXPECT_EQ(t.rail_of(13), 2);
  // GPUs 0 and 1 leave through the same NIC link.
  EXPECT_EQ(t.route(0, 8).front(), t.route(1, 9).front());
}

TEST(Topology, Gb200Nvl72IsOneNvlinkDomainOf72Gpus) {
  const NodePreset& n = node_preset("gb200-nvl72");
  EXPECT_EQ(n.gpus_per_node, 72);
  EXPECT_EQ(n.nics_per_node, 72);
  EXPECT_DOUBLE_EQ(n.nvlink.bandwidth, 900e9);  // NVLink 5: 1.8 TB/s bidirectional
  EXPECT_GT(n.nvls_efficiency, 0);
  const Topology t(preset("gb200-nvl72", 2));
  EXPECT_EQ(count_vertices(t, VertexKind::nvswitch), 2);
  EXPECT_EQ(kinds(t, 0, 71), (std::vector<LinkKind>{LinkKind::nvlink_up, LinkKind::nvlink_down}));
  EXPECT_EQ(kinds(t, 0, 72), (std::vector<LinkKind>{LinkKind::nic_up, LinkKind::nic_down}));
}

TEST(Topology, NvlsOnlyWhereTheNvswitchHasSharp) {
  EXPECT_EQ(node_preset("dgx-a100").nvls_efficiency, 0.0);  // NVSwitch gen 2: no SHARP
  for (const char* n : {"dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72"}) EXPECT_GT(node_preset(n).nvls_efficiency, 0) << n;
  // 275 GB/s algbw x 9/8 per direction of 450 GB/s (nccl-tests#212).
  EXPECT_NEAR(node_preset("dgx-h100").nvls_efficiency, 0.6875, 1e-12);
}

TEST(Topology, LeafSpineOversubscriptionDividesUplinks) {
  ClusterSpec c = preset("dgx-h100", 8);
  c.fabric = "leaf-spine";
  c.fabric_shape.nodes_per_leaf = 4;
  c.fabric_shape.oversubscription = 2;
  const Topology t(c);
  EXPECT_TRUE(t.has_switch_uplinks());
  EXPECT_EQ(count_vertices(t, VertexKind::leaf), 2);
  EXPECT_EQ(count_vertices(t, VertexKind::spine), 1);
  // Same leaf (nodes 0 and 3): NIC links only.
  EXPECT_EQ(kinds(t, 0, 3 * 8 + 5), (std::vector<LinkKind>{LinkKind::nic_up, LinkKind::nic_down}));
  // Across leaves (node 0 to node 4): up through the leaf uplink, down through the other.
  const auto r = t.route(0, 4 * 8);
  EXPECT_EQ(kinds(t, 0, 32), (std::vector<LinkKind>{LinkKind::nic_up, LinkKind::leaf_up, LinkKind::leaf_down,
                                                    LinkKind::nic_down}));
  // Uplink = 4 nodes x 8 NICs x 47 GB/s / 2.
  EXPECT_NEAR(t.links()[static_cast<size_t>(r[1])].bandwidth, 4 * 8 * 47e9 / 2, 1e3);
}

TEST(Topology, RailOptimizedKeepsSameRailTrafficOnItsLeaf) {
  ClusterSpec c = preset("dgx-h100", 4);
  c.fabric = "rail-optimized";
  c.fabric_shape.nodes_per_leaf = 2;  // two rail groups of 2 nodes
  const Topology t(c);
  EXPECT_EQ(count_vertices(t, VertexKind::leaf), 2 * 8);
  // Rail 3 of node 0 to rail 3 of node 1 (same group): one rail leaf.
  EXPECT_EQ(kinds(t, 3, 8 + 3), (std::vector<LinkKind>{LinkKind::nic_up, LinkKind::nic_down}));
  // Rail 3 to rail 4: through the spine.
  EXPECT_EQ(kinds(t, 3, 8 + 4).size(), 4u);
  // Same rail, other group: through the spine too.
  EXPECT_EQ(kinds(t, 3, 2 * 8 + 3).size(), 4u);
}

TEST(Topology, ClosRoutesClimbToTheLowestCommonTier) {
  ClusterSpec c = preset("dgx-h100", 8);
  c.fabric = "clos";
  c.fabric_shape.nodes_per_leaf = 2;
  c.fabric_shape.leaves_per_pod = 2;
  c.fabric_shape.oversubscription = 1;
  c.fabric_shape.pod_oversubscription = 7;  // Llama 3 aggregation layer
  const Topology t(c);
  EXPECT_EQ(count_vertices(t, VertexKind::leaf), 4);
  EXPECT_EQ(count_vertices(t, VertexKind::spine), 2);
  EXPECT_EQ(count_vertices(t, VertexKind::core), 1);
  EXPECT_EQ(kinds(t, 0, 8).size(), 2u);       // same leaf
  EXPECT_EQ(kinds(t, 0, 2 * 8).size(), 4u);   // same pod
  const auto r = t.route(0, 4 * 8);           // other pod
  EXPECT_EQ(kinds(t, 0, 32), (std::vector<LinkKind>{LinkKind::nic_up, LinkKind::leaf_up, LinkKind::pod_up,
                                                    LinkKind::pod_down, LinkKind::leaf_down, LinkKind::nic_down}));
  // Pod uplink: 2 leaves x (2 nodes x 8 x 47 GB/s) / 7.
  EXPECT_NEAR(t.links()[static_cast<size_t>(r[2])].bandwidth, 2 * 2 * 8 * 47e9 / 7, 1e3);
}

TEST(Topology, BadFabricsThrowInputError) {
  ClusterSpec c = preset("dgx-h100", 2);
  c.fabric = "torus";
  EXPECT_THROW(Topology{c}, InputError);
  c.fabric = "leaf-spine";
  c.fabric_shape.nodes_per_leaf = 0;
  EXPECT_THROW(Topology{c}, InputError);
  c.fabric_shape.nodes_per_leaf = 1;
  c.fabric_shape.oversubscription = 0.5;
  EXPECT_THROW(Topology{c}, InputError);
  EXPECT_EQ(fabric_type_list(), "non-blocking, leaf-spine, rail-optimized, clos");
}

// ---- YAML ----

std::string experiment(const std::string& cluster) {
  return "model: {name: t, layers: 2, hidden: 64, heads: 4, ffn_hidden: 256, vocab: 64, activation: gelu,\n"
         "        tied_embeddings: false, norm: layernorm, position: learned}\n"
         "cluster: " + cluster + "\n"
         "layout: {dp: auto, tp: 1}\n"
         "training: {seq_len: 64, global_batch: 576, micro_batch: 1}\n";
}

std::vector<std::string> problems(const std::string& cluster, const std::vector<std::string>& sets = {}) {
  try {
    parse_experiment(experiment(cluster), "exp.yaml", sets);
  } catch (const InputError& e) {
    return e.problems();
  }
  return {};
}

TEST(TopologyYaml, FabricMapFillsTheShape) {
  const auto e = parse_experiment(
      experiment("{node: dgx-h100, nodes: 8, fabric: {type: clos, nodes_per_leaf: 2, leaves_per_pod: 2, "
                 "pod_oversubscription: 7}}"),
      "exp.yaml");
  EXPECT_EQ(e.cluster.fabric, "clos");
  EXPECT_EQ(e.cluster.fabric_shape.nodes_per_leaf, 2);
  EXPECT_EQ(e.cluster.fabric_shape.leaves_per_pod, 2);
  EXPECT_DOUBLE_EQ(e.cluster.fabric_shape.oversubscription, 1.0);
  EXPECT_DOUBLE_EQ(e.cluster.fabric_shape.pod_oversubscription, 7.0);
  EXPECT_GT(e.cluster.nvls_efficiency, 0);  // from the dgx-h100 preset
  const Topology t(e.cluster);
  EXPECT_EQ(t.route(0, 32).size(), 6u);
}

TEST(TopologyYaml, ScalarFabricAndSetOverrides) {
  const auto e = parse_experiment(experiment("{node: dgx-h100, nodes: 4, fabric: rail-optimized}"), "exp.yaml",
                                  {"cluster.fabric.oversubscription=2", "cluster.collectives.algorithm=ring",
                                   "cluster.collectives.protocol=simple", "cluster.nvlink.nvls_efficiency=0"});
  EXPECT_EQ(e.cluster.fabric, "rail-optimized");
  EXPECT_DOUBLE_EQ(e.cluster.fabric_shape.oversubscription, 2.0);
  EXPECT_EQ(e.cluster.collectives.algorithm, "ring");
  EXPECT_EQ(e.cluster.collectives.protocol, "simple");
  EXPECT_EQ(e.cluster.nvls_efficiency, 0.0);
}

TEST(TopologyYaml, PreciseErrors) {
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2, fabric: torus}"),
            std::vector<std::string>{"exp.yaml: cluster.fabric=\"torus\" is not a fabric type (valid: non-blocking, "
                                     "leaf-spine, rail-optimized, clos)"});
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2, fabric: leaf-spine}"),
            std::vector<std::string>{"exp.yaml: cluster.fabric=leaf-spine needs a map {type: leaf-spine, "
                                     "nodes_per_leaf: ...}"});
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2, fabric: {type: leaf-spine}}"),
            std::vector<std::string>{"exp.yaml: cluster.fabric.nodes_per_leaf is required (fabric type leaf-spine)"});
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2, fabric: {type: leaf-spine, nodes_per_leaf: 1, leaves_per_pod: 2}}"),
            std::vector<std::string>{"exp.yaml: cluster.fabric.leaves_per_pod does not apply to fabric type "
                                     "leaf-spine (it reads: nodes_per_leaf, oversubscription)"});
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2, fabric: {type: leaf-spine, nodes_per_leaf: 1, oversubscription: 0.5}}"),
            std::vector<std::string>{"exp.yaml: cluster.fabric.oversubscription=0.5 must be >= 1 (leaf downlink : "
                                     "uplink capacity)"});
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2, fabric: {nodes_per_leaf: 1}}"),
            std::vector<std::string>{"exp.yaml: cluster.fabric.type is required (one of non-blocking, leaf-spine, "
                                     "rail-optimized, clos)"});
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2, fabric: {type: clos, nodes_per_leaf: 1, leaves_per_pod: 0}}"),
            std::vector<std::string>{"exp.yaml: cluster.fabric.leaves_per_pod=0 must be >= 1 (fabric clos)"});
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2, fabric: {type: non-blocking, spine: 3}}"),
            std::vector<std::string>{"exp.yaml: unknown key cluster.fabric.spine (valid keys under cluster.fabric: "
                                     "type, nodes_per_leaf, oversubscription, leaves_per_pod, pod_oversubscription)"});
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2, collectives: {algorithm: bruck}}"),
            std::vector<std::string>{"exp.yaml: cluster.collectives.algorithm=\"bruck\" is not one of auto, ring, "
                                     "tree, nvls, hierarchical, direct, deepep, p2p"});
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2, collectives: {protocol: LL}}"),
            std::vector<std::string>{"exp.yaml: cluster.collectives.protocol=\"LL\" is not one of auto, simple, ll, "
                                     "ll128"});
  EXPECT_EQ(problems("{node: dgx-h100, nodes: 2}", {"cluster.nvlink.nvls_efficiency=1.5"}),
            std::vector<std::string>{"exp.yaml: cluster.nvlink.nvls_efficiency=1.5 must be in [0, 1] (0: no NVLink "
                                     "SHARP)"});
}

}  // namespace
}  // namespace dtsim
