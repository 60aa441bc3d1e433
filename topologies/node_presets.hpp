#pragma once
// Registry of node presets by name (case-insensitive): dgx-a100, dgx-h100, dgx-h200,
// dgx-b200, gb200-nvl72, dgx-h800, mi300x, mi325x, mi355x (AMD Instinct platforms: 8 GPUs on
// a fully connected Infinity Fabric (xGMI) mesh, intra_node xgmi_mesh). A "node" is one NVLink domain: 8 GPUs behind NVSwitch in a DGX,
// 72 GPUs behind the NVLink Switch trays of a GB200 NVL72 rack. A node preset fills
// cluster.gpus_per_node, cluster.nvlink (incl. nvls_efficiency), cluster.nics_per_node,
// cluster.nic and cluster.hbm_reserve, and names the GPU preset used when cluster.gpu is
// absent. Every number cites its source in topologies/node_presets.cpp.
// Units are those of dtsim::LinkSpec / ClusterSpec: B/s per direction, seconds, bytes.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim {

struct NodePreset {
  std::string name;
  std::string gpu;             // GPU preset name (topologies/gpu_presets.hpp)
  int64_t gpus_per_node = 0;
  /// How the node's GPUs are joined (ClusterSpec::intra_node): NVSwitch, or a direct link per
  /// GPU pair (xgmi_mesh, AMD Instinct platforms).
  IntraNode intra_node = IntraNode::nvswitch;
  LinkSpec nvlink;             // nvswitch: per GPU into the switch; xgmi_mesh: per peer link
  int64_t nics_per_node = 0;   // compute NICs (storage/management NICs excluded)
  LinkSpec nic;                // per NIC
  double hbm_reserve_bytes = 0;
  /// NVLink SHARP (NVLS, in-switch reduction): per-GPU NVLink rate that an NVLS AllReduce
  /// sustains / NVLink line rate; 0 when the NVSwitch has no SHARP (NVSwitch gen 2, A100).
  double nvls_efficiency = 0;
  /// Host CPU seconds per eager kernel launch on this node's CPUs (ClusterSpec::host_dispatch).
  double host_dispatch = 0;
};

/// host_dispatch of a cluster described without a node preset: the x86 DGX figure
/// (13.48 us, NVIDIA/TransformerEngine#2053; topologies/node_presets.cpp).
double default_host_dispatch();

/// The preset named `name` (case-insensitive), or nullptr when there is none.
const NodePreset* find_node_preset(std::string_view name);

/// A cluster of `nodes` nodes of preset `n`: its GPU preset, GPUs per node, NVLink, NICs,
/// HBM reserve and NVLS efficiency (name and fabric left default). Throws InputError when
/// the preset's GPU is not a GPU preset.
ClusterSpec cluster_of(const NodePreset& n, int64_t nodes);

/// The preset named `name` (case-insensitive).
/// Throws InputError(`unknown node preset "X" (valid: dgx-a100, ...)`).
const NodePreset& node_preset(std::string_view name);

/// Canonical names of every preset, in registry order.
std::vector<std::string> node_preset_names();

/// The names joined by ", " (for error messages).
std::string node_preset_list();

}  // namespace dtsim
