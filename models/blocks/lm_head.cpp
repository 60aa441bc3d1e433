#include "models/blocks/lm_head.hpp"

#include "models/blocks/norm.hpp"

namespace dtsim::blocks {

namespace {
// The LM head stays in BF16 under every precision recipe: Megatron-Core's output_layer is
// tensor_parallel.ColumnParallelLinear, not a Transformer Engine module, so fp8_autocast does
// not reach it (megatron/core/models/gpt/gpt_model.py; models/precision.hpp).
constexpr bool kLmHeadLinear = false;
}  // namespace

void LmHeadBlock::forward(BlockContext& c, int layer, int mb, Phase ph) const {
  const double tok = c.b * c.s;
  norm(c, "final_norm", ph, layer, mb);
  c.tp_enter(ph, layer, mb, "tp_allgather", false);
  c.gemm("lm_head", ph, layer, mb, lm_head_forward_flops(c.m, c.e.training.micro_batch, c.shape.tokens_local) / c.t,
         tok, c.V / c.t, c.h, Transpose::b, kLmHeadLinear);
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

void LmHeadBlock::activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const {
  using Split = ActivationTerm::Split;
  const double sbh = a.s * a.b * static_cast<double>(a.m.hidden);
  out.push_back({"final_norm_input", 2.0 * sbh, Split::sequence, false, true});
  out.push_back({"lm_head_input", 2.0 * sbh, Split::sequence});
  out.push_back({"logits_fp32", 4.0 * a.s * a.b * static_cast<double>(a.m.vocab), Split::tensor});
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
      layer, mb, part, [&] { c.gemm("lm_head_dgrad", ph, layer, mb, fl, tok, c.h, c.V / c.t, Transpose::none, kLmHeadLinear); },
      [&] { c.gemm("lm_head_wgrad", ph, layer, mb, fl, c.h, c.V / c.t, tok, Transpose::a, kLmHeadLinear); });
  if (in) norm(c, "final_norm_bwd", ph, layer, mb);
}

}  // namespace dtsim::blocks
