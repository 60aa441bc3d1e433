#include "sim/collectives/nccl_model.hpp"

#include <algorithm>

namespace dtsim::collectives::nccl {

namespace {
int pi(Protocol p) { return p == Protocol::LL ? 0 : p == Protocol::LL128 ? 1 : 2; }
int ai(Algo a) { return a == Algo::Tree ? 0 : a == Algo::Ring ? 1 : 2; }

// NVIDIA/nccl src/graph/tuning.cc @b6475625 (see the header for the table).
constexpr double kBaseLat[3][3] = {{6.8, 14.0, 0}, {6.6, 14.0, 8.4}, {0, 0, 0}};
constexpr double kHwLat[2][3][3] = {
    {{0.6, 1.25, 28}, {0.6, 1.9, 3.4}, {0, 0, 23}},   // NVLink: Tree, Ring, NVLS
    {{5.0, 8.5, 28}, {2.7, 4.0, 14.0}, {0, 0, 18}}};  // Net
constexpr double us = 1e-6;
}  // namespace

double hw_latency_us(Hw hw, Algo a, Protocol p) { return kHwLat[hw == Hw::NVLink ? 0 : 1][ai(a)][pi(p)]; }
double base_latency_us(Algo a, Protocol p) { return kBaseLat[ai(a)][pi(p)]; }

double alltoall_latency(const CommModel& m, bool spans_nodes) {
  return step_latency(m, spans_nodes ? Hw::Net : Hw::NVLink, Algo::Ring, Protocol::Simple);
}

double step_latency(const CommModel& m, Hw hw, Algo a, Protocol p) {
  const double nv = hw_latency_us(Hw::NVLink, a, p) / hw_latency_us(Hw::NVLink, Algo::Ring, Protocol::Simple) *
                    m.nvlink_latency;
  if (hw == Hw::NVLink) return nv;
  const double net =
      hw_latency_us(Hw::Net, a, p) / hw_latency_us(Hw::Net, Algo::Ring, Protocol::Simple) * m.net_latency;
  return std::max(nv, net);
}

double base_latency(Algo a, Protocol p) {
  if (a == Algo::Ring && p == Protocol::Simple) return 0;  // see header
  return base_latency_us(a, p) * us;
}

double ring_bw_factor(Protocol p, CollOp op, int64_t nodes, double gpus_per_node) {
  switch (p) {
    case Protocol::Simple: return 1.0;
    case Protocol::LL:
      return nodes > 1 || op == CollOp::AllReduce || op == CollOp::Reduce ? 1.0 / 4.0 : 1.0 / 3.0;
    case Protocol::LL128: return gpus_per_node < 2 ? 0.7 : 0.92;
  }
  return 1.0;
}

double tree_bw_factor(Protocol p, int64_t nodes) {
  switch (p) {
    case Protocol::Simple: return 0.92;
    case Protocol::LL: return 0.92 / 3.8;
    case Protocol::LL128: return 0.92 * (nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0);
  }
  return 0.92;
}

double ll_max_busbw(int64_t nodes) { return (nodes <= 1 ? 87.7 : nodes == 2 ? 39.0 : 20.4) * 1e9; }

}  // namespace dtsim::collectives::nccl
