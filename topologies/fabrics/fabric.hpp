#pragma once
// Registry of fabric types by name, one file each (topologies/fabrics/*.cpp): the switch
// tiers a Topology puts above the NICs. Names: non-blocking, leaf-spine, rail-optimized,
// clos. Every builder connects each NIC's up/down link (bandwidth = NIC line rate x NCCL
// efficiency) to its first switch; tiers above carry the capacity below them divided by
// their oversubscription (cluster.fabric_shape, models/experiment.hpp).
//
// Sources for the shapes:
//   non-blocking   a full-bisection fat tree (Leiserson 1985; Al-Fares et al. SIGCOMM 2008)
//                  seen at flow level: one ideal switch, only the NIC links constrain.
//   leaf-spine     nodes_per_leaf nodes (all their NICs) per leaf; leaf uplinks = NIC
//                  capacity / oversubscription into a non-blocking spine layer.
//   rail-optimized NIC r of every node of a group of nodes_per_leaf nodes on rail leaf r
//                  (NVIDIA DGX SuperPOD reference architecture: rail-optimized scalable units
//                  of 32 DGX nodes, one leaf per rail); rail leaves join a spine layer with
//                  `oversubscription`. Same-rail traffic never leaves its rail leaf.
//   clos           three tiers: leaves of nodes_per_leaf nodes, pods of leaves_per_pod
//                  leaves, a core; oversubscription per tier (Llama 3 paper Sec 3.3.1: a
//                  3-layer Clos, full bisection inside 3,072-GPU pods, 1:7 oversubscription
//                  at the aggregation layer).
#include <string>
#include <string_view>
#include <vector>

#include "models/experiment.hpp"
#include "topologies/topology.hpp"

namespace dtsim {

struct FabricType {
  const char* name;
  const char* description;
  /// cluster.fabric.* keys this type reads (besides `type`), and those it requires.
  std::vector<std::string> keys;
  std::vector<std::string> required;
  /// Adds the switches above topo's NIC vertices. Throws InputError when the shape does not
  /// fit the cluster.
  void (*build)(const ClusterSpec& cluster, Topology& topo);
};

/// Every registered type, in registry order.
const std::vector<const FabricType*>& fabric_types();
/// The type named `name` (exact), or nullptr.
const FabricType* find_fabric_type(std::string_view name);
/// The names joined by ", " (for messages).
std::string fabric_type_list();

// One per file (topologies/fabrics/<name>.cpp); listed in fabrics/registry.cpp.
const FabricType& non_blocking_fabric();
const FabricType& leaf_spine_fabric();
const FabricType& rail_optimized_fabric();
const FabricType& clos_fabric();

/// Shared by the tiered builders: NIC i hangs off leaf leaf_of[i] (leaves 0..L-1); leaves
/// are grouped into pods of `leaves_per_pod` (0: no pod tier) under one top switch. Leaf
/// uplink = NIC bandwidth below / leaf_oversubscription; pod uplink = leaf uplinks below /
/// pod_oversubscription.
void build_switch_tree(const ClusterSpec& cluster, Topology& topo, const std::vector<int64_t>& leaf_of,
                       double leaf_oversubscription, int64_t leaves_per_pod, double pod_oversubscription);

}  // namespace dtsim
