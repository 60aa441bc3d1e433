#include "sim/collectives/traffic.hpp"

#include <algorithm>
#include <unordered_map>

namespace dtsim::collectives::traffic {

void ring_boundaries(const GroupLayout& g, double edge_bytes, bool cyclic, std::vector<Flow>& out) {
  const size_t N = g.nodes.size();
  if (N < 2) return;
  const size_t bounds = cyclic ? N : N - 1;
  for (size_t i = 0; i < bounds; ++i) {
    const auto& a = g.nodes[i];
    const auto& b = g.nodes[(i + 1) % N];
    const double per = edge_bytes / static_cast<double>(a.size());
    for (size_t j = 0; j < a.size(); ++j) out.push_back({a[j], b[j % b.size()], per});
  }
}

double ring_boundaries_time(const GroupLayout& g, double edge_bytes, bool cyclic, double net_bw) {
  const size_t N = g.nodes.size();
  if (N < 2 || edge_bytes <= 0) return 0;
  std::unordered_map<int64_t, double> out_load, in_load;
  const size_t bounds = cyclic ? N : N - 1;
  for (size_t i = 0; i < bounds; ++i) {
    const auto& a = g.nodes[i];
    const auto& b = g.nodes[(i + 1) % N];
    const double ka = static_cast<double>(a.size());
    // Sender side: each NIC carries its members' shares.
    for (int64_t m : a) out_load[g.nic_of(m)] += edge_bytes / ka;
    // Receiver side: member r of b receives ceil-or-floor(k_a / k_b) shares.
    const size_t kb = b.size();
    for (size_t r = 0; r < kb; ++r) {
      const size_t shares = a.size() / kb + (r < a.size() % kb ? 1 : 0);
      in_load[g.nic_of(b[r])] += static_cast<double>(shares) * edge_bytes / ka;
    }
  }
  double worst = 0;
  for (const auto& [nic, l] : out_load) worst = std::max(worst, l);
  for (const auto& [nic, l] : in_load) worst = std::max(worst, l);
  return worst / net_bw;
}

std::vector<std::pair<int64_t, int64_t>> double_binary_tree(int64_t nodes) {
  std::vector<std::pair<int64_t, int64_t>> edges;
  for (int tree = 0; tree < 2; ++tree) {
    auto label = [&](int64_t v) { return tree == 0 ? v : nodes - 1 - v; };
    for (int64_t c = 1; c < nodes; ++c) edges.emplace_back(label((c - 1) / 2), label(c));
  }
  return edges;
}

int64_t double_binary_tree_max_degree(int64_t nodes) {
  std::vector<int64_t> deg(static_cast<size_t>(std::max<int64_t>(nodes, 1)), 0);
  for (const auto& [p, c] : double_binary_tree(nodes)) {
    ++deg[static_cast<size_t>(p)];
    ++deg[static_cast<size_t>(c)];
  }
  return *std::max_element(deg.begin(), deg.end());
}

int64_t members_on_nic(const GroupLayout& g, int64_t gpu) {
  const int64_t nic = g.nic_of(gpu);
  const int64_t first = nic * g.gpus_per_nic;
  auto lo = std::lower_bound(g.members.begin(), g.members.end(), first);
  auto hi = std::lower_bound(g.members.begin(), g.members.end(), first + g.gpus_per_nic);
  return static_cast<int64_t>(hi - lo);
}

}  // namespace dtsim::collectives::traffic
