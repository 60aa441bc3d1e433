#pragma once
// The SimGrid platform of a cluster (internal to sim/: includes SimGrid).
//
// Built from the cluster's graph (topologies/topology.hpp): every GPU is a host, every
// constrained edge of the graph one SimGrid link (NVLink up/down per GPU, or on an xgmi mesh
// one link per ordered GPU pair of a node; NIC up/down per NIC, leaf and pod uplinks of the
// fabric), with bandwidth = line rate x NCCL efficiency.
// Routes are the graph's (Topology::route), computed from host indices by a flat custom
// zone (../shared/design/SIMGRID.md: per-GPU NICs cannot be expressed with zone gateways;
// nested zones are slow at 16K GPUs).
#include <simgrid/s4u.hpp>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "models/experiment.hpp"
#include "sim/collectives/collective.hpp"
#include "topologies/topology.hpp"

namespace dtsim::simgrid_engine {

/// Uniform link latency so that CM02's RTT-weighted sharing is fair between flows;
/// collective latency terms are added as sleeps (SIMGRID.md, "Model flags"). Seconds.
inline constexpr double kLinkLatency = 1e-9;

/// SimGrid configuration every dtsim engine sets (SIMGRID.md "Model flags"): CM02 without
/// cross-traffic, TCP-gamma out of the way, bandwidth and latency factors 1, so a flow of S
/// bytes alone on a link of bandwidth B takes S/B.
const std::vector<std::pair<std::string, std::string>>& model_flags();

/// SimGrid's actor contexts as dtsim sets them (recorded with model_flags in every result):
/// a simulated rank is one to a few actors (sim/simgrid_engine.cpp), each on a stack of its
/// own. SimGrid 3.32's defaults (src/kernel/context/ContextSwapped.cpp SwappedContext, at
/// tag v3.32) are an 8 MiB stack plus a one-page guard made with mprotect: two memory maps
/// per actor, so Linux's default vm.max_map_count (65,530) ends a run near 32,000 actors
/// ("Failed to protect stack"). Without the guard, consecutive stacks merge into one map.
/// dtsim's actors never recurse: 256 KiB (1 MiB under AddressSanitizer, whose frames carry
/// redzones) holds their deepest call chain, the tests' unfolded runs and every shipped
/// experiment included.
const std::vector<std::pair<std::string, std::string>>& context_flags();

/// Stack bytes per actor under context_flags().
int64_t actor_stack_bytes();

/// Makes glibc's malloc serve every block of actor_stack_bytes() or more by mmap, so that a
/// stack costs only the pages its actor touches (call before the actors are created). Where
/// jemalloc is the allocator (the dtsim executable and the benchmarks, CMakeLists.txt) these
/// settings reach no allocator and are harmless: jemalloc takes large blocks from fresh
/// mappings it knows to be zero, so calloc does not write them either.
void prepare_actor_stacks();

/// SimGrid 3.32 ends the process (abort, "Uncaught exception") when an exception leaves an
/// actor's body. A body wrapped by guard() keeps the first exception instead and kills every
/// other actor, so that Engine::run() returns and the caller's rethrow() raises it there: an
/// input problem found inside a simulation reaches the user as its InputError with exit code
/// 2, never as an abort. SimGrid's own unwinding of a killed actor (ForcefulKillException)
/// passes through untouched, as SimGrid requires.
class ActorErrors {
 public:
  template <class F>
  std::function<void()> guard(F body) {
    return [this, body = std::move(body)]() mutable {
      try {
        body();
      } catch (const simgrid::ForcefulKillException&) {
        throw;
      } catch (...) {
        if (!first_) first_ = std::current_exception();
        simgrid::s4u::Actor::kill_all();
      }
    };
  }
  /// Rethrows the first exception an actor raised, if any (call after Engine::run()).
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::exception_ptr first_;
};

struct Platform {
  std::vector<simgrid::s4u::Host*> hosts;  // GPU g is hosts[g]
  int64_t gpus_per_node = 1;
  int64_t gpus_per_nic = 1;
  LinkSpec nvlink, nic;
  std::shared_ptr<const Topology> topology;  // the graph routes come from
  collectives::CommModel model;              // link figures of the collective cost models
  CollectiveChoice collectives;              // cluster.collectives (algorithm/protocol override)
  /// The idle actor that stands as the receiver of every collective flow (start_flow_proxy,
  /// sim/collective_exec.cpp); null: flows start as detached host-to-host comms.
  simgrid::s4u::ActorPtr flow_proxy;
  /// Actors whose flow mailbox has the proxy as permanent receiver already.
  mutable std::unordered_set<long> flow_mailboxes;
  bool same_node(int64_t a, int64_t b) const { return a / gpus_per_node == b / gpus_per_node; }
  /// Per-step latency (alpha) of a transfer between two GPUs, seconds.
  double alpha(bool intra_node) const { return intra_node ? nvlink.latency : std::max(nvlink.latency, nic.latency); }
};

/// Starts `p.flow_proxy` (call once per engine, after build_platform, before it runs): a daemon
/// that only waits. Collective flows are then put on a mailbox of the launching actor whose
/// permanent receiver it is, moved for each flow onto the flow's hosts
/// (sim/collective_exec.cpp launch_flow): SimGrid 3.32 keeps detached comms
/// (Comm::sendto_async) in one global list and removes each finished one by a linear scan
/// (src/kernel/activity/CommImpl.cpp CommImpl::finish, maestro's activities_.remove, at tag
/// v3.32), O(flows in flight in the whole simulation) per completion; a mailbox comm is in
/// its launcher's list only, O(that collective's flows). Same transfers, same times (tested).
void start_flow_proxy(Platform& p);

/// Builds the cluster's hosts and links in the current SimGrid engine (call once, after
/// the engine is created and before it runs). Throws InputError when the fabric does not
/// fit the cluster (topologies/topology.hpp).
Platform build_platform(const ClusterSpec& cluster);

}  // namespace dtsim::simgrid_engine
