#pragma once
// The plan edits that close the gaps `dtsim verify` reports in models/plan.cpp, written as
// code so that they are exact: each inserts the op the report asks for. The verifier's
// tests apply them to show that, with these ops, every rule passes on every shipped
// experiment; models/plan.cpp adopting the same ops (same names, kinds, groups, reduce
// ops and sizes) makes them no-ops.
#include "models/plan.hpp"

namespace dtsim::verify {

/// Sequence parallelism: norm weights/biases and row-parallel biases are replicated over
/// TP but applied to sequence shards, so each TP rank's gradient is a partial sum.
/// Inserts before optimizer_adam on every stage {collective "tp_sp_grad_allreduce", kind
/// TP, AllReduce, SUM, group TP, phase optimizer, layer -1, size = those elements x
/// grad_bytes_per_param} (Megatron-Core finalize_model_grads.py, _allreduce_layernorm_grads).
/// Does nothing without SP or when the plan has the op.
void add_sp_grad_sync(StepPlan& plan);

/// ZeRO-3, and ZeRO-1/2 with overlap_param_gather: parameter AllGathers cover layers only,
/// so the owners' updates of the embedding, final norm and LM head never reach the other
/// ranks. Inserts after optimizer_adam on the first and last stage {collective
/// "dp_param_allgather", kind DP,
/// AllGather, group DPxCP, phase optimizer, layer -1, size = those elements x 2 bytes}.
/// Does nothing when not needed or already present.
void add_rest_param_gather(StepPlan& plan);

/// Tied word embedding, pp > 1, ZeRO-1/2: the embedding_grad_allreduce after the DP
/// ReduceScatters adds the two stages' differently sharded gradients. Megatron-Core gives
/// the shared embedding its own gradient bucket (param_and_grad_buffer.py
/// _does_param_require_new_bucket), which the plan cannot express (Op does not say which
/// parameters a DP collective covers); the equivalent edit here moves
/// embedding_grad_allreduce before the DP collective that takes the embedding gradient.
void embedding_grad_before_dp_sync(StepPlan& plan);

/// All of the above.
void close_known_gaps(StepPlan& plan);

}  // namespace dtsim::verify
