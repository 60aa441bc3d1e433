#pragma once
// LM head block of the last virtual stage: the final norm, the vocab-parallel output
// projection (Megatron's ColumnParallelLinear, V/t columns per rank) and the
// vocab-parallel cross-entropy loss (Megatron-LM tensor_parallel/cross_entropy.py). Ops
// carry layer -1.
#include "models/blocks/block.hpp"

namespace dtsim::blocks {

/// Vocab-parallel cross entropy, bytes per logit element as Megatron's unfused
/// implementation moves them (megatron/core/tensor_parallel/cross_entropy.py, called on
/// logits.float(); the same kernels as Megatron-LM 2021's mpu/cross_entropy.py). Forward,
/// 6 kernels over the V/t logits of every token: the cast to fp32 (read 2 + write 4), max
/// (read 4), in-place subtract (4 + 4), in-place exp (4 + 4), sum (4), in-place divide to
/// the softmax kept for backward (4 + 4) = 38. Backward, 2 kernels: multiply by the
/// output gradient in place (4 + 4), cast back to bf16 for the LM head (4 + 2) = 14. The
/// per-token gathers and masks are ignored.
inline constexpr double kCrossEntropyFwdBytes = 38.0;
inline constexpr int32_t kCrossEntropyFwdKernels = 6;
inline constexpr double kCrossEntropyBwdBytes = 14.0;
inline constexpr int32_t kCrossEntropyBwdKernels = 2;

class LmHeadBlock : public Block {
 public:
  void forward(BlockContext& c, int layer, int mb, Phase ph) const override;
  /// B: cross-entropy backward, lm_head dgrad and its TP reduction, final norm backward.
  /// W: lm_head_wgrad (with SP, after re-gathering the final norm's output).
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const override;
  /// Korthikanti 2022 Sec 4.3 ("4sbh/t (1 + V/h)"): the final norm's input 2sbh and the
  /// LM head's input 2sbh, outside the TP regions, and the fp32 logits kept for the
  /// vocab-parallel cross entropy, 4sbV, split over TP.
  void activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const override;
};

}  // namespace dtsim::blocks
