#pragma once
// The SimGrid platform of a cluster (internal to sim/: includes SimGrid).
//
// Non-blocking fabric: every GPU is a host with an NVLink up and down link into its
// node's NVSwitch; every NIC has an up and down link into the fabric. A route inside a
// node is [nvlink_up(src), nvlink_down(dst)]; between nodes [nic_up(nic(src)),
// nic_down(nic(dst))]. Routes are computed from host indices by a flat custom zone
// (../shared/design/SIMGRID.md: per-GPU NICs cannot be expressed with zone gateways;
// nested zones are slow at 16K GPUs). Link bandwidth = line rate x NCCL efficiency of the
// link class (topologies/node_presets.cpp cites both).
#include <simgrid/s4u.hpp>

#include <cstdint>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim::simgrid_engine {

/// Uniform link latency so that CM02's RTT-weighted sharing is fair between flows;
/// collective latency terms are added as sleeps (SIMGRID.md, "Model flags"). Seconds.
inline constexpr double kLinkLatency = 1e-9;

struct Platform {
  std::vector<simgrid::s4u::Host*> hosts;  // GPU g is hosts[g]
  int64_t gpus_per_node = 1;
  int64_t gpus_per_nic = 1;
  LinkSpec nvlink, nic;
  bool same_node(int64_t a, int64_t b) const { return a / gpus_per_node == b / gpus_per_node; }
  /// Per-step latency (alpha) of a transfer between two GPUs, seconds.
  double alpha(bool intra_node) const { return intra_node ? nvlink.latency : std::max(nvlink.latency, nic.latency); }
};

/// Builds the cluster's hosts and links in the current SimGrid engine (call once, after
/// the engine is created and before it runs).
Platform build_platform(const ClusterSpec& cluster);

}  // namespace dtsim::simgrid_engine
