#pragma once
// A block: one part of a transformer layer (norm, attention, residual, MLP) that appends
// its own ops for every pass through a BlockContext. A layer (models/blocks/layer.hpp) is
// an ordered list of blocks; its forward runs them in order, its backward in reverse.
// Blocks hold only their description (which slot they fill, the names their ops carry),
// never per-step state, so one list serves every layer and micro-batch.
//
// To add a block type: one file in models/blocks/ defining a Block subclass, and the line
// in layer.cpp's layer_spec that puts it into the layers that have it.
#include <vector>

#include "models/blocks/block_context.hpp"

namespace dtsim::blocks {

/// Parameters (elements) of a block by how Megatron shards them over TP (Shoeybi 2019
/// Sec 3; the counting rule of models/flops.hpp): GEMM weights and the biases of
/// column-parallel GEMMs are split over the t ranks; norms and the biases of row-parallel
/// GEMMs are replicated. Whole counts (exact in a double), so sums do not depend on order.
/// Routed experts (models/blocks/moe.hpp) are split neither by TP nor replicated: E / ep
/// experts on each rank, each expert's GEMMs over etp ranks (Megatron-Core parallel folding):
/// `expert_weights` counts all E experts' weights; a rank holds expert_weights / (ep etp).
struct BlockParams {
  double sharded_weights = 0;
  double replicated_weights = 0;
  double sharded_biases = 0;
  double replicated_biases = 0;
  double expert_weights = 0;
  /// Linear modules holding the weights, as Megatron-Core builds the block (one module per
  /// linear_* submodule: linear_qkv and linear_proj of SelfAttention, linear_fc1 and
  /// linear_fc2 of MLP, the router, megatron/core/transformer/): the units a per-submodule
  /// ZeRO-3 gathers one by one (models/zero3.hpp). `expert_linear_modules`: the routed
  /// experts' modules (TEGroupedMLP linear_fc1 and linear_fc2, every local expert's weights
  /// in each), gathered over the expert-data-parallel group.
  int linear_modules = 0;
  int expert_linear_modules = 0;
};

/// One tensor a block keeps from its forward for its backward (Korthikanti 2022, arXiv
/// 2205.05198, Sec 4.1 lists them per block), in bytes for one micro-batch, before any TP
/// division. Summed over a layer's blocks by Layer::activation_bytes (memory.hpp
/// layer_activation_bytes).
struct ActivationTerm {
  /// How the tensor is laid out over the TP ranks (Korthikanti 2022 Sec 4.2).
  enum class Split {
    /// Outside the TP regions (norm and dropout inputs, GEMM inputs before the
    /// all-gather): whole on every TP rank, split over TP with sequence parallelism
    /// (Korthikanti Sec 4.2.2).
    sequence,
    /// Inside a TP region (attention heads, MLP columns): split over TP.
    tensor,
  };
  const char* name = "";
  double bytes = 0;
  Split split = Split::sequence;
  /// Recomputed, not kept, under selective recomputation: the attention core (Korthikanti
  /// Sec 5). Full recomputation keeps only the layer input (Layer::activation_bytes).
  bool selective_recomputed = false;
  /// The block's input tensor (the layer's input when the block is the layer's first).
  bool input = false;
  /// Read only by a linear GEMM that keeps it for its weight gradient: under a low-precision
  /// recipe Transformer Engine keeps its quantized columnwise copy instead (linear.py /
  /// layernorm_linear.py save the quantized input; models/precision.hpp), scaled by
  /// ActivationShape::gemm_input_scale. Tensors another kernel also keeps in BF16 (the
  /// attention output FlashAttention saves for its backward) are not marked.
  bool gemm_input = false;
};

/// Sizes activation terms are counted at: b sequences of s local query tokens attending to
/// s_kv keys (s = seq/cp and s_kv = seq with context parallelism), FlashAttention or not.
struct ActivationShape {
  const ModelSpec& m;
  double s = 0;
  double b = 0;
  double s_kv = 0;
  bool flash_attention = false;
  /// MoE layers: the busiest EP rank's load factor (models/moe.hpp moe_load_factor): its
  /// routed-token tensors scale with it. 1 for a dense layer or balanced routing.
  double moe_load = 1.0;
  /// Bytes of a kept GEMM input (ActivationTerm::gemm_input) relative to BF16: the
  /// recipe's quantized bytes per element / 2 in a low-precision layer, else 1.
  double gemm_input_scale = 1.0;
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
  /// Adds the block's forward FLOPs, whole layer (not divided by TP), to the ForwardFlops
  /// terms it owns (flops.hpp conventions), for `tokens` = b s query tokens attending to
  /// s_kv keys. Its ops cost the same terms, per TP rank (BlockContext::fwd). None by default.
  virtual void forward_flops(const ModelSpec&, double /*tokens*/, double /*s_kv*/, ForwardFlops&) const {}
  /// Appends the tensors the block keeps for its backward (none by default).
  virtual void activation_terms(const ActivationShape&, std::vector<ActivationTerm>&) const {}
};

}  // namespace dtsim::blocks
