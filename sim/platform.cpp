#include "sim/platform.hpp"

#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/kernel/routing/NetZoneImpl.hpp>

#include <algorithm>
#include <string>

namespace sg4 = simgrid::s4u;
namespace sgk = simgrid::kernel;

namespace dtsim::simgrid_engine {
namespace {


/// Flat zone: routes from host indices (GPU g is host g, NetPoint id g).
class GpuZone : public sgk::routing::NetZoneImpl {
 public:
  GpuZone(const std::string& name, int64_t gpus_per_node, int64_t gpus_per_nic)
      : NetZoneImpl(name), gpn_(gpus_per_node), gpus_per_nic_(gpus_per_nic) {}
  std::vector<sgk::resource::StandardLinkImpl*> nv_up, nv_down, nic_up, nic_down;

  void get_local_route(const sgk::routing::NetPoint* src, const sgk::routing::NetPoint* dst,
                       sgk::routing::Route* into, double* latency) override {
    const auto s = static_cast<int64_t>(src->id()), d = static_cast<int64_t>(dst->id());
    if (s == d) return;
    if (s / gpn_ == d / gpn_) {
      into->link_list_.push_back(nv_up[s]);
      into->link_list_.push_back(nv_down[d]);
    } else {
      into->link_list_.push_back(nic_up[s / gpus_per_nic_]);
      into->link_list_.push_back(nic_down[d / gpus_per_nic_]);
    }
    if (latency) *latency += 2 * kLinkLatency;
  }

 private:
  int64_t gpn_, gpus_per_nic_;
};

}  // namespace

Platform build_platform(const ClusterSpec& c) {
  Platform p;
  p.gpus_per_node = c.gpus_per_node;
  p.gpus_per_nic = std::max<int64_t>(1, c.gpus_per_node / std::max<int64_t>(1, c.nics_per_node));
  p.nvlink = c.nvlink;
  p.nic = c.nic;
  const int64_t gpn_ = p.gpus_per_node, gpus_per_nic_ = p.gpus_per_nic;
  const int64_t gpus = c.gpus();
  auto* zone = new GpuZone("cluster", gpn_, gpus_per_nic_);
  zone->set_parent(nullptr);
  const double nv_bw = c.nvlink.bandwidth * c.nvlink.efficiency;
  const double nic_bw = c.nic.bandwidth * c.nic.efficiency;
  // Host speed is unused (GPU kernels are timed by the cost model and run as sleeps).
  for (int64_t g = 0; g < gpus; ++g) {
    p.hosts.push_back(zone->create_host("gpu" + std::to_string(g), {1e9}));
    auto* up = zone->create_link("nvup" + std::to_string(g), {nv_bw});
    up->set_latency(kLinkLatency);
    up->seal();
    auto* down = zone->create_link("nvdown" + std::to_string(g), {nv_bw});
    down->set_latency(kLinkLatency);
    down->seal();
    zone->nv_up.push_back(up->get_impl());
    zone->nv_down.push_back(down->get_impl());
  }
  const int64_t nics = (gpus + gpus_per_nic_ - 1) / gpus_per_nic_;
  for (int64_t n = 0; n < nics; ++n) {
    auto* up = zone->create_link("nicup" + std::to_string(n), {nic_bw});
    up->set_latency(kLinkLatency);
    up->seal();
    auto* down = zone->create_link("nicdown" + std::to_string(n), {nic_bw});
    down->set_latency(kLinkLatency);
    down->seal();
    zone->nic_up.push_back(up->get_impl());
    zone->nic_down.push_back(down->get_impl());
  }
  zone->seal();
  return p;
}


}  // namespace dtsim::simgrid_engine
