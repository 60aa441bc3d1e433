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
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "models/blocks/block.hpp"
#include "models/blocks/layer_kind.hpp"

namespace dtsim::blocks {

enum class BlockKind { norm, attention, mla, residual, mlp, moe };

/// One slot of a layer: the block type and, for a norm, the names of its ops.
struct BlockSpec {
  BlockKind kind = BlockKind::norm;
  const char* name = "";      // norm: forward op name ("input_norm", ...)
  const char* bwd_name = "";  // norm: backward op name ("input_norm_bwd", ...)
  /// attention: local (sliding-window) attention in this layer (model.attention.window).
  bool windowed = false;
};

/// The block list of one layer, instantiated from its description.
class Layer {
 public:
  explicit Layer(std::vector<BlockSpec> spec);
  const std::vector<BlockSpec>& spec() const { return spec_; }
  /// The block of slot `i` (0 <= i < spec().size()).
  const Block& block(size_t i) const { return *blocks_.at(i); }
  /// Forward (Phase::forward) or full recomputation (Phase::recompute) of layer `layer`.
  void forward(BlockContext& c, int layer, int mb, Phase ph) const;
  /// Backward, or its B or W part (BackwardPart); blocks in reverse order. Ops appended for
  /// the W part carry Pass::W.
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const;
  /// Selective recomputation (Korthikanti 2022 Sec 5): what each block recomputes.
  void selective_recompute(BlockContext& c, int layer, int mb) const;
  /// Parameters (elements) of the layer held by one TP rank: the sum over its blocks,
  /// sharded ones divided by `tp`. flops.hpp layer_parameters_per_tp_rank returns it (and
  /// layer_parameters the tp = 1 sum); tests/unit/test_block_terms.cpp checks the plan.
  double parameters_per_tp_rank(const ModelSpec& m, int64_t tp) const;
  /// The sum of the blocks' parameters (elements, before TP sharding), by sharding class.
  BlockParams parameters(const ModelSpec& m) const;
  /// Forward FLOPs of the layer, whole layer (not divided by TP): the sum of the FLOPs
  /// each block declares (Block::forward_flops) for `tokens` = b s query tokens attending to
  /// s_kv keys. flops.hpp layer_forward_flops returns it.
  ForwardFlops forward_flops(const ModelSpec& m, double tokens, double s_kv) const;
  /// The tensors the blocks keep for the backward, in block order (Block::activation_terms).
  std::vector<ActivationTerm> activation_terms(const ActivationShape& a) const;
  /// Activation bytes the layer keeps per TP rank (t = tp) for one micro-batch: the sum of
  /// its blocks' terms, memory.hpp layer_activation_bytes (which documents the formula and
  /// returns this). Without SP: sequence terms whole + tensor terms / t; with SP all / t.
  /// Selective recomputation drops the selective_recomputed terms; full recomputation keeps
  /// only the layer's input (the first block's input terms), which Megatron checkpoints
  /// (sequence-sharded with SP).
  double activation_bytes(const ActivationShape& a, int64_t tp, bool sequence_parallel, Recompute r) const;

 private:
  std::vector<BlockSpec> spec_;
  std::vector<std::unique_ptr<Block>> blocks_;
};

/// Sums of activation terms by split, bytes before TP division, added in term order.
/// `selective` holds the selective_recomputed tensor-split terms (sequence-split ones, of
/// which no block has any today, count in `sequence`).
struct ActivationSums {
  double sequence = 0;
  double tensor = 0;
  double selective = 0;
};
ActivationSums sum_activation_terms(const std::vector<ActivationTerm>& terms);

/// Megatron-Core's dense layer: input_norm, attention, residual, post_attention_norm,
/// mlp, residual. The attention and MLP blocks read their variant (GQA, flash, rope;
/// GeLU / SwiGLU) from the ModelSpec and Training through the BlockContext.
std::vector<BlockSpec> dense_layer_spec(const ModelSpec& m);
/// A layer of kind `kind` (LayerKind): the dense list with the MLP replaced by the MoE block
/// (Megatron-Core get_gpt_layer_with_transformer_engine_spec with num_experts: mlp = MoELayer),
/// local attention (model.attention.window) and / or the attention replaced by multi-head
/// latent attention (multi_latent_attention: self_attention = MLASelfAttention).
std::vector<BlockSpec> layer_spec(const ModelSpec& m, int kind);

/// Layers of each kind among global layers [first, first + count).
std::array<int64_t, kLayerKinds> layer_kind_counts(const ModelSpec& m, int64_t first, int64_t count);

/// Parameters (elements) of one layer on one rank of `l`, split by the group that reduces
/// their gradients: `dense` (attention, norms, router, shared experts, a dense MLP: TP
/// sharded as parameters_per_tp_rank, reduced over DP x CP) and `expert` (the routed experts:
/// E / ep experts, each split over etp, reduced over the expert-data-parallel group;
/// Megatron-Core parallel folding, models/rank_grid.hpp).
struct RankParams {
  double dense = 0;
  double expert = 0;
  double total() const { return dense + expert; }
};

/// The blocks of a whole model: embedding, the layers, LM head + loss.
class ModelBlocks {
 public:
  explicit ModelBlocks(const ModelSpec& m);
  /// The block list of global layer `index` (its layer_kind; an MTP layer, index >=
  /// model.layers, the last layer's).
  const Layer& layer(int64_t index) const {
    return kind(layer_kind(moe_, attention_, mla_, kind_source_layer(layers_, index)));
  }
  /// The block list of a layer kind (0 <= k < kLayerKinds).
  const Layer& kind(int k) const;
  const Block& embedding() const;
  const Block& head() const;
  /// The entry of a multi-token prediction depth (models/blocks/mtp.hpp).
  const Block& mtp_entry() const;

 private:
  // What picks a layer's kind (layer_kind); the rest of the ModelSpec is read by the blocks
  // through their BlockContext. Copies without heap allocation for a dense model.
  MoeSpec moe_;
  AttentionWindow attention_;
  bool mla_ = false;
  int64_t layers_ = 0;  // decoder layers (model.layers)
  // Blocks hold no per-model state (block.hpp), so the embedding, the head and the block list
  // of each layer kind are built once per process and shared (layer.cpp).
};

}  // namespace dtsim::blocks
