#pragma once
// Host dispatch: the CPU side of launching a rank's kernels, and CUDA graphs.
//
// A training step's kernels are launched by one host thread per rank (eager PyTorch:
// Python, autograd recording, the ATen dispatcher, cudaLaunchKernel). The launches are
// asynchronous: the host runs ahead of the GPU and the GPU waits for the host only where
// the kernels it was given are shorter than the time the host needs to give it the next
// ones. dtsim models it with one rule, the same in both engines:
//
//   host clock  h_i = h_{i-1} + host_s(op_i), in program order, from the step's start
//               (the previous step ended in a host synchronisation: the loss and grad-norm
//               reads of Megatron-LM's train_step), never waiting for the GPU;
//   an op starts no earlier than h_i; the GPU's idle time that this rule adds is
//   host-bound time (StageResult::host_bound_s), its own term of the step's accounting
//   (compute + slowdown + exposed communication + bubble + host-bound = step time).
//
// host_s(op), assigned once per plan by assign_host_dispatch (Op::host_s, the fact both
// engines, explain and the summary read):
//   eager op:                 cluster.host_dispatch x eager_launches(op);
//   first op of a CUDA graph: cluster.host_dispatch (one replay, a graph launch from the
//                             framework's Python wrapper, counted as one eager launch);
//   later ops of that graph:  0 (the graph's kernels are launched by the GPU's front end).
// Ops whose shapes follow the routing (Op::dynamic_shape: a dropless MoE layer's permute,
// AllToAlls and expert GEMMs) stay eager inside a captured layer and split its graph.
//
// The analytic engine (sim/analytic_engine.hpp) runs the same clock in its segment replays
// (one layer's forward, one layer's backward, embedding, head), each replayed twice back to
// back and timed on the second copy: the periodic steady state of identical layers, where
// the host keeps the lead the previous layer left it (or, after a host_sync, none). The DES
// runs the clock once through the whole step.
//
// Host synchronisations (Op::host_sync: Megatron-Core's alltoall token dispatcher reads the
// tokens-per-expert counts on the host once per MoE layer forward unless the routing is
// drop-and-pad): the host clock jumps to the moment the GPU finished the ops before it,
//   h = max(h, end of the previous GPU work),
// so the host's lead is lost and the launches after it are paced by the host again.
//
// Not modelled: the CUDA launch queue's depth limit (the host blocks once about a thousand
// launches are pending), and the GPU-side cost of each launch, which stays
// GpuSpec::kernel_overhead per kernel inside graphs as outside.
#include <cstdint>

#include "models/experiment.hpp"
#include "models/plan.hpp"

namespace dtsim {

/// Kernel launches the host makes for `op` when it runs eagerly: a compute op its
/// Op::kernels; a collective, issue, send or recv one (the NCCL kernel); a wait none (a
/// stream-ordered event wait, cudaStreamWaitEvent, no kernel).
int32_t eager_launches(const Op& op);

/// Whether `op` is replayed from a CUDA graph (Op::graph >= 0 and its shapes are static);
/// otherwise the host launches it eagerly.
bool captured_in_graph(const Op& op);

/// Sets Op::host_s of every op of `stage` from exp.cluster.host_dispatch and the capture
/// regions (Op::graph, Op::dynamic_shape) the plan builder stamped (rule above). Seconds.
void assign_host_dispatch(StagePlan& stage, const Experiment& exp);

/// Host seconds to dispatch all of `stage`'s ops (sum of Op::host_s).
double stage_host_seconds(const StagePlan& stage);

/// CUDA graph replays in `stage` (graph pieces: maximal runs of consecutive captured ops of
/// one Op::graph id).
int64_t stage_graph_replays(const StagePlan& stage);

}  // namespace dtsim
