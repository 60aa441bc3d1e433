#pragma once
// Simulating collectives alone or side by side on a cluster's SimGrid platform, without a
// training step: `dtsim collective`, the collective tests and benchmarks. SimGrid stays
// behind this header.
#include <cstdint>
#include <string>
#include <vector>

#include "models/experiment.hpp"
#include "sim/collectives/collective.hpp"

namespace dtsim::collectives {

struct CollectiveRun {
  std::vector<int64_t> members;  // GPUs (global ranks)
  CollOp op = CollOp::AllReduce;
  double bytes = 0;              // nccl-tests size (collective.hpp)
  /// Algorithm/protocol; "auto" for the tuner's choice. A named one that cannot run throws
  /// InputError (before the simulation starts).
  CollectiveChoice choice;
  /// The token routing of an MoE token AllToAll (GroupLayout::routing; deepep reads it).
  TokenRouting routing;
  int64_t repeat = 1;            // back-to-back collectives in one actor
  int batch = 0;                 // runs of one batch start together; batches run in order
};

struct CollectiveTiming {
  double time_s = 0;         // simulated time of one collective (batch span / repeat)
  double closed_form_s = 0;  // the chosen algorithm's closed form, alone
  std::string algorithm;     // registry name
  Protocol protocol = Protocol::Simple;
};

/// Runs `runs` on a fresh SimGrid engine in this process (one engine per process: call at
/// most once). `fold` as the training engine's FoldPolicy (false: each run is just itself);
/// `sample_planes` as FoldPolicy::sample_planes (false: every rail plane's flows).
/// Throws InputError for bad choices or members outside the cluster.
std::vector<CollectiveTiming> simulate_collectives(const ClusterSpec& cluster, const std::vector<CollectiveRun>& runs,
                                                   bool fold = false, bool sample_planes = true);

/// Same, in a forked child process, so that a process can call it many times.
std::vector<CollectiveTiming> simulate_collectives_isolated(const ClusterSpec& cluster,
                                                            const std::vector<CollectiveRun>& runs, bool fold = false,
                                                            bool sample_planes = true);

/// GPU-to-GPU transfers started together at time 0 on the cluster's SimGrid platform, each one
/// bulk flow of `bytes` on its topology route (Topology::route; no collective latency terms):
/// the simulated seconds until each ends, in order. Shows what the links are: e.g. on an xgmi
/// mesh a transfer between two GPUs of a node crosses only their own link, so transfers of
/// different pairs never share one. Runs in a forked child (one engine per process). Throws
/// InputError for GPUs outside the cluster.
std::vector<double> simulate_transfers_isolated(const ClusterSpec& cluster, const std::vector<Flow>& flows);

}  // namespace dtsim::collectives
