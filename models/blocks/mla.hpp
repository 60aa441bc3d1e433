#pragma once
// Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434, Sec 2.1.2-2.1.3 and
// Eq. 9-19; DeepSeek-V3, arXiv 2412.19437, Sec 2.1.1), as Megatron-Core runs it
// (megatron/core/transformer/multi_latent_attention.py MLASelfAttention with the Transformer
// Engine layer spec, megatron/core/models/gpt/gpt_layer_specs.py):
//
//   q_down  (h -> d_q)              linear_q_down_proj: TE Linear, "duplicated" over TP
//   q_norm  (RMSNorm over d_q)      fused into linear_q_up_proj (TELayerNormColumnParallelLinear)
//   q_up    (d_q -> n (d_n + d_r))  column-parallel
//   kv_down (h -> d_c + d_r)        linear_kv_down_proj: duplicated; the d_r part is the shared
//                                   rotary key k^R (one head)
//   kv_norm (RMSNorm over d_c)      fused into linear_kv_up_proj
//   kv_up   (d_c -> n (d_n + d_v))  column-parallel: per-head keys (non-rotary part) and values
//   attention over n heads with query / key head d_n + d_r and value head d_v
//   out_proj (n d_v -> h)           row-parallel
//
// with h = hidden, n = heads, d_q = q_lora_rank, d_c = kv_lora_rank, d_n = qk_nope_head_dim,
// d_r = qk_rope_head_dim, d_v = v_head_dim. With q_lora_rank = 0 (DeepSeek-V2-Lite) the query
// is one column-parallel projection h -> n (d_n + d_r) (linear_q_proj).
//
// Tensor parallelism (Megatron-Core, same file): the duplicated down projections run on the
// layer's input as it is, i.e. on the sequence shard with sequence parallelism (b s / t
// tokens) and on every token, redundantly on each TP rank, without it. With SP the latents
// are then all-gathered over TP: q latent (inside linear_q_up_proj), kv latent (inside
// linear_kv_up_proj) and k^R (gather_from_sequence_parallel_region), d_q + d_c + d_r elements
// per token, which dtsim issues as ONE AllGather (the three calls' bytes; one latency). The
// backward reduces the latents' input gradients over TP the same way (ReduceScatter with SP,
// AllReduce without: the column-parallel backward of BlockContext at width d_q + d_c + d_r).
// The down projections' weights and the two latent norms are replicated over TP; their
// gradients, computed on sequence shards with SP, are summed over TP at the end of the step
// with the other replicated parameters (models/plan.cpp; Megatron-Core
// distributed/finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads).
#include "models/blocks/block.hpp"

namespace dtsim::blocks {

class MlaBlock : public Block {
 public:
  /// Down projections (+ latent AllGather with SP), latent norms, up projections, rope on
  /// the rotary parts (n d_r of the query, d_r of the shared key), the attention core
  /// (attention.hpp attention_core_forward, with CP), out_proj and its TP reduction.
  void forward(BlockContext& c, int layer, int mb, Phase ph) const override;
  /// B: output-gradient gather (SP), out_proj dgrad, core backward, rope backward, the up
  /// projections' dgrad and the latent gradients' TP reduction, the latent norms' backward,
  /// the down projections' dgrad. W: out_proj, up-projection (after the SP re-gather of the
  /// latents) and down-projection wgrad.
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const override;
  void selective_recompute(BlockContext& c, int layer, int mb) const override;
  /// sharded: q_up d_q n (d_n + d_r) (or q_proj h n (d_n + d_r)), kv_up d_c n (d_n + d_v),
  /// out_proj n d_v h; replicated: q_down h d_q, kv_down h (d_c + d_r), the RMSNorm weights
  /// d_q and d_c. No linear biases (DeepSeek-V2/V3 have none; models/moe_checks.cpp refuses
  /// MLA with a GeLU model's biases). DeepSeek-V3 (h 7168, n 128, d_q 1536, d_c 512, d_n 128,
  /// d_r 64, d_v 128): 187,107,328 per layer.
  BlockParams parameters(const ModelSpec& m) const override;
  /// qkv = 2 tokens (h d_q + d_q n (d_n + d_r) + h (d_c + d_r) + d_c n (d_n + d_v)) (the four
  /// projections), attention_scores = 2 tokens s_kv n (d_n + d_r), attention_values =
  /// 2 tokens s_kv n d_v, out_proj = 2 tokens n d_v h.
  void forward_flops(const ModelSpec& m, double tokens, double s_kv, ForwardFlops& out) const override;
  /// Korthikanti 2022 Sec 4.1's accounting applied to the tensors MLA's backward reads: the
  /// down projections' shared input 2sbh and the latents before and after their norms
  /// (2 x 2sb d_q, 2 x 2sb d_c), outside the TP region (sequence split); inside it Q
  /// 2sb n (d_n + d_r), K 2sb n (d_n + d_r), V 2sb n d_v and out_proj's input 2sb n d_v; the
  /// score term 5 n s s_kv b unless FlashAttention (selectively recomputed).
  void activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const override;
};

}  // namespace dtsim::blocks
