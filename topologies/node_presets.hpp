#pragma once
// Registry of node presets by name (case-insensitive), one shipped file each:
// topologies/nodes/*.yaml (compiled in, parsed once on first use; topologies/preset_files.hpp
// has the file schema). A "node" is one NVLink domain: 8 GPUs behind NVSwitch in a DGX, 72
// GPUs behind the NVLink Switch trays of an NVL72 rack. A node preset fills
// cluster.gpus_per_node, cluster.nvlink (incl. nvls_efficiency), cluster.nics_per_node,
// cluster.nic, cluster.hbm_reserve and cluster.host_dispatch, and names the GPU preset used
// when cluster.gpu is absent. Every number cites its source beside it in its file.
// Units are those of dtsim::LinkSpec / ClusterSpec: B/s per direction, seconds, bytes.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim {

struct NodePreset {
  std::string name;
  std::string gpu;             // GPU preset name (topologies/gpu_presets.hpp), or a user's GPU file as written
  GpuSpec gpu_spec;            // that GPU, resolved when the preset was read
  int64_t gpus_per_node = 0;
  /// How the node's GPUs are joined (ClusterSpec::intra_node; a node file's intra_node, one
  /// of intra_node_topologies()): NVSwitch, or a direct link per GPU pair (xgmi_mesh, AMD
  /// Instinct platforms).
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

/// The valid values of a node file's intra_node key (the topology inside an NVLink domain):
/// "nvswitch" (every GPU one switch hop from every other).
const std::vector<std::string>& intra_node_topologies();

/// The shipped file a node preset was read from (e.g. "topologies/nodes/dgx-h100.yaml"),
/// "" for a name that is not a preset.
std::string node_preset_file(std::string_view name);

/// host_dispatch of a cluster described without a node preset: the x86 DGX figure
/// (13.48 us, NVIDIA/TransformerEngine#2053; topologies/nodes/README.md).
double default_host_dispatch();

/// The preset named `name` (case-insensitive), or nullptr when there is none.
const NodePreset* find_node_preset(std::string_view name);

/// A cluster of `nodes` nodes of preset `n`: its GPU preset, GPUs per node, NVLink, NICs,
/// HBM reserve, NVLS efficiency and host dispatch (name and fabric left default).
ClusterSpec cluster_of(const NodePreset& n, int64_t nodes);

/// The preset named `name` (case-insensitive).
/// Throws InputError(`unknown node preset "X" (valid: dgx-a100, ...)`). Every accessor throws
/// InputError naming the file when a shipped preset file is invalid (tests parse them all).
const NodePreset& node_preset(std::string_view name);

/// Canonical names of every preset, in registry order.
std::vector<std::string> node_preset_names();

/// The names joined by ", " (for error messages).
std::string node_preset_list();

}  // namespace dtsim
