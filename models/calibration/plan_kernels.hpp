#pragma once
// The kernels of a training step: the shape of every compute op of build_step_plan. GEMMs
// carry the shape their block declared (Op::gemm, models/blocks/block_context.hpp
// BlockContext::gemm); attention kernels are sized here from the model and layout as the
// attention block (models/blocks/attention.cpp) sizes its ops.
#include <optional>
#include <vector>

#include "models/calibration/kernel_spec.hpp"
#include "models/experiment.hpp"
#include "models/plan.hpp"

namespace dtsim::calib {

/// A compute op as `count` back-to-back runs of one kernel: CP "attention*_remote" runs
/// (cp-1)/2 non-causal s/cp x s/cp blocks, the causal work of the load-balanced ring (Liu
/// 2023 Ring Attention / Megatron-Core CP); a grouped expert GEMM runs one GEMM per local
/// expert (Op::gemm_groups) of ceil(rows / experts) token rows, the experts' equal share of
/// the busiest rank's rows (models/moe.hpp; an expert's own imbalance is not modelled).
struct OpKernel {
  KernelSpec spec;
  double count = 1;
};

/// Kernel of one compute op of `exp`'s plan (op.type == compute). GEMMs: Op::gemm, the
/// M, N, K, operand layout and dtype the block declared (the training dtype; bf16 for the
/// unfused attention GEMMs); attention: micro_batch x heads/TP x kv_heads/TP (at least 1) x
/// seq/CP; memory ops: name and op.bytes; optimizer: op.bytes / 30 parameters. nullopt for
/// a GEMM op without a declared shape.
std::optional<OpKernel> kernel_for_op(const Op& op, const Experiment& exp);

/// Every distinct kernel of the plan of `exp` (walks build_step_plan's compute ops), in
/// order of first appearance. Throws InputError when the experiment is invalid.
std::vector<KernelSpec> derive_kernels(const Experiment& exp);

/// Extra shapes measured by `dtsim calibrate --grid` to fit the models over a range: each
/// distinct GEMM of `kernels` with M scaled by 1/4, 1/2, 2 (wave quantisation shows as M
/// changes), and each memory kernel at 1/4 and 4 x its bytes. Distinct from `kernels`.
std::vector<KernelSpec> grid_kernels(const std::vector<KernelSpec>& kernels);

}  // namespace dtsim::calib
