#pragma once
// The cluster as a graph (Boost.Graph): GPUs, the NVSwitch of every NVLink domain, NICs and
// the fabric's switches, joined by directed links. Built from a ClusterSpec (a node preset or
// the YAML cluster section) and the fabric type it names (topologies/fabrics/fabric.hpp);
// sim/platform.hpp turns it into the SimGrid platform and routes every transfer with
// Topology::route.
//
// Shape (per direction, bandwidth in B/s as NCCL sustains it: line rate x efficiency):
//   GPU g  --nvlink_up-->  NVSwitch(node)  --nvlink_down-->  GPU h      (same NVLink domain)
//   GPU g  --pcie-->  NIC(g)                                           (never a bottleneck)
//   NIC    --nic_up-->  first fabric switch  ...  --nic_down-->  NIC
// A node's NVSwitch stands for all its switch chips (NVSwitch gen 2/3: every GPU reaches every
// other at its full NVLink rate), so one vertex and one up/down edge pair per GPU suffice.
// Above the NICs the fabric is a tree of aggregated switch groups: a leaf's uplink edge
// carries the capacity of all its uplink cables (flow-level view of ECMP spreading, as the
// SimGrid fat-tree zone also does); oversubscription divides it. The PCIe edge from a GPU to
// its NIC is kept in the graph for completeness and left out of routes: PCIe Gen5 x16
// (64 GB/s) is faster than the NDR NIC behind it (50 GB/s) on DGX H100.
//
// cluster.intra_node = xgmi-mesh (AMD Instinct platforms) replaces a node's NVSwitch by a
// fully connected mesh: no switch vertex, one xgmi link per ordered GPU pair of the node
// (src -> dst, cluster.nvlink.bandwidth x efficiency each: the figure is per peer link), so a
// node of k GPUs has k(k-1) directed links and a GPU k-1 outgoing ones. Inside a mesh node the
// route between two GPUs is their own link [xgmi(src, dst)]: transfers between different
// pairs never share a link.
//
// Routes: inside a NVLink domain [nvlink_up(src), nvlink_down(dst)]; across domains the tree
// path between the two NICs: up-links from NIC(src) to the lowest common switch, down-links
// to NIC(dst). Parent links come from a breadth-first search of the graph's down edges.
//
// Errors: the constructor throws InputError when the fabric type is unknown or its shape
// does not fit (e.g. a rail-optimized fabric with one NIC per node is allowed, nodes_per_leaf
// must be positive).
#include <boost/graph/adjacency_list.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "models/experiment.hpp"

namespace dtsim {

enum class VertexKind { gpu, nvswitch, nic, leaf, spine, core };
enum class LinkKind { nvlink_up, nvlink_down, pcie, nic_up, nic_down, leaf_up, leaf_down, pod_up, pod_down, xgmi };
const char* to_string(VertexKind);
const char* to_string(LinkKind);

struct TopoVertex {
  VertexKind kind = VertexKind::gpu;
  int64_t index = 0;  // GPU g, node (NVSwitch), NIC, or switch index within its kind
};

struct TopoEdge {
  LinkKind kind = LinkKind::pcie;
  int64_t link = -1;  // index into Topology::links(); -1 for PCIe (unconstrained)
};

/// A constrained link: one SimGrid link per entry.
struct TopoLink {
  LinkKind kind = LinkKind::nic_up;
  int64_t index = 0;      // running number within its kind (for names: "nic_up7")
  double bandwidth = 0;   // B/s, one direction
};

using TopologyGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, TopoVertex, TopoEdge>;
using TopoVertexId = TopologyGraph::vertex_descriptor;

class Topology {
 public:
  /// Builds the graph of `cluster` (nodes x gpus_per_node GPUs, nics_per_node NICs per node,
  /// fabric cluster.fabric with cluster.fabric_shape). Throws InputError as described above.
  explicit Topology(const ClusterSpec& cluster);

  const TopologyGraph& graph() const { return g_; }
  const std::vector<TopoLink>& links() const { return links_; }

  int64_t gpus() const { return gpus_; }
  int64_t nodes() const { return nodes_; }
  int64_t gpus_per_node() const { return gpus_per_node_; }
  int64_t nics_per_node() const { return nics_per_node_; }
  int64_t gpus_per_nic() const { return gpus_per_nic_; }
  int64_t nics() const { return nodes_ * nics_per_node_; }
  int64_t node_of(int64_t gpu) const { return gpu / gpus_per_node_; }
  /// Global NIC index of the NIC GPU `gpu` uses (GPUs share NICs in order: local GPU l uses
  /// local NIC l / gpus_per_nic).
  int64_t nic_of(int64_t gpu) const { return node_of(gpu) * nics_per_node_ + rail_of(gpu); }
  /// The NIC's index inside its node, i.e. its rail in a rail-optimized fabric.
  int64_t rail_of(int64_t gpu) const { return (gpu % gpus_per_node_) / gpus_per_nic_; }
  /// True when the fabric has shared switch links above the NICs (leaf or pod uplinks).
  bool has_switch_uplinks() const { return uplinks_ > 0; }
  /// The node's intra-node interconnect (cluster.intra_node).
  IntraNode intra_node() const { return intra_node_; }
  /// On an xgmi mesh: the index (into links()) of the direct link from GPU `src` to GPU `dst`
  /// of the same node; -1 otherwise (different nodes, src == dst, or an NVSwitch node).
  int64_t mesh_link(int64_t src, int64_t dst) const;

  TopoVertexId gpu_vertex(int64_t gpu) const { return gpu_vertex_[static_cast<size_t>(gpu)]; }
  TopoVertexId nic_vertex(int64_t nic) const { return nic_vertex_[static_cast<size_t>(nic)]; }

  /// Appends to `out` the indices (into links()) of the links a transfer from GPU `src` to
  /// GPU `dst` crosses, in order. Nothing when src == dst.
  void route(int64_t src, int64_t dst, std::vector<int64_t>& out) const;
  std::vector<int64_t> route(int64_t src, int64_t dst) const {
    std::vector<int64_t> r;
    route(src, dst, r);
    return r;
  }

  // ---- used by fabric builders (topologies/fabrics/) ----
  TopoVertexId add_switch(VertexKind kind, int64_t index);
  /// Joins `child` to `parent` with an `up` and a `down` link of `bandwidth` B/s each.
  void connect(TopoVertexId child, TopoVertexId parent, double bandwidth, LinkKind up, LinkKind down);
  /// Bandwidth of the up-link from `v` to its parent (0 if it has none yet).
  double uplink_bandwidth(TopoVertexId v) const;

 private:
  void compute_parents();

  TopologyGraph g_;
  std::vector<TopoLink> links_;
  std::vector<int64_t> kind_count_;  // per LinkKind, for TopoLink::index
  int64_t gpus_ = 0, nodes_ = 0, gpus_per_node_ = 1, nics_per_node_ = 1, gpus_per_nic_ = 1;
  int64_t uplinks_ = 0;
  IntraNode intra_node_ = IntraNode::nvswitch;
  std::vector<int64_t> mesh_link_;  // xgmi mesh: [gpu * gpus_per_node + local dst] -> link, -1 on the diagonal
  std::vector<TopoVertexId> gpu_vertex_, nic_vertex_;
  // Per vertex: its parent in the tree of down edges, the up link to it and the down link
  // from it (indices into links_), depth from the root (root: 0).
  std::vector<int64_t> parent_, up_link_, down_link_, depth_;
};

}  // namespace dtsim
