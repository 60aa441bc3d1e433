#pragma once
// A block: one part of a transformer layer (norm, attention, residual, MLP) that appends
// its own ops for every pass through a BlockContext. A layer (models/blocks/layer.hpp) is
// an ordered list of blocks; its forward runs them in order, its backward in reverse.
// Blocks hold only their description (which slot they fill, the names their ops carry),
// never per-step state, so one list serves every layer and micro-batch.
//
// To add a block type: one file in models/blocks/ defining a Block subclass, and the line
// in layer.cpp's layer_spec that puts it into the layers that have it.
#include "models/blocks/block_context.hpp"

namespace dtsim::blocks {

/// Parameters (elements) of a block by how Megatron shards them over TP (Shoeybi 2019
/// Sec 3; the counting rule of models/flops.hpp): GEMM weights and the biases of
/// column-parallel GEMMs are split over the t ranks; norms and the biases of row-parallel
/// GEMMs are replicated. Whole counts (exact in a double), so sums do not depend on order.
struct BlockParams {
  double sharded_weights = 0;
  double replicated_weights = 0;
  double sharded_biases = 0;
  double replicated_biases = 0;
};

class Block {
 public:
  virtual ~Block() = default;
  /// The block's forward (ph = Phase::forward), or its forward recomputed before the
  /// backward under full recomputation (ph = Phase::recompute): same ops, same costs.
  virtual void forward(BlockContext& c, int layer, int mb, Phase ph) const = 0;
  /// The block's backward, or its B or W part (BackwardPart, models/plan.hpp). The W part
  /// emits the weight-gradient GEMMs and only what they need; blocks without weight GEMMs
  /// emit nothing for it.
  virtual void backward(BlockContext& c, int layer, int mb, BackwardPart part) const = 0;
  /// What selective recomputation (Korthikanti 2022 Sec 5: the attention core only)
  /// recomputes of this block before its backward; nothing by default.
  virtual void selective_recompute(BlockContext&, int, int) const {}
  /// The block's parameters (none by default).
  virtual BlockParams parameters(const ModelSpec&) const { return {}; }
};

}  // namespace dtsim::blocks
