#pragma once
// Embedding block of the first virtual stage: the vocab-parallel word-embedding lookup
// (Megatron-LM VocabParallelEmbedding: each TP rank holds V/t rows and the partial
// outputs are summed over TP: AllReduce, or ReduceScatter to sequence shards with SP),
// plus learned positions when the model has them. Ops carry layer -1.
#include "models/blocks/block.hpp"

namespace dtsim::blocks {

class EmbeddingBlock : public Block {
 public:
  void forward(BlockContext& c, int layer, int mb, Phase ph) const override;
  /// The embedding's backward is a weight gradient only (token ids have none): all of it
  /// is W, nothing is B. With SP, the TP AllGather of the output gradient is what the
  /// scatter-add needs, so it goes with W. (sail-sg's zero-bubble defers only linear
  /// layers' wgrad GEMMs and leaves the embedding in B; deferring it frees the first
  /// stage's B, which no other stage waits for anyway.)
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const override;
  /// The 1-byte dropout mask of the embedding output, sbh, outside the TP regions
  /// (Korthikanti 2022 Sec 4.3: "sbhp/t" with SP over the p in-flight micro-batches).
  void activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const override;
};

}  // namespace dtsim::blocks
