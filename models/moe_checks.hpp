#pragma once
// Input checks of the mixture-of-experts model and layout keys (model.moe, layout.ep / etp,
// training MoE options, with Megatron-Core's constraints of overlap_moe_expert_parallel_comm)
// and of model.mtp_layers (Megatron-Core's unsupported combinations). Each problem
// names its key and the violated constraint (models/errors.hpp ProblemList).
#include "models/errors.hpp"
#include "models/experiment.hpp"

namespace dtsim {

/// Adds one line to `p` per violated constraint of `e`'s MoE, MLA, attention-window and
/// expert-layout settings (models/experiment.hpp MoeSpec, Layout::ep / etp).
void check_moe(const Experiment& e, ProblemList& p);

}  // namespace dtsim
