#include "sim/collective_exec.hpp"

#include <simgrid/s4u.hpp>
#include <simgrid/simix.hpp>

#include <algorithm>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "sim/collectives/traffic.hpp"

namespace sg4 = simgrid::s4u;

// SimGrid 3.32's kernel-side move of an actor to another host (src/kernel/actor/ActorImpl.cpp,
// ActorImpl::set_host: the actor leaves one host's actor list and joins the other's, O(1)),
// exported by libsimgrid but declared in no installed header. launch_flow calls it instead of
// s4u::Actor::set_host (src/s4u/s4u_Actor.cpp), which first walks every pending activity of the
// actor with a dynamic_pointer_cast (to migrate Execs; these actors run none): the launcher and
// the proxy hold every flow in flight, so each move cost O(flows) and a phase O(flows^2) (75-83%
// of `dtsim collective --gpus 16384`). Only this member is declared; a SimGrid without the
// symbol fails to link, not to run.
namespace simgrid::kernel::actor {
class ActorImpl {
 public:
  void set_host(s4u::Host* dest);
};
}  // namespace simgrid::kernel::actor

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

// Member -> (index of its node in g.nodes, its position among the group's members there).
using Seat = std::pair<size_t, size_t>;

// Rail planes of a phase: on a uniform group of k members per node, plane j is the members at
// position j of their node (the same local GPU, hence the same rail, on every node of a
// symmetric layout). True when every flow joins two members of one plane on different nodes
// and every plane carries the same flows (node pair, bytes) as plane 0: the other k - 1 planes
// are copies of plane 0 on other NICs, which a non-blocking fabric (no switch uplinks: each
// NIC's own links only) keeps apart, so plane 0 alone, with each of its flows standing for the
// gpus_per_nic GPUs on its NIC, loads every link it uses as all k planes do and finishes at the
// same time (unfolded, each flow stands for the group's members on its NIC). The direct
// AllToAll (alltoall_direct.cpp pairs member j of one node with member j of the other) of an
// EP group over whole nodes is the case this exists for: k x fewer flows.
bool planes_are_copies(const collectives::GroupLayout& g, const collectives::Phase& ph,
                       std::unordered_map<int64_t, Seat>& seat) {
  if (!g.uniform() || g.per_node() < 2 || ph.flows.empty()) return false;
  const size_t k = static_cast<size_t>(g.per_node());
  seat.clear();
  for (size_t a = 0; a < g.nodes.size(); ++a)
    for (size_t j = 0; j < g.nodes[a].size(); ++j) seat[g.nodes[a][j]] = {a, j};
  std::vector<std::vector<std::tuple<size_t, size_t, double>>> planes(k);
  for (const collectives::Flow& f : ph.flows) {
    const auto s = seat.find(f.src), d = seat.find(f.dst);
    if (s == seat.end() || d == seat.end()) return false;
    const auto [na, ja] = s->second;
    const auto [nb, jb] = d->second;
    if (na == nb || ja != jb) return false;
    planes[ja].emplace_back(na, nb, f.bytes);
  }
  for (auto& pl : planes) std::sort(pl.begin(), pl.end());
  for (size_t j = 1; j < k; ++j)
    if (planes[j] != planes[0]) return false;
  return true;
}

// Plane 0 of a phase (planes_are_copies held) is a complete exchange: one flow of the same
// bytes for every ordered pair of distinct nodes. Sets `bytes` to that size.
bool complete_exchange(const collectives::GroupLayout& g, const collectives::Phase& ph,
                       const std::unordered_map<int64_t, Seat>& seat, double& bytes) {
  const size_t n = g.nodes.size();
  std::vector<uint8_t> seen(n * n, 0);
  size_t count = 0;
  bytes = -1;
  for (const collectives::Flow& f : ph.flows) {
    const auto [na, ja] = seat.at(f.src);
    if (ja != 0) continue;
    const size_t nb = seat.at(f.dst).first;
    if (bytes < 0) bytes = f.bytes;
    if (f.bytes != bytes || seen[na * n + nb]) return false;
    seen[na * n + nb] = 1;
    ++count;
  }
  return n > 2 && count == n * (n - 1);
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

namespace {

/// The launching actor's private flow mailbox, its permanent receiver set once.
sg4::Mailbox* flow_mailbox(const Platform& p) {
  const long pid = sg4::this_actor::get_pid();
  sg4::Mailbox* mb = sg4::Mailbox::by_name("flows." + std::to_string(pid));
  if (p.flow_mailboxes.insert(pid).second) mb->set_receiver(p.flow_proxy);
  return mb;
}

const char kFlowPayload = 0;

/// The closed-form delays of a phase, in the order they run after its flows are started: the
/// intra-node part (alongside the flows), then the latency terms (after them). Used by
/// run_traffic and closed_form_steps alike.
std::pair<double, double> phase_delays(const collectives::Phase& ph) {
  return {std::max(ph.intra_s, ph.floor_s), ph.latency_s};
}

/// Starts one flow of `bytes` from GPU host `src` to `dst` as a comm of the calling actor
/// (start_flow_proxy): within one simcall the actor stands on `src` and the proxy on `dst` while
/// the comm starts (a started comm keeps its hosts), then the actor is back home (moved by the
/// kernel's ActorImpl::set_host, above, in O(1)). One simcall
/// per flow keeps the order in which flows start, hence the network model's sharing, as
/// Comm::sendto_async's.
sg4::CommPtr launch_flow(const Platform& p, sg4::Mailbox* mb, sg4::Host* src, sg4::Host* dst, uint64_t bytes) {
  if (!p.flow_proxy) return sg4::Comm::sendto_async(src, dst, bytes);
  sg4::CommPtr c = mb->put_init(const_cast<char*>(&kFlowPayload), bytes);
  sg4::Actor* self = sg4::Actor::self();
  sg4::Actor* proxy = p.flow_proxy.get();
  sg4::Comm* comm = c.get();
  simgrid::kernel::actor::simcall_answered([self, proxy, comm, src, dst] {
    sg4::Host* home = self->get_host();
    self->get_impl()->set_host(src);
    proxy->get_impl()->set_host(dst);
    comm->start();
    self->get_impl()->set_host(home);
  });
  return c;
}

}  // namespace

void run_traffic(const Platform& p, const FoldPolicy& fold, const collectives::GroupLayout& g,
                 const collectives::TrafficPlan& plan) {
  const bool siblings = fold.fold && p.topology && p.topology->has_switch_uplinks();
  std::vector<int64_t> offsets;
  bool offsets_done = false;
  std::vector<sg4::CommPtr> comms;
  sg4::Mailbox* mb = nullptr;  // flow_mailbox, on the first flow
  std::unordered_map<int64_t, Seat> seat;
  for (const collectives::Phase& ph : plan.phases) {
    comms.clear();
    // On a non-blocking fabric, a phase whose rail planes are copies runs plane 0 only.
    const bool plane0 = fold.sample_planes && !(p.topology && p.topology->has_switch_uplinks()) &&
                        planes_are_copies(g, ph, seat);
    if (!ph.flows.empty() && siblings && !offsets_done) {
      offsets = sibling_offsets(g);
      offsets_done = true;
    }
    auto launch = [&](int64_t src, int64_t dst, double bytes) {
      if (bytes <= 0) return;
      if (!mb && p.flow_proxy) mb = flow_mailbox(p);
      comms.push_back(launch_flow(p, mb, p.hosts[static_cast<size_t>(src)], p.hosts[static_cast<size_t>(dst)],
                                  static_cast<uint64_t>(std::max(1.0, bytes + 0.5))));
    };
    // Folded, or alone on the fabric (FoldPolicy::alone), plane 0 of a complete exchange over
    // N > 2 nodes runs as N flows, node a to node a + 1, each with the N - 1 chunks node a
    // sends: every NIC's egress and ingress carry the bytes of the N (N - 1) per-pair flows,
    // and alone the exchange ends at the same time (each per-pair flow gets 1 / (N - 1) of both
    // its NICs). Folded, beside other traffic on those NICs, max-min sharing gives the exchange
    // one share instead of N - 1: the fold's approximation, as in the rest of a folded step
    // (symmetric ranks), for N - 1 x fewer flows.
    double chunk = 0;
    if (plane0 && (fold.fold || fold.alone) && complete_exchange(g, ph, seat, chunk)) {
      const size_t n = g.nodes.size();
      for (size_t a = 0; a < n; ++a) {
        const int64_t src = g.nodes[a][0];
        // Each flow stands for the copies of the other planes on its NIC, as below.
        const double per_nic = fold.fold ? static_cast<double>(p.gpus_per_nic)
                                         : static_cast<double>(collectives::traffic::members_on_nic(g, src));
        launch(src, g.nodes[(a + 1) % n][0], static_cast<double>(n - 1) * chunk * per_nic);
      }
    } else {
      for (const collectives::Flow& f : ph.flows) {
        double bytes = f.bytes;
        if (plane0) {
          if (seat.at(f.src).second != 0) continue;
          // Each flow stands for the copies of the other planes on its NIC; folded, also for the
          // GPUs there outside the group (the fold scaling below, summed over the NIC's members).
          bytes *= fold.fold ? static_cast<double>(p.gpus_per_nic)
                             : static_cast<double>(collectives::traffic::members_on_nic(g, f.src));
        } else if (fold.fold && !siblings) {
          // Non-blocking fabric: the GPUs sharing the source NIC outside this group run the
          // same collective at the same time.
          bytes *= static_cast<double>(p.gpus_per_nic) / static_cast<double>(collectives::traffic::members_on_nic(g, f.src));
        }
        launch(f.src, f.dst, bytes);
        for (int64_t o : offsets) launch(f.src + o, f.dst + o, f.bytes);
      }
    }
    const auto [local, latency] = phase_delays(ph);
    if (local > 0) sg4::this_actor::sleep_for(local);
    if (!comms.empty()) {
      sg4::Comm::wait_all(comms);
      if (mb) mb->clear();  // the permanent receiver's queue holds the finished comms
    }
    if (latency > 0) sg4::this_actor::sleep_for(latency);
  }
}

bool closed_form_steps(const Platform& p, const std::vector<int64_t>& members, collectives::CollOp op,
                       double size_bytes, const CollectiveChoice* want, const collectives::TokenRouting* routing,
                       std::vector<double>& steps) {
  steps.clear();
  auto g = collectives::GroupLayout::of(members, p.gpus_per_node, p.gpus_per_nic);
  if (g.node_count() != 1) return false;  // inter-node groups have flows in some phase
  if (routing) g.routing = *routing;
  const bool strict = want != nullptr;
  const collectives::Choice c =
      collectives::choose(op, g, p.model, size_bytes, want ? *want : p.collectives, strict);
  if (g.n() < 2 || size_bytes <= 0) return false;
  const collectives::TrafficPlan plan = c.algorithm->plan(op, g, p.model, size_bytes, c.protocol);
  for (const collectives::Phase& ph : plan.phases) {
    if (!ph.flows.empty()) return false;
    const auto [local, latency] = phase_delays(ph);  // as run_traffic sleeps them
    if (local > 0) steps.push_back(local);
    if (latency > 0) steps.push_back(latency);
  }
  return true;
}

collectives::Choice execute_collective(const Platform& p, const FoldPolicy& fold, const std::vector<int64_t>& members,
                                       collectives::CollOp op, double size_bytes, const CollectiveChoice* want,
                                       const collectives::TokenRouting* routing) {
  auto g = collectives::GroupLayout::of(members, p.gpus_per_node, p.gpus_per_nic);
  if (routing) g.routing = *routing;
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
