#pragma once
// Norm (LayerNorm / RMSNorm) and the dropout + residual add that closes a sub-layer.
// Both are memory-bound element-wise kernels over norm_tokens x h elements (with sequence
// parallelism each rank holds 1/t of the sequence: Korthikanti 2022 Sec 4.2.2).
#include "models/blocks/block.hpp"

namespace dtsim::blocks {

/// Backward of an element-wise kernel reads the forward input and the output gradient
/// and writes the input gradient: 3 tensors against the forward's 2 (1.5x); norms make a
/// second pass for the weight-gradient reduction (2x). Assumption of this cost model.
inline constexpr double kElementwiseBwd = 1.5;
inline constexpr double kNormBwd = 2.0;

/// A norm kernel: reads and writes norm_tokens x h bf16 elements in forward, kNormBwd x
/// that in backward (the norm's weight gradient is reduced in the same kernel, so the
/// whole backward is B: zero-bubble defers only the linear layers' wgrad GEMMs).
/// `ph` is forward, recompute or backward.
void norm(BlockContext& c, const char* name, Phase ph, int layer, int mb);

/// Dropout + residual add: reads input and residual, writes the output (2 B each) and the
/// 1-byte dropout mask; kElementwiseBwd x that in backward.
void dropout_residual(BlockContext& c, const char* name, Phase ph, int layer, int mb);

/// The norm before a sub-layer ("input_norm", "post_attention_norm"; Megatron-Core's
/// input_layernorm / pre_mlp_layernorm). `bwd_name` names its backward op.
class NormBlock : public Block {
 public:
  NormBlock(const char* name, const char* bwd_name) : name_(name), bwd_name_(bwd_name) {}
  void forward(BlockContext& c, int layer, int mb, Phase ph) const override;
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const override;
  /// norm_parameters (flops.hpp): 2h for layernorm, h for rmsnorm; replicated over TP.
  BlockParams parameters(const ModelSpec& m) const override;
  /// Its input, 2sbh (Korthikanti 2022 Sec 4.1: "each layer norm stores its input with
  /// size 2sbh"), outside the TP regions. The input norm's is the layer's input.
  void activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const override;

 private:
  const char* name_;
  const char* bwd_name_;
};

/// The dropout + residual add after a sub-layer (Megatron-Core's bias_dropout_add).
class ResidualBlock : public Block {
 public:
  void forward(BlockContext& c, int layer, int mb, Phase ph) const override;
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const override;
  /// The 1-byte dropout mask, sbh (Korthikanti 2022 Sec 4.1: "the dropout mask with size
  /// sbh" after the attention and after the MLP), outside the TP regions. Counted for every
  /// model (conservative for dropout-free models).
  void activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const override;
};

}  // namespace dtsim::blocks
