#pragma once
// Traffic patterns shared by several algorithms (no SimGrid). Inter-node traffic is
// rail-aligned as NCCL arranges it: a transfer between two nodes is split over the members
// of the sending node, member j talking to member j (mod count) of the receiving node, so
// it spreads over every NIC the group uses (NCCL's channels, one per NIC; NCCL_CROSS_NIC
// keeps each on its rail).
#include <cstdint>
#include <utility>
#include <vector>

#include "sim/collectives/collective.hpp"

namespace dtsim::collectives::traffic {

/// A ring over the group's nodes in order (node i -> i+1, and last -> first when `cyclic`):
/// each boundary carries `edge_bytes`, split evenly over the sending node's members.
void ring_boundaries(const GroupLayout& g, double edge_bytes, bool cyclic, std::vector<Flow>& out);
/// Time of ring_boundaries' flows alone on a non-blocking fabric: the most loaded NIC
/// direction / net_bw (computed from per-NIC byte counts, not from the flow list).
double ring_boundaries_time(const GroupLayout& g, double edge_bytes, bool cyclic, double net_bw);

/// The edges (parent, child) of the two complementary binary trees of a double binary tree
/// over `nodes` vertices (Sanders, Speck & Traeff, Parallel Computing 35(12), 2009; NCCL's
/// trees since 2.4): tree 0 is the heap-ordered binary tree 0..N-1, tree 1 the same with
/// labels mirrored (v -> N-1-v), so that no vertex is interior in both. Depth floor(log2 N).
std::vector<std::pair<int64_t, int64_t>> double_binary_tree(int64_t nodes);

/// Largest number of tree edges any vertex of double_binary_tree(nodes) touches.
int64_t double_binary_tree_max_degree(int64_t nodes);

/// Every GPU of `members` on the same NIC shares its bandwidth: the number of members on
/// the NIC of `gpu`.
int64_t members_on_nic(const GroupLayout& g, int64_t gpu);

}  // namespace dtsim::collectives::traffic
