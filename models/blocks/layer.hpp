#pragma once
// A transformer layer as an ordered list of blocks, described as data and built from the
// ModelSpec (Megatron-Core's ModuleSpec, megatron/core/transformer/spec_utils.py, and
// gpt_layer_specs.py: a layer names which submodule fills each slot). The forward runs
// the blocks in order, the backward (whole, or its B or W part) in reverse.
//
// Today every layer is Megatron-Core's dense pre-norm GPT / Llama layer:
//   input_norm, attention, residual, post_attention_norm, mlp, residual
// (TransformerLayer: input_layernorm, self_attention, self_attn_bda, pre_mlp_layernorm,
// mlp, mlp_bda). model_blocks() is the one place that says which layer index gets which
// list, so layers that differ (dense first-k layers, MoE, local / global attention) are a
// new BlockKind and a line there.
#include <cstdint>
#include <memory>
#include <vector>

#include "models/blocks/block.hpp"

namespace dtsim::blocks {

enum class BlockKind { norm, attention, residual, mlp };

/// One slot of a layer: the block type and, for a norm, the names of its ops.
struct BlockSpec {
  BlockKind kind = BlockKind::norm;
  const char* name = "";      // norm: forward op name ("input_norm", ...)
  const char* bwd_name = "";  // norm: backward op name ("input_norm_bwd", ...)
};

/// The block list of one layer, instantiated from its description.
class Layer {
 public:
  explicit Layer(std::vector<BlockSpec> spec);
  const std::vector<BlockSpec>& spec() const { return spec_; }
  /// Forward (Phase::forward) or full recomputation (Phase::recompute) of layer `layer`.
  void forward(BlockContext& c, int layer, int mb, Phase ph) const;
  /// Backward, or its B or W part (BackwardPart); blocks in reverse order. Ops appended for
  /// the W part carry Pass::W.
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const;
  /// Selective recomputation (Korthikanti 2022 Sec 5): what each block recomputes.
  void selective_recompute(BlockContext& c, int layer, int mb) const;
  /// Parameters (elements) of the layer held by one TP rank: the sum over its blocks,
  /// sharded ones divided by `tp`. Equals flops.hpp layer_parameters_per_tp_rank (and,
  /// with tp = 1, layer_parameters) exactly; tests/unit/test_blocks.cpp checks it.
  double parameters_per_tp_rank(const ModelSpec& m, int64_t tp) const;

 private:
  std::vector<BlockSpec> spec_;
  std::vector<std::unique_ptr<Block>> blocks_;
};

/// Megatron-Core's dense layer: input_norm, attention, residual, post_attention_norm,
/// mlp, residual. The attention and MLP blocks read their variant (GQA, flash, rope;
/// GeLU / SwiGLU) from the ModelSpec and Training through the BlockContext.
std::vector<BlockSpec> dense_layer_spec(const ModelSpec& m);

/// The blocks of a whole model: embedding, the layers, LM head + loss.
class ModelBlocks {
 public:
  explicit ModelBlocks(const ModelSpec& m);
  /// The block list of global layer `index` (every layer is dense today).
  const Layer& layer(int64_t index) const;
  const Block& embedding() const { return *embedding_; }
  const Block& head() const { return *head_; }

 private:
  std::unique_ptr<Block> embedding_, head_;
  Layer dense_;
};

}  // namespace dtsim::blocks
