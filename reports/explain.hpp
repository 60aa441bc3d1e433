#pragma once
// `dtsim explain`: the design source's judgment method, printed from the step plan the
// simulator runs (models/plan.hpp build_step_plan) and the memory model it reports
// (models/memory.hpp). For every parallel dimension: which dimension is split, what each
// rank holds (independent samples, a slice of one matmul, a token shard, a stage of layers,
// a state shard), and therefore which collective, which reduce op (SUM or AVG), which
// group, how many bytes, how often, and whether it blocks compute. Nothing here re-derives
// a rule: collectives, reduce ops, groups, sizes and counts are read from the plan's ops;
// memory lines are models/memory.hpp values with the formula each one came from.
//
// Units: bytes (printed in binary units, GiB = 2^30 B), FLOPs, elements (parameters).
#include <cstdint>
#include <string>
#include <vector>

#include "models/experiment.hpp"
#include "models/plan.hpp"

namespace dtsim {

/// One kind of communication op of the plan, aggregated over micro-batches and layers.
/// Key: (dimension, op name, phase, op type, collective, reduce op, group kind).
struct ExplainCommRow {
  std::string dimension;  // "TP", "CP", "PP", "DP" or "ZeRO" (DP-kind ops of ZeRO-1/2/3)
  std::string op;         // plan op name, e.g. "tp_reducescatter"
  Phase phase = Phase::forward;
  /// collective (blocking: on the critical path), issue (async, joined by a wait: may
  /// overlap compute), send / recv (P2P, async).
  OpType type = OpType::collective;
  Collective collective = Collective::AllReduce;  // meaningless for send/recv
  ReduceOp reduce = ReduceOp::none;               // from Op::reduce
  GroupKind group = GroupKind::TP;
  /// Ranks of the group of the first rank of the first stage that runs the op; for P2P the
  /// two ends (sender first).
  std::vector<int64_t> first_group;
  /// Op::size_bytes (nccl-tests "size"; P2P: message) per call, smallest and largest.
  double size_min = 0, size_max = 0;
  /// Bytes one rank sends per call (ring: ring_cost(...).edge_bytes; P2P: the message).
  double sent_min = 0, sent_max = 0;
  /// Calls per step per rank, by stage (index = pipeline stage; 0 where the stage has none).
  std::vector<int64_t> calls_per_stage;
  /// Bytes one rank sends per step, by stage.
  std::vector<double> sent_per_stage;
  /// Op::overlap_splits: > 0 for a blocking TP collective pipelined with its GEMM
  /// (training.tp_comm_overlap); it is then only partly on the critical path.
  int32_t overlap_splits = 0;
  bool critical_path() const { return type == OpType::collective && overlap_splits == 0; }
};

/// Every communication op of the plan, aggregated as above, in order of first appearance
/// (stage 0 first). Reads plan.exp for the layout. Throws InputError for an inconsistent plan
/// (a stage index outside the layout).
std::vector<ExplainCommRow> explain_comm_rows(const StepPlan& plan);

/// The whole explanation: (1) per parallel dimension, what each rank holds and how it talks;
/// (2) every communication op with reduce op, group, bytes, calls per step and critical path;
/// (3) one transformer layer's ops on one rank, forward and backward, in plan order; (4) the
/// gradient rules (TP never averaged; DP AVG over DP x CP, and the exact rule for unequal
/// valid tokens), checked against the plan; (5) the rank grid (TP, CP, DP, PP and DP x CP
/// groups, placement on nodes); (6) the memory of every pipeline stage with the formula and
/// source of each line. `exp` must be the experiment the plan was built from. Deterministic;
/// ends with a newline.
///
/// `ep_reach`: with training.moe_token_dispatcher deepep / hybridep, the expected reach of one
/// token over the EP group of rank 0 (the engines' sim/collectives/alltoall_deepep.cpp
/// deepep_fanout, which the caller computes: reports do not link the engines); the EP block
/// then says how the tokens travel and what one rank sends per call over RDMA and NVLink.
struct ExplainEpReach {
  int64_t members = 0, nodes = 0;    // the EP group of rank 0
  double remote_nodes = 0;           // remote nodes one token crosses the network to
  double other_members = 0;          // members other than the sender one token reaches
};
std::string format_explain(const Experiment& exp, const StepPlan& plan, const ExplainEpReach* ep_reach = nullptr);

/// "[0,1]"; long groups as "[0,8,16,...,56] (8 ranks)".
std::string format_rank_list(const std::vector<int64_t>& ranks);

}  // namespace dtsim
