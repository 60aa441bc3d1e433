#pragma once
// One layer of a combined forward-backward pass (training.overlap_moe_expert_parallel_comm):
// the forward of one micro-batch's layer and the backward of another's run side by side so
// that each one's EP AllToAll travels while the other computes. Megatron-Core
// (NVIDIA/Megatron-LM @d98e8a64, megatron/core/models/common/model_chunk_schedule_plan.py
// TransformerLayerSchedulePlan.run) splits a MoE layer into sub-modules on two streams:
//     comm stream:    combine_bwd      | dispatch_fwd -> dispatch_bwd   | combine_fwd
//     compute stream: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | pre_dispatch_bwd
// DualPipe's overlapped forward-backward chunk does the same per layer (DeepSeek-V3 report,
// arXiv 2412.19437, Sec 3.2.1 and Fig 4: attention and MLP of one chunk beside the dispatch
// and combine of the other). The plan builder (models/plan.cpp) and the analytic engine's
// per-layer replay (sim/analytic_engine.cpp) both merge with this one function, so the DES,
// the closed form, memory and explain read the same ops.
#include <cstdint>
#include <vector>

#include "models/plan.hpp"

namespace dtsim {

/// Appends to `out` the merged ops of one forward layer (`fwd`, as the blocks emit it) and
/// one backward layer (`recompute`: its selective recomputation, then `bwd`: its backward).
/// Each pass is cut at its two EP AllToAlls (by name: moe_dispatch / moe_combine forward,
/// moe_combine_bwd / moe_dispatch_bwd backward) into three segments; an AllToAll that the
/// block overlaps itself (an issue ... wait pair: delay_wgrad_compute's expert weight
/// gradients) is first made blocking at its wait, after the ops it ran beside, as
/// Megatron's combined pass runs mlp.backward_dw before the dispatch's backward. A pass
/// without AllToAlls (a dense layer) is all middle segment. The order on the compute stream:
///     B0 issue(combine_bwd) F0 issue(dispatch) wait(combine_bwd) B1 issue(dispatch_bwd)
///     wait(dispatch) F1 issue(combine) wait(dispatch_bwd) recompute B2 wait(combine) F2
/// so the combine's backward travels beside the forward's attention, the dispatch beside the
/// backward's experts, the dispatch's backward beside the forward's experts and the combine
/// beside the backward's attention. The AllToAlls share the in-order EP stream (Megatron's
/// one comm stream). New issue handles come from `handles` (StagePlan::handles), which is
/// advanced. Throws std::logic_error when a pass holds an AllToAll without the other one of
/// its pair (a builder bug).
void merge_forward_backward(std::vector<Op>& out, const std::vector<Op>& fwd, const std::vector<Op>& recompute,
                            const std::vector<Op>& bwd, int32_t& handles);

}  // namespace dtsim
