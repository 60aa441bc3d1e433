#pragma once
// Collectives executed on the platform (internal to sim/: includes SimGrid).
//
// execute_collective picks the algorithm and protocol as NCCL's tuner does (or as
// cluster.collectives forces; sim/collectives/tuner.hpp) and runs its traffic plan
// (sim/collectives/collective.hpp): per phase, the inter-node transfers as bulk flows on the
// links of the topology (so concurrent collectives share NICs and switch uplinks), the
// intra-node NVLink part as a closed-form sleep running alongside them (uncontended inside a
// node: every GPU has its own NVSwitch ports; on an xgmi mesh, an assumption: the links a
// collective's group uses are taken as its own), then the phase's latency terms as a sleep.
// Alone on a non-blocking fabric this reproduces the algorithm's closed form exactly
// (tests/unit/test_collectives.cpp); one bulk flow per transfer is within 0.25% of
// per-message simulation under contention (../shared/design/SIMGRID.md, "Speed").
#include <cstdint>
#include <vector>

#include "models/plan.hpp"
#include "sim/collectives/tuner.hpp"
#include "sim/platform.hpp"

namespace dtsim::simgrid_engine {

/// How a folded simulation stands for the ranks it does not simulate.
struct FoldPolicy {
  /// Simulate one representative per stage. Its groups' flows then stand for the
  /// symmetric groups on the same nodes (every GPU of a node runs the same schedule): on a
  /// non-blocking fabric, bytes crossing a NIC are scaled by the GPUs sharing it that are not
  /// in the group (they move the same traffic at the same time); on a fabric with switch
  /// uplinks, the flows of those sibling groups are launched too, so uplinks see them all.
  bool fold = true;
  /// On a non-blocking fabric, run only rail plane 0 of a phase whose planes are copies
  /// (collective_exec.cpp planes_are_copies): the same time with k x fewer flows for k members
  /// per node; false launches every plane (the tests compare the two).
  bool sample_planes = true;
  /// The collective runs by itself on the fabric (`dtsim collective`: the only run of its
  /// batch): no other flow shares its links, so plane 0 of a complete exchange runs as one
  /// flow per node to the next node with every chunk that node sends (run_traffic), the same
  /// time alone with N - 1 x fewer flows, as folded. Never set in a training step.
  bool alone = false;
};

/// Bytes a P2P flow from GPU `src` to GPU `dst` carries for `bytes` of payload under `fold`
/// (inter-node on a non-blocking fabric: scaled by the GPUs sharing the NIC; on a fabric
/// with switch uplinks the siblings are separate flows, see launch_fold_siblings).
double flow_bytes(const Platform& p, const FoldPolicy& fold, int64_t src, int64_t dst, double bytes);

/// Under `fold`, on a fabric with switch uplinks, for an inter-node P2P transfer of `bytes`
/// from `src` to `dst`: starts (detached) the same transfer of every other GPU of src's
/// pipeline stage on its node (src+o -> dst+o, `stage_size` consecutive ranks per stage), so
/// NICs and uplinks carry what the unsimulated ranks send at the same time. No-op otherwise.
void launch_fold_siblings(const Platform& p, const FoldPolicy& fold, int64_t src, int64_t dst, double bytes,
                          int64_t stage_size);

/// Runs one collective over `members` (global ranks = GPUs, ascending = ring order) in the
/// calling actor and returns when its last flow and latency term are done. `size_bytes` as
/// in nccl-tests (models/plan.hpp Op::size_bytes). The algorithm/protocol: `want` when
/// given (strict: InputError if it cannot run), else the platform's cluster.collectives
/// (falls back to the automatic choice where the named algorithm cannot run). `routing`:
/// the token routing of an EP AllToAll (collectives::GroupLayout::routing), else null.
/// Returns the choice made.
collectives::Choice execute_collective(const Platform& p, const FoldPolicy& fold, const std::vector<int64_t>& members,
                                       collectives::CollOp op, double size_bytes,
                                       const CollectiveChoice* want = nullptr,
                                       const collectives::TokenRouting* routing = nullptr);

/// For a collective that moves no bytes between nodes (every phase of its traffic plan
/// closed-form, e.g. a TP group inside one NVLink domain): the sleeps execute_collective
/// would run, in order (zero ones left out), in `steps`; returns true. False when a phase has
/// flows (they must be simulated on the links) and for a group of one member or no bytes
/// (nothing to wait for). Same arguments and choice as execute_collective.
bool closed_form_steps(const Platform& p, const std::vector<int64_t>& members, collectives::CollOp op,
                       double size_bytes, const CollectiveChoice* want, const collectives::TokenRouting* routing,
                       std::vector<double>& steps);

/// The engine's entry point: AllReduce, ReduceScatter or AllGather with the platform's
/// choice. ReduceOp (SUM/AVG) does not change the cost: NCCL's ncclAvg is a SUM with the
/// division folded into the same kernel (NCCL 2.10 release notes, ncclAvg).
void execute_collective(const Platform& p, const FoldPolicy& fold, const std::vector<int64_t>& members,
                        Collective c, double size_bytes, ReduceOp op = ReduceOp::sum);

/// Runs a traffic plan for group `g` (used by execute_collective and tests).
void run_traffic(const Platform& p, const FoldPolicy& fold, const collectives::GroupLayout& g,
                 const collectives::TrafficPlan& plan);

}  // namespace dtsim::simgrid_engine
