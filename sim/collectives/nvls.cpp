// NVLS (NCCL_ALGO=NVLS, NVLink SHARP; H100 and later): the NVSwitch reduces and multicasts.
// AllReduce: every GPU's shards go to the switch, which returns the reduced shard of its
// owner (multimem.ld_reduce), and each owner multicasts its reduced shard (multimem.st): per
// GPU and direction S + S/n, so T = (n+1)/n S / B_nvls. ReduceScatter: S out, S/n in;
// AllGather: S/n out, S in; both T = S / B_nvls. B_nvls = NVLink line rate x
// nvls_efficiency (topologies/nodes/README.md: 0.6875 from 480 GB/s busbw on 8 x H100).
// Latency: NCCL's NVLS hwLat (23 us on NVLink, no base; nccl_model.hpp).
// Limits as NCCL 2.19-2.20: one NVLink domain (no NVLS across nodes without CollNet),
// more than 2 GPUs (src/transport/nvls.cc: "gpuCount <= 2" disables NVLS), Simple only.
// Intra-node only: closed form, no flows.
#include "sim/collectives/nccl_model.hpp"
#include "sim/collectives/registry.hpp"

namespace dtsim::collectives {
namespace {

double volume(CollOp op, const GroupLayout& g, double bytes) {
  const double n = static_cast<double>(g.n());
  return op == CollOp::AllReduce ? (n + 1) / n * bytes : bytes;
}

double latency(const CommModel& m) {
  return nccl::step_latency(m, nccl::Hw::NVLink, nccl::Algo::Nvls, Protocol::Simple) +
         nccl::base_latency(nccl::Algo::Nvls, Protocol::Simple);
}

class Nvls final : public Algorithm {
 public:
  std::string_view name() const override { return "nvls"; }
  std::string_view summary() const override {
    return "NVLink SHARP in-switch reduction (NCCL NVLS): AllReduce, ReduceScatter, AllGather in one NVLink domain";
  }
  bool tuner_candidate() const override { return true; }
  std::vector<Protocol> protocols() const override { return {Protocol::Simple}; }
  std::string unsupported(CollOp op, const GroupLayout& g, const CommModel& m) const override {
    if (op != CollOp::AllReduce && op != CollOp::ReduceScatter && op != CollOp::AllGather)
      return "nvls runs AllReduce, ReduceScatter and AllGather";
    if (m.mesh) return "nvls needs an NVSwitch to reduce in (this node is an xgmi mesh)";
    if (!(m.nvls_bw > 0)) return "nvls needs NVLink SHARP (NVSwitch gen 3 or later; cluster.nvlink.nvls_efficiency is 0)";
    if (g.node_count() > 1) return "nvls runs inside one NVLink domain (the group spans " + std::to_string(g.node_count()) + " nodes)";
    if (g.n() <= 2) return "NCCL enables NVLS only on more than 2 GPUs";
    return "";
  }
  double closed_form(CollOp op, const GroupLayout& g, const CommModel& m, double bytes, Protocol) const override {
    if (g.n() < 2) return 0;
    return volume(op, g, bytes) / m.nvls_bw + latency(m);
  }
  TrafficPlan plan(CollOp op, const GroupLayout& g, const CommModel& m, double bytes, Protocol) const override {
    TrafficPlan t;
    if (g.n() < 2) return t;
    Phase ph;
    ph.intra_s = volume(op, g, bytes) / m.nvls_bw;
    ph.latency_s = latency(m);
    t.phases.push_back(std::move(ph));
    return t;
  }
};

}  // namespace

const Algorithm& nvls_algorithm() {
  static const Nvls a;
  return a;
}

}  // namespace dtsim::collectives
