#pragma once
// The entry of one multi-token prediction depth (DeepSeek-V3 report, arXiv 2412.19437,
// Sec 2.2 and Fig 3; Megatron-Core megatron/core/transformer/multi_token_prediction.py
// MultiTokenPredictionLayer @d98e8a64): the shared embedding of the tokens shifted by the
// depth (the word embedding, vocab-parallel with its TP reduction, as EmbeddingBlock), the
// RMSNorms of that embedding (enorm) and of the previous depth's hidden state (hnorm), their
// concatenation [tokens, 2h] and the projection eh_proj 2h -> h (a ColumnParallelLinear:
// with SP its sequence-sharded input is all-gathered first; its h / t output columns are
// gathered over TP, gather_from_tensor_model_parallel_region, and scattered back to the
// sequence shards, scatter_to_sequence_parallel_region, which moves nothing). After it the
// plan runs one transformer layer of the last decoder layer's kind and the shared LM head +
// loss with the depth's own final norm (models/plan.cpp; layer index model.layers + depth).
// Ops carry the MTP layer's index.
#include "models/blocks/block.hpp"

namespace dtsim::blocks {

class MtpEntryBlock : public Block {
 public:
  void forward(BlockContext& c, int layer, int mb, Phase ph) const override;
  /// B: eh_proj dgrad (its TP reduction over the 2h-wide input), the norms' backward. W:
  /// eh_proj wgrad and the embedding's scatter-add (with SP after re-gathering).
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const override;
  /// eh_proj 2h x h (TP-sharded); enorm, hnorm and the depth's final norm, h each, replicated
  /// (multi_token_prediction.py: enorm, hnorm, eh_proj bias=False, final_layernorm).
  BlockParams parameters(const ModelSpec& m) const override;
  /// eh_proj, 2 x tokens x 2h x h (the mtp_* terms of flops.hpp ForwardFlops are not split:
  /// flops.cpp mtp_forward_flops adds it).
  void forward_flops(const ModelSpec& m, double tokens, double s_kv, ForwardFlops& out) const override;
  /// The norms' inputs (the embedding output and the hidden state, 2 sbh each) and eh_proj's
  /// input (the concatenation, 4 sbh), all sequence-shardable.
  void activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const override;
};

}  // namespace dtsim::blocks
