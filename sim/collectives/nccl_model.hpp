#pragma once
// NCCL's own tuning model, as the cost models use it. Every constant is NCCL's, read from
// NVIDIA/nccl src/graph/tuning.cc @b6475625 (NCCL 2.19/2.20: Tree, Ring, NVLS; no PAT):
//
//   baseLat[algo][proto] (us), per collective       LL     LL128   Simple
//     Tree                                          6.8    14.0    0
//     Ring                                          6.6    14.0    8.4
//     NVLS                                          0      0       0
//   hwLat[hw][algo][proto] (us), per step
//     NVLink Tree                                   0.6    1.25    28
//     NVLink Ring                                   0.6    1.9     3.4
//     NVLink NVLS                                   -      -       23
//     Net    Tree                                   5.0    8.5     28
//     Net    Ring                                   2.7    4.0     14.0
//     Net    NVLS                                   -      -       18
//   bandwidth refinements (relative to the algorithm's Simple bus bandwidth):
//     Ring LL     x 1/4 (several nodes, or AllReduce/Reduce), else x 1/3; at most llMaxBw
//     Ring LL128  x 0.92 (>= 2 GPUs per node), x 0.7 (one GPU per node)
//     Tree        x 0.92; LL x 1/3.8 more (at most llMaxBw); LL128 x 7/9 (one node) or
//                 x 120/128 (several nodes)
//   llMaxBw (GB/s, bus bandwidth): one node (Ampere/Hopper) 87.7; Intel hosts: 2 nodes 39.0,
//     more 20.4.
//
// How dtsim maps them (documented limitations):
//   - The cluster's link latencies (cluster.nvlink.latency, cluster.nic.latency; the presets
//     use hwLat Ring/Simple 3.4 and 14.0 us, topologies/nodes/README.md) scale every entry
//     of their row, so a user's latency keeps NCCL's ratios between algorithms/protocols.
//     A network step is never faster than an NVLink step (max of both).
//   - Ring/Simple's baseLat (8.4 us) is not added: its steps x alpha stays the textbook
//     alpha-beta ring 2(n-1)(alpha + S/(nB)) (tests/unit/test_engine.cpp pins it); a
//     difference of 8.4 us per collective, below NCCL's own model error at small sizes.
//   - Per-channel bandwidth caps (perChMaxTreeBw, perChMaxRingLL128Bw) are not modelled:
//     dtsim does not model NCCL's channel count; the Simple rate itself is calibrated on
//     measured bus bandwidth (LinkSpec::efficiency).
//   - LL128 is enabled everywhere (NCCL enables it on NVLink systems of one compute
//     capability; that version disabled it on Blackwell).
#include <cstdint>

#include "sim/collectives/collective.hpp"

namespace dtsim::collectives::nccl {

enum class Algo { Tree, Ring, Nvls };
enum class Hw { NVLink, Net };

/// NCCL's hwLat in microseconds (table above).
double hw_latency_us(Hw hw, Algo a, Protocol p);
/// NCCL's baseLat in microseconds (table above).
double base_latency_us(Algo a, Protocol p);

/// Per-step latency of `a`/`p` on this cluster, seconds: hwLat scaled by the cluster's
/// Ring/Simple latency of that hardware class; Net is at least the NVLink value.
double step_latency(const CommModel& m, Hw hw, Algo a, Protocol p);
/// The latency term of one AllToAll (the direct and the deepep algorithms): one Ring/Simple
/// step of its slowest path, the network when the group spans nodes, else NVLink. Seconds.
double alltoall_latency(const CommModel& m, bool spans_nodes);
/// Per-collective base latency, seconds (0 for Ring/Simple, see above).
double base_latency(Algo a, Protocol p);

/// Ring bus-bandwidth factor of protocol `p` relative to Simple.
double ring_bw_factor(Protocol p, CollOp op, int64_t nodes, double gpus_per_node);
/// Tree bus-bandwidth factor relative to the Ring/Simple rate of the links (includes 0.92).
double tree_bw_factor(Protocol p, int64_t nodes);
/// llMaxBw as bus bandwidth, B/s.
double ll_max_busbw(int64_t nodes);

}  // namespace dtsim::collectives::nccl
