#include "sim/collective_exec.hpp"

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <unordered_set>

#include "sim/collectives/traffic.hpp"

namespace sg4 = simgrid::s4u;

namespace dtsim::simgrid_engine {

namespace {

/// Local-index offsets that map the group onto disjoint sibling groups on the same nodes
/// (every member + offset stays on its node and hits no member of the group or of an earlier
/// sibling). Greedy over offsets 1..gpus_per_node-1.
std::vector<int64_t> sibling_offsets(const collectives::GroupLayout& g) {
  std::vector<int64_t> offsets;
  std::unordered_set<int64_t> used(g.members.begin(), g.members.end());
  for (int64_t o = 1; o < g.gpus_per_node; ++o) {
    bool ok = true;
    for (int64_t m : g.members) {
      const int64_t t = m + o;
      if ((m % g.gpus_per_node) + o >= g.gpus_per_node || used.count(t)) {
        ok = false;
        break;
      }
    }
    if (!ok) continue;
    for (int64_t m : g.members) used.insert(m + o);
    offsets.push_back(o);
  }
  return offsets;
}

}  // namespace

double flow_bytes(const Platform& p, const FoldPolicy& fold, int64_t src, int64_t dst, double bytes) {
  const bool inter = !p.same_node(src, dst);
  const bool siblings = p.topology && p.topology->has_switch_uplinks();
  return inter && fold.fold && !siblings ? bytes * static_cast<double>(p.gpus_per_nic) : bytes;
}

void launch_fold_siblings(const Platform& p, const FoldPolicy& fold, int64_t src, int64_t dst, double bytes,
                          int64_t stage_size) {
  if (!fold.fold || !p.topology || !p.topology->has_switch_uplinks() || p.same_node(src, dst) || bytes <= 0) return;
  const int64_t gpn = p.gpus_per_node, n = static_cast<int64_t>(p.hosts.size());
  for (int64_t o = 1; o < gpn; ++o) {
    const int64_t s = src + o, d = dst + o;
    if (s >= n || d >= n || !p.same_node(s, src) || !p.same_node(d, dst) || s / stage_size != src / stage_size) break;
    sg4::Comm::sendto_async(p.hosts[static_cast<size_t>(s)], p.hosts[static_cast<size_t>(d)],
                            static_cast<uint64_t>(bytes + 0.5))
        ->detach();
  }
}

void run_traffic(const Platform& p, const FoldPolicy& fold, const collectives::GroupLayout& g,
                 const collectives::TrafficPlan& plan) {
  const bool siblings = fold.fold && p.topology && p.topology->has_switch_uplinks();
  std::vector<int64_t> offsets;
  bool offsets_done = false;
  std::vector<sg4::CommPtr> comms;
  for (const collectives::Phase& ph : plan.phases) {
    comms.clear();
    if (!ph.flows.empty() && siblings && !offsets_done) {
      offsets = sibling_offsets(g);
      offsets_done = true;
    }
    auto launch = [&](int64_t src, int64_t dst, double bytes) {
      if (bytes <= 0) return;
      comms.push_back(sg4::Comm::sendto_async(p.hosts[static_cast<size_t>(src)], p.hosts[static_cast<size_t>(dst)],
                                              static_cast<uint64_t>(std::max(1.0, bytes + 0.5))));
    };
    for (const collectives::Flow& f : ph.flows) {
      double bytes = f.bytes;
      if (fold.fold && !siblings) {
        // Non-blocking fabric: the GPUs sharing the source NIC outside this group run the
        // same collective at the same time.
        bytes *= static_cast<double>(p.gpus_per_nic) / static_cast<double>(collectives::traffic::members_on_nic(g, f.src));
      }
      launch(f.src, f.dst, bytes);
      for (int64_t o : offsets) launch(f.src + o, f.dst + o, f.bytes);
    }
    const double local = std::max(ph.intra_s, ph.floor_s);
    if (local > 0) sg4::this_actor::sleep_for(local);
    if (!comms.empty()) sg4::Comm::wait_all(comms);
    if (ph.latency_s > 0) sg4::this_actor::sleep_for(ph.latency_s);
  }
}

collectives::Choice execute_collective(const Platform& p, const FoldPolicy& fold, const std::vector<int64_t>& members,
                                       collectives::CollOp op, double size_bytes, const CollectiveChoice* want) {
  const auto g = collectives::GroupLayout::of(members, p.gpus_per_node, p.gpus_per_nic);
  const bool strict = want != nullptr;
  const collectives::Choice c =
      collectives::choose(op, g, p.model, size_bytes, want ? *want : p.collectives, strict);
  if (g.n() < 2 || size_bytes <= 0) return c;
  run_traffic(p, fold, g, c.algorithm->plan(op, g, p.model, size_bytes, c.protocol));
  return c;
}

void execute_collective(const Platform& p, const FoldPolicy& fold, const std::vector<int64_t>& members,
                        Collective c, double size_bytes, ReduceOp) {
  execute_collective(p, fold, members, collectives::to_op(c), size_bytes, nullptr);
}

}  // namespace dtsim::simgrid_engine
