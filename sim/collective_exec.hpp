#pragma once
// Collectives executed as flows on the platform (internal to sim/: includes SimGrid).
//
// NCCL's ring algorithm as one bulk flow per ring edge carrying the edge volume
// (2(n-1)/n S for AllReduce, (n-1)/n S for ReduceScatter/AllGather; models/plan.hpp
// ring_cost), then steps x alpha of latency. Exact against the alpha-beta ring formula
// without contention and within 0.25% of per-message simulation under contention
// (../shared/design/SIMGRID.md, "Speed").
#include <cstdint>
#include <vector>

#include "models/plan.hpp"
#include "sim/platform.hpp"

namespace dtsim::simgrid_engine {

/// How a folded simulation stands for the ranks it does not simulate.
struct FoldPolicy {
  /// Simulate one representative per stage. Its groups' flows then stand for the
  /// symmetric groups: an intra-node ring launches one edge (all edges alike); a ring
  /// that crosses nodes launches all its edges; bytes crossing a shared NIC are scaled by
  /// the GPUs sharing it (they move the same traffic at the same time).
  bool fold = true;
};

/// Bytes a flow from GPU `src` to GPU `dst` carries for `bytes` of payload under `fold`.
double flow_bytes(const Platform& p, const FoldPolicy& fold, int64_t src, int64_t dst, double bytes);

/// Runs one collective over `members` (ascending global ranks = ring order) in the
/// calling actor and returns when its last flow and latency term are done.
void execute_collective(const Platform& p, const FoldPolicy& fold, const std::vector<int64_t>& members,
                        Collective c, double size_bytes);

}  // namespace dtsim::simgrid_engine
