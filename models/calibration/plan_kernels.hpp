#pragma once
// The kernels of a training step: the shape of every compute op of build_step_plan,
// derived from the model and layout exactly as models/plan.cpp sizes them (the plan's Op
// carries FLOPs and bytes, not GEMM M/N/K; this is the one place that rebuilds them).
#include <optional>
#include <vector>

#include "models/calibration/kernel_spec.hpp"
#include "models/experiment.hpp"
#include "models/plan.hpp"

namespace dtsim::calib {

/// A compute op as `count` back-to-back runs of one kernel (count > 1 only for CP
/// "attention*_remote": (cp-1)/2 non-causal s/cp x s/cp blocks, the causal work of the
/// load-balanced ring, Liu 2023 Ring Attention / Megatron-Core CP).
struct OpKernel {
  KernelSpec spec;
  double count = 1;
};

/// Kernel of one compute op of `exp`'s plan (op.type == compute). GEMMs (qkv, out_proj,
/// mlp_up/gate/down, lm_head and their _dgrad/_wgrad; unfused attention_scores/values):
/// M, N, K at the layout's TP size and the training dtype (bf16 for the unfused attention
/// GEMMs); attention: micro_batch x heads/TP x kv_heads/TP (at least 1) x seq/CP; memory
/// ops: name and op.bytes; optimizer: op.bytes / 30 parameters. nullopt for a GEMM name
/// it does not know.
std::optional<OpKernel> kernel_for_op(const Op& op, const Experiment& exp);

/// Every distinct kernel of the plan of `exp` (walks build_step_plan's compute ops), in
/// order of first appearance. Throws InputError when the experiment is invalid.
std::vector<KernelSpec> derive_kernels(const Experiment& exp);

/// Extra shapes measured by `dtsim calibrate --grid` to fit the models over a range: each
/// distinct GEMM of `kernels` with M scaled by 1/4, 1/2, 2 (wave quantisation shows as M
/// changes), and each memory kernel at 1/4 and 4 x its bytes. Distinct from `kernels`.
std::vector<KernelSpec> grid_kernels(const std::vector<KernelSpec>& kernels);

}  // namespace dtsim::calib
