#include "models/blocks/lm_head.hpp"

#include "models/blocks/norm.hpp"

namespace dtsim::blocks {

void LmHeadBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  const double tok = c.b * c.s;
  norm(c, "final_norm", ph, layer, mb);
  c.tp_enter(ph, layer, mb, "tp_allgather", false);
  c.gemm("lm_head", ph, layer, mb, lm_head_forward_flops(c.m, c.e.training.micro_batch, c.shape.tokens_local) / c.t,
         tok, c.V / c.t, c.h);
  c.compute("cross_entropy", ph, layer, mb, KernelKind::memory, 0, kCrossEntropyFwdBytes * tok * c.V / c.t,
            kCrossEntropyFwdKernels);
  // Vocab-parallel cross entropy (Megatron-LM tensor_parallel/cross_entropy.py): the
  // logits' maximum (MAX), then the target logit and the sum of exponentials (SUM),
  // fp32 per token.
  for (int i = 0; i < 3; ++i) {
    c.collective(i == 0 ? "tp_allreduce_loss_max" : "tp_allreduce_loss", ph, layer, mb, CommKind::TP,
                 Collective::AllReduce, GroupKind::TP, 4.0 * tok);
    if (i == 0 && !c.sp.ops.empty() && c.sp.ops.back().type == OpType::collective)
      c.sp.ops.back().reduce = ReduceOp::max;
  }
}

void LmHeadBlock::backward(BlockContext& c, int layer, int mb, BackwardPart part) const {
  const Phase ph = Phase::backward;
  const double tok = c.b * c.s;
  const bool in = part != BackwardPart::weight;
  const BlockContext::WeightPart w(c, part == BackwardPart::weight);
  if (in)
    c.compute("cross_entropy_bwd", ph, layer, mb, KernelKind::memory, 0, kCrossEntropyBwdBytes * tok * c.V / c.t,
              kCrossEntropyBwdKernels);
  const double fl = lm_head_forward_flops(c.m, c.e.training.micro_batch, c.shape.tokens_local) / c.t;
  c.column_parallel_backward(
      layer, mb, part, [&] { c.gemm("lm_head_dgrad", ph, layer, mb, fl, tok, c.h, c.V / c.t); },
      [&] { c.gemm("lm_head_wgrad", ph, layer, mb, fl, c.h, c.V / c.t, tok); });
  if (in) norm(c, "final_norm_bwd", ph, layer, mb);
}

}  // namespace dtsim::blocks
