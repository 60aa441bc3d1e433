#include "topologies/topology.hpp"

#include <boost/graph/breadth_first_search.hpp>
#include <boost/graph/filtered_graph.hpp>

#include <algorithm>
#include <stdexcept>

#include "models/errors.hpp"
#include "topologies/fabrics/fabric.hpp"

namespace dtsim {

const char* to_string(VertexKind k) {
  switch (k) {
    case VertexKind::gpu: return "gpu";
    case VertexKind::nvswitch: return "nvswitch";
    case VertexKind::nic: return "nic";
    case VertexKind::leaf: return "leaf";
    case VertexKind::spine: return "spine";
    case VertexKind::core: return "core";
  }
  return "?";
}

const char* to_string(LinkKind k) {
  switch (k) {
    case LinkKind::nvlink_up: return "nvlink_up";
    case LinkKind::nvlink_down: return "nvlink_down";
    case LinkKind::pcie: return "pcie";
    case LinkKind::nic_up: return "nic_up";
    case LinkKind::nic_down: return "nic_down";
    case LinkKind::leaf_up: return "leaf_up";
    case LinkKind::leaf_down: return "leaf_down";
    case LinkKind::pod_up: return "pod_up";
    case LinkKind::pod_down: return "pod_down";
    case LinkKind::xgmi: return "xgmi";
  }
  return "?";
}

namespace {

constexpr int kLinkKinds = 10;

bool is_down(LinkKind k) {
  return k == LinkKind::nvlink_down || k == LinkKind::nic_down || k == LinkKind::leaf_down || k == LinkKind::pod_down;
}
bool is_up(LinkKind k) {
  return k == LinkKind::nvlink_up || k == LinkKind::nic_up || k == LinkKind::leaf_up || k == LinkKind::pod_up;
}

struct DownEdges {
  const TopologyGraph* g = nullptr;
  bool operator()(TopologyGraph::edge_descriptor e) const { return is_down((*g)[e].kind); }
};

/// Records, for every vertex reached, its BFS parent and the down edge it was reached by.
class ParentRecorder : public boost::default_bfs_visitor {
 public:
  ParentRecorder(std::vector<int64_t>& parent, std::vector<int64_t>& down, std::vector<int64_t>& depth)
      : parent_(parent), down_(down), depth_(depth) {}
  template <class Edge, class Graph>
  void tree_edge(Edge e, const Graph& g) const {
    const auto s = boost::source(e, g), t = boost::target(e, g);
    parent_[t] = static_cast<int64_t>(s);
    down_[t] = g[e].link;
    depth_[t] = depth_[s] + 1;
  }

 private:
  std::vector<int64_t>& parent_;
  std::vector<int64_t>& down_;
  std::vector<int64_t>& depth_;
};

}  // namespace

Topology::Topology(const ClusterSpec& c) {
  if (c.nodes <= 0 || c.gpus_per_node <= 0)
    throw InputError("cluster: cannot build a topology of " + std::to_string(c.nodes) + " nodes x " +
                     std::to_string(c.gpus_per_node) + " GPUs (both must be positive)");
  nodes_ = c.nodes;
  gpus_per_node_ = c.gpus_per_node;
  gpus_ = nodes_ * gpus_per_node_;
  // A cluster of one node may have no NICs; one placeholder NIC per node keeps indices valid
  // (its links carry nothing).
  nics_per_node_ = std::max<int64_t>(1, c.nics_per_node);
  if (gpus_per_node_ % nics_per_node_ != 0 && c.nics_per_node > 0)
    throw InputError("cluster.nics_per_node=" + std::to_string(c.nics_per_node) +
                     " does not divide cluster.gpus_per_node=" + std::to_string(gpus_per_node_));
  gpus_per_nic_ = std::max<int64_t>(1, gpus_per_node_ / nics_per_node_);
  kind_count_.assign(kLinkKinds, 0);

  const double nv_bw = c.nvlink.bandwidth * c.nvlink.efficiency;
  intra_node_ = c.intra_node;
  gpu_vertex_.reserve(static_cast<size_t>(gpus_));
  if (intra_node_ == IntraNode::xgmi_mesh) {
    // A direct link per ordered GPU pair of a node, no switch (header).
    mesh_link_.assign(static_cast<size_t>(gpus_ * gpus_per_node_), -1);
    for (int64_t n = 0; n < nodes_; ++n)
      for (int64_t l = 0; l < gpus_per_node_; ++l)
        gpu_vertex_.push_back(boost::add_vertex(TopoVertex{VertexKind::gpu, n * gpus_per_node_ + l}, g_));
    for (int64_t gpu = 0; gpu < gpus_; ++gpu) {
      const int64_t base = node_of(gpu) * gpus_per_node_;
      for (int64_t l = 0; l < gpus_per_node_; ++l) {
        if (base + l == gpu) continue;
        const int64_t id = static_cast<int64_t>(links_.size());
        links_.push_back(TopoLink{LinkKind::xgmi, kind_count_[static_cast<size_t>(LinkKind::xgmi)]++, nv_bw});
        boost::add_edge(gpu_vertex(gpu), gpu_vertex(base + l), TopoEdge{LinkKind::xgmi, id}, g_);
        mesh_link_[static_cast<size_t>(gpu * gpus_per_node_ + l)] = id;
      }
    }
  }
  for (int64_t n = 0; n < nodes_ && intra_node_ == IntraNode::nvswitch; ++n) {
    const TopoVertexId sw = boost::add_vertex(TopoVertex{VertexKind::nvswitch, n}, g_);
    for (int64_t l = 0; l < gpus_per_node_; ++l) {
      const TopoVertexId v = boost::add_vertex(TopoVertex{VertexKind::gpu, n * gpus_per_node_ + l}, g_);
      gpu_vertex_.push_back(v);
      connect(v, sw, nv_bw, LinkKind::nvlink_up, LinkKind::nvlink_down);
    }
  }
  nic_vertex_.reserve(static_cast<size_t>(nics()));
  for (int64_t i = 0; i < nics(); ++i) nic_vertex_.push_back(boost::add_vertex(TopoVertex{VertexKind::nic, i}, g_));
  for (int64_t gpu = 0; gpu < gpus_; ++gpu)
    boost::add_edge(gpu_vertex(gpu), nic_vertex(nic_of(gpu)), TopoEdge{LinkKind::pcie, -1}, g_);

  const FabricType* fabric = find_fabric_type(c.fabric);
  if (!fabric)
    throw InputError("cluster.fabric=\"" + c.fabric + "\" is not a fabric type (valid: " + fabric_type_list() + ")");
  fabric->build(c, *this);
  compute_parents();
}

TopoVertexId Topology::add_switch(VertexKind kind, int64_t index) {
  return boost::add_vertex(TopoVertex{kind, index}, g_);
}

void Topology::connect(TopoVertexId child, TopoVertexId parent, double bandwidth, LinkKind up, LinkKind down) {
  auto add = [&](TopoVertexId a, TopoVertexId b, LinkKind k) {
    const int64_t id = static_cast<int64_t>(links_.size());
    links_.push_back(TopoLink{k, kind_count_[static_cast<size_t>(k)]++, bandwidth});
    boost::add_edge(a, b, TopoEdge{k, id}, g_);
  };
  add(child, parent, up);
  add(parent, child, down);
  if (up == LinkKind::leaf_up || up == LinkKind::pod_up) ++uplinks_;
}

double Topology::uplink_bandwidth(TopoVertexId v) const {
  for (auto [e, end] = boost::out_edges(v, g_); e != end; ++e)
    if (is_up(g_[*e].kind)) return links_[static_cast<size_t>(g_[*e].link)].bandwidth;
  return 0;
}

void Topology::compute_parents() {
  const size_t nv = boost::num_vertices(g_);
  parent_.assign(nv, -1);
  down_link_.assign(nv, -1);
  up_link_.assign(nv, -1);
  depth_.assign(nv, 0);
  // Roots: vertices no down edge enters (every NVSwitch, the fabric's top switch).
  std::vector<char> entered(nv, 0);
  for (auto [e, end] = boost::edges(g_); e != end; ++e)
    if (is_down(g_[*e].kind)) entered[boost::target(*e, g_)] = 1;
  std::vector<TopoVertexId> roots;
  for (size_t v = 0; v < nv; ++v)
    if (!entered[v] && g_[v].kind != VertexKind::gpu && g_[v].kind != VertexKind::nic) roots.push_back(v);
  const boost::filtered_graph<TopologyGraph, DownEdges> down(g_, DownEdges{&g_});
  std::vector<boost::default_color_type> color(nv, boost::white_color);
  boost::queue<TopoVertexId> queue;
  boost::breadth_first_search(down, roots.begin(), roots.end(), queue, ParentRecorder(parent_, down_link_, depth_),
                              boost::make_iterator_property_map(color.begin(), boost::get(boost::vertex_index, g_)));
  // The up link of a vertex is its edge to its parent.
  for (size_t v = 0; v < nv; ++v) {
    if (parent_[v] < 0) continue;
    for (auto [e, end] = boost::out_edges(v, g_); e != end; ++e)
      if (is_up(g_[*e].kind) && boost::target(*e, g_) == static_cast<TopoVertexId>(parent_[v])) up_link_[v] = g_[*e].link;
  }
  for (int64_t i = 0; i < nics(); ++i)
    if (parent_[nic_vertex(i)] < 0 || up_link_[nic_vertex(i)] < 0)
      throw std::logic_error("topology: NIC " + std::to_string(i) + " is not connected to the fabric");
}

int64_t Topology::mesh_link(int64_t src, int64_t dst) const {
  if (intra_node_ != IntraNode::xgmi_mesh || src == dst || node_of(src) != node_of(dst)) return -1;
  return mesh_link_[static_cast<size_t>(src * gpus_per_node_ + dst % gpus_per_node_)];
}

void Topology::route(int64_t src, int64_t dst, std::vector<int64_t>& out) const {
  if (src == dst) return;
  if (node_of(src) == node_of(dst) && intra_node_ == IntraNode::xgmi_mesh) {
    out.push_back(mesh_link(src, dst));
    return;
  }
  if (node_of(src) == node_of(dst)) {
    out.push_back(up_link_[gpu_vertex(src)]);
    out.push_back(down_link_[gpu_vertex(dst)]);
    return;
  }
  int64_t a = static_cast<int64_t>(nic_vertex(nic_of(src)));
  int64_t b = static_cast<int64_t>(nic_vertex(nic_of(dst)));
  std::vector<int64_t> downs;  // collected from dst upwards, appended reversed
  while (a != b) {
    if (depth_[static_cast<size_t>(a)] >= depth_[static_cast<size_t>(b)]) {
      out.push_back(up_link_[static_cast<size_t>(a)]);
      a = parent_[static_cast<size_t>(a)];
    } else {
      downs.push_back(down_link_[static_cast<size_t>(b)]);
      b = parent_[static_cast<size_t>(b)];
    }
    if (a < 0 || b < 0) throw std::logic_error("topology: no route between GPUs " + std::to_string(src) + " and " +
                                               std::to_string(dst));
  }
  out.insert(out.end(), downs.rbegin(), downs.rend());
}

}  // namespace dtsim
