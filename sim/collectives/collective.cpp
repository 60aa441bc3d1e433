#include "sim/collectives/collective.hpp"

#include <algorithm>
#include <cctype>
#include <map>

namespace dtsim::collectives {

namespace {
const std::pair<const char*, CollOp> kOps[] = {
    {"allreduce", CollOp::AllReduce}, {"reducescatter", CollOp::ReduceScatter}, {"allgather", CollOp::AllGather},
    {"broadcast", CollOp::Broadcast}, {"reduce", CollOp::Reduce},               {"alltoall", CollOp::AllToAll},
    {"sendrecv", CollOp::SendRecv}};

std::string normalized(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c != '_' && c != '-') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
}  // namespace

const char* to_string(CollOp op) {
  switch (op) {
    case CollOp::AllReduce: return "AllReduce";
    case CollOp::ReduceScatter: return "ReduceScatter";
    case CollOp::AllGather: return "AllGather";
    case CollOp::Broadcast: return "Broadcast";
    case CollOp::Reduce: return "Reduce";
    case CollOp::AllToAll: return "AllToAll";
    case CollOp::SendRecv: return "SendRecv";
  }
  return "?";
}

std::optional<CollOp> parse_op(std::string_view s) {
  const std::string n = normalized(s);
  for (const auto& [name, op] : kOps)
    if (n == name) return op;
  return std::nullopt;
}

std::string op_list() {
  std::string out;
  for (const auto& [name, op] : kOps) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

CollOp to_op(Collective c) {
  switch (c) {
    case Collective::AllReduce: return CollOp::AllReduce;
    case Collective::ReduceScatter: return CollOp::ReduceScatter;
    case Collective::AllGather: return CollOp::AllGather;
    case Collective::AllToAll: return CollOp::AllToAll;
  }
  return CollOp::AllReduce;
}

bool reduces(CollOp op) {
  return op == CollOp::AllReduce || op == CollOp::ReduceScatter || op == CollOp::Reduce;
}

const char* to_string(Protocol p) {
  switch (p) {
    case Protocol::LL: return "LL";
    case Protocol::LL128: return "LL128";
    case Protocol::Simple: return "Simple";
  }
  return "?";
}

std::optional<Protocol> parse_protocol(std::string_view s) {
  const std::string n = normalized(s);
  if (n == "ll") return Protocol::LL;
  if (n == "ll128") return Protocol::LL128;
  if (n == "simple") return Protocol::Simple;
  return std::nullopt;
}

double busbw_factor(CollOp op, int64_t n) {
  const double dn = static_cast<double>(n);
  switch (op) {
    case CollOp::AllReduce: return n > 0 ? 2.0 * (dn - 1) / dn : 0;
    case CollOp::ReduceScatter:
    case CollOp::AllGather:
    case CollOp::AllToAll: return n > 0 ? (dn - 1) / dn : 0;
    case CollOp::Broadcast:
    case CollOp::Reduce:
    case CollOp::SendRecv: return 1.0;
  }
  return 1.0;
}

TokenRouting ep_token_routing(const Experiment& e) {
  const MoeSpec& moe = e.model.moe;
  if (!moe.enabled()) return {};
  return {moe.router_topk, moe.num_experts, moe.router_num_groups, moe.router_group_topk};
}

std::optional<CollectiveChoice> ep_alltoall_choice(const Experiment& e) {
  const std::string& d = e.training.moe_token_dispatcher;
  if (d == "deepep" || d == "hybridep") return CollectiveChoice{"deepep", "auto"};
  return std::nullopt;
}

CommModel CommModel::of(const ClusterSpec& c) {
  CommModel m;
  m.nvlink_bw = c.nvlink.bandwidth * c.nvlink.efficiency;
  m.nvls_bw = c.nvlink.bandwidth * c.nvls_efficiency;
  m.net_bw = c.nic.bandwidth * c.nic.efficiency;
  m.nvlink_latency = c.nvlink.latency;
  m.net_latency = c.nic.latency;
  m.mesh = c.intra_node == IntraNode::xgmi_mesh;
  m.ll128 = !m.mesh;  // header: RCCL never chooses LL128 on MI300X nodes
  return m;
}

GroupLayout GroupLayout::of(std::vector<int64_t> members, int64_t gpus_per_node, int64_t gpus_per_nic) {
  GroupLayout g;
  std::sort(members.begin(), members.end());
  g.members = std::move(members);
  g.gpus_per_node = std::max<int64_t>(1, gpus_per_node);
  g.gpus_per_nic = std::max<int64_t>(1, gpus_per_nic);
  int64_t last = -1;
  for (int64_t m : g.members) {
    const int64_t node = m / g.gpus_per_node;
    if (g.nodes.empty() || node != last) g.nodes.emplace_back();
    g.nodes.back().push_back(m);
    last = node;
  }
  return g;
}

GroupLayout GroupLayout::first(int64_t n, int64_t gpus_per_node, int64_t gpus_per_nic) {
  std::vector<int64_t> m(static_cast<size_t>(std::max<int64_t>(0, n)));
  for (int64_t i = 0; i < n; ++i) m[static_cast<size_t>(i)] = i;
  return of(std::move(m), gpus_per_node, gpus_per_nic);
}

bool GroupLayout::uniform() const {
  for (const auto& nd : nodes)
    if (nd.size() != nodes.front().size()) return false;
  return true;
}

int64_t GroupLayout::per_node() const {
  size_t k = 0;
  for (const auto& nd : nodes) k = std::max(k, nd.size());
  return static_cast<int64_t>(k);
}

int64_t GroupLayout::max_members_per_nic() const {
  int64_t best = 0, run = 0, last = -1;
  for (int64_t m : members) {  // ascending: members of one NIC are consecutive
    const int64_t nic = nic_of(m);
    run = nic == last ? run + 1 : 1;
    last = nic;
    best = std::max(best, run);
  }
  return best;
}

}  // namespace dtsim::collectives
