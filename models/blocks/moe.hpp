#pragma once
// Mixture-of-experts block: the MLP slot of a MoE layer (Megatron-Core MoELayer,
// megatron/core/transformer/moe/moe_layer.py): router, token dispatch, the rank's E / ep
// routed SwiGLU experts as grouped GEMMs, combine, and the shared expert(s). Token counts come
// from models/moe.hpp moe_tokens (which documents the eight steps and the load factor).
//
// Ops, forward (ph = forward or recompute):
//   router            GEMM T x E x h (the gate; Megatron-Core router.py TopKRouter.gating)
//   router_topk       memory: scores, top-k, softmax / sigmoid over T x E (fp32)
//   moe_permute       memory: gather the T k copies in expert order (read + write)
//   moe_dispatch      AllToAll over EP, nccl-tests size = received x h x dispatch bytes
//                     (models/moe.hpp moe_dispatch_bytes_per_element)
//   moe_etp_allgather AllGather over ETP (etp > 1), output size computed x h x 2
//   expert_up, expert_gate  grouped GEMMs (computed x f_e/etp x h), E / ep launches
//   expert_swiglu     memory
//   expert_down       grouped GEMM (computed x h x f_e/etp)
//   moe_etp_reducescatter  ReduceScatter over ETP (etp > 1): SUM of row-parallel partials
//   moe_combine       AllToAll over EP, size = received x h x 2 (bf16)
//   moe_unpermute     memory: each token's k outputs weighted by its router probabilities
//                     and summed on the token's own rank
//   shared_up/gate/down  the shared expert, a TP MLP of f_s (Megatron-Core SharedExpertMLP);
//                     with training.moe_shared_expert_overlap it runs while the dispatch
//                     travels (issued, then waited after the shared expert's forward).
// Backward, reverse order: unpermute_bwd, the combine's backward (AllToAll, bf16), the ETP
// gather of the output gradient, expert_down dgrad / wgrad, swiglu backward, expert_up
// (up + gate) dgrad / wgrad, the ETP ReduceScatter of the input gradient, the dispatch's
// backward (AllToAll, bf16), permute backward, router dgrad / wgrad, the shared expert's
// backward. B / W split (BackwardPart): W = the expert, router and shared-expert wgrads.
// training.delay_wgrad_compute (Megatron-Core --delay-wgrad-compute, fused backward): the
// dispatch's backward AllToAll is issued before the expert wgrads and waited after them.
#include "models/blocks/block.hpp"

namespace dtsim::blocks {

class MoeBlock : public Block {
 public:
  void forward(BlockContext& c, int layer, int mb, Phase ph) const override;
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const override;
  /// Router E x h replicated over TP (applied to sequence shards, so its gradient is summed
  /// over TP with sequence parallelism: Megatron-Core router.py marks the weight
  /// sequence_parallel), the expert bias E (router_enable_expert_bias; not trained by
  /// gradient, counted as a buffer-like replicated parameter), routed experts E x 3 h f_e
  /// (expert_weights), the shared expert 3 h f_s sharded over TP.
  BlockParams parameters(const ModelSpec& m) const override;
  /// Model FLOPs at balance: router 2 T h E, experts 2 T k h f_e for each of up, gate, down,
  /// shared expert 2 T h f_s each.
  void forward_flops(const ModelSpec& m, double tokens, double s_kv, ForwardFlops& out) const override;
  /// What Megatron-Core's MoE layer keeps for backward, per micro-batch (Split::sequence:
  /// per-rank bytes are these / t with sequence parallelism, which a MoE layer with tp > 1
  /// requires): the MoE input 2 sbh (the router's and the shared expert's input), router
  /// logits and probabilities 4 sbE + 4 sbk (fp32), and per routed copy (sbk x load): the
  /// permuted expert input 2h, fc1 output [up, gate] 4 f_e, SwiGLU output 2 f_e, the expert
  /// output 2h (the combine weights' gradient needs it); the shared expert as an MLP of f_s.
  void activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const override;
};

}  // namespace dtsim::blocks
