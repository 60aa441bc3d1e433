#include "sim/platform.hpp"

#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/kernel/routing/NetZoneImpl.hpp>

#include <malloc.h>

#include <algorithm>
#include <limits>
#include <string>

#include "models/errors.hpp"
#include "sim/collectives/registry.hpp"

namespace sg4 = simgrid::s4u;
namespace sgk = simgrid::kernel;

namespace dtsim::simgrid_engine {
namespace {

/// Flat zone: GPU g is host g (NetPoint id g); routes come from the topology graph.
class GraphZone : public sgk::routing::NetZoneImpl {
 public:
  GraphZone(const std::string& name, std::shared_ptr<const Topology> topo)
      : NetZoneImpl(name), topo_(std::move(topo)) {}
  std::vector<sgk::resource::StandardLinkImpl*> links;  // by Topology link index

  void get_local_route(const sgk::routing::NetPoint* src, const sgk::routing::NetPoint* dst,
                       sgk::routing::Route* into, double* latency) override {
    scratch_.clear();
    topo_->route(static_cast<int64_t>(src->id()), static_cast<int64_t>(dst->id()), scratch_);
    for (int64_t l : scratch_) into->link_list_.push_back(links[static_cast<size_t>(l)]);
    if (latency) *latency += static_cast<double>(scratch_.size()) * kLinkLatency;
  }

 private:
  std::shared_ptr<const Topology> topo_;
  std::vector<int64_t> scratch_;
};

}  // namespace

const std::vector<std::pair<std::string, std::string>>& model_flags() {
  static const std::vector<std::pair<std::string, std::string>> flags = {
      {"network/model", "CM02"},
      {"network/crosstraffic", "0"},
      {"network/TCP-gamma", "1e15"},
      {"network/bandwidth-factor", "1.0"},
      {"network/latency-factor", "1.0"},
      {"network/weight-S", "0"},
      {"maxmin/precision", "1e-9"},
      // SimGrid 3.32 ends an activity once less than this remains (surf/precision, "Numerical
      // precision used when updating simulation times", default 1e-9 s): a kernel timed
      // with an acquire timeout (sim/simgrid_engine.cpp run_kernels) could end up to 1e-9 s
      // early, so a stage's summed slowdown dipped below zero by ~1e-9 s over thousands of
      // kernels. 1e-12 s keeps every step's books exact to its 1e-9 relative accounting.
      {"surf/precision", "1e-12"},
  };
  return flags;
}

int64_t actor_stack_bytes() {
#if defined(__SANITIZE_ADDRESS__)
  return int64_t{1} << 20;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return int64_t{1} << 20;
#else
  return int64_t{256} << 10;
#endif
#else
  return int64_t{256} << 10;
#endif
}

void prepare_actor_stacks() {
  // Without a guard page SimGrid takes each stack from calloc (ContextSwapped.cpp): served by
  // mmap, its pages are zero already and only those an actor touches cost memory; served from
  // the heap, calloc writes zeros over all of it. glibc raises its mmap threshold up to 32 MiB
  // as large blocks are freed (mallopt(3), M_MMAP_THRESHOLD), which would move the stacks onto
  // the heap; fixing the threshold at the stack size keeps them on mmap.
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(actor_stack_bytes()));
  // And without glibc's cap of 65,536 mmap'd blocks (M_MMAP_MAX), past which the stacks of a
  // run with more actors (an unfolded 32,768-GPU step has ~98,000) came from the heap, zeroed
  // in full: 256 KiB each. Consecutive stacks merge into one memory map, so the kernel's
  // vm.max_map_count is not approached; where an mmap fails glibc falls back to the heap.
  mallopt(M_MMAP_MAX, std::numeric_limits<int>::max());
}

const std::vector<std::pair<std::string, std::string>>& context_flags() {
  static const std::vector<std::pair<std::string, std::string>> flags = {
      {"contexts/stack-size", std::to_string(actor_stack_bytes() / 1024)},  // KiB
      {"contexts/guard-size", "0"},
  };
  return flags;
}

void start_flow_proxy(Platform& p) {
  p.flow_proxy = sg4::Actor::create("flow-proxy", p.hosts.front(), [] { sg4::Semaphore::create(0)->acquire(); });
  p.flow_proxy->daemonize();
}

Platform build_platform(const ClusterSpec& c) {
  // The collective override is checked here, before any actor runs (the parser checks it
  // too; this covers clusters built in code).
  if (c.collectives.algorithm != "auto" && !collectives::find_algorithm(c.collectives.algorithm))
    throw InputError("cluster.collectives.algorithm=\"" + c.collectives.algorithm +
                     "\" is not a collective algorithm (valid: auto, " + collectives::algorithm_list() + ")");
  if (c.collectives.protocol != "auto" && !collectives::parse_protocol(c.collectives.protocol))
    throw InputError("cluster.collectives.protocol=\"" + c.collectives.protocol +
                     "\" is not a protocol (valid: auto, simple, ll, ll128)");
  auto topo = std::make_shared<const Topology>(c);
  Platform p;
  p.gpus_per_node = topo->gpus_per_node();
  p.gpus_per_nic = topo->gpus_per_nic();
  p.nvlink = c.nvlink;
  p.nic = c.nic;
  p.topology = topo;
  p.model = collectives::CommModel::of(c);
  p.collectives = c.collectives;
  auto* zone = new GraphZone("cluster", topo);
  zone->set_parent(nullptr);
  // Host speed is unused (GPU kernels are timed by the cost model and run as sleeps).
  for (int64_t g = 0; g < topo->gpus(); ++g) p.hosts.push_back(zone->create_host("gpu" + std::to_string(g), {1e9}));
  zone->links.reserve(topo->links().size());
  for (const TopoLink& l : topo->links()) {
    // A link of no capacity (the placeholder NIC of a one-node cluster without NICs) gets a
    // nominal 1 B/s: nothing is ever routed over it.
    auto* link = zone->create_link(std::string(to_string(l.kind)) + std::to_string(l.index),
                                   {l.bandwidth > 0 ? l.bandwidth : 1.0});
    link->set_latency(kLinkLatency);
    link->seal();
    zone->links.push_back(link->get_impl());
  }
  zone->seal();
  return p;
}

}  // namespace dtsim::simgrid_engine
