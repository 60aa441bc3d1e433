#pragma once
// MLP block: the up projection (and SwiGLU's gate) column-parallel, the activation (GeLU,
// or SwiGLU: Shazeer 2020), the down projection row-parallel and its TP reduction
// (Shoeybi 2019 Sec 3). FLOPs are flops.hpp's layer_forward_flops, divided by t per rank.
#include "models/blocks/block.hpp"

namespace dtsim::blocks {

/// One TP MLP's ops: a column-parallel up (+ gate), the activation, a row-parallel down.
/// The dense MLP and a MoE layer's shared expert (Megatron-Core SharedExpertMLP, the same
/// MLP module at its own width) emit them with their own op names and width.
struct MlpOps {
  double ffn = 0;      // inner width, whole (before TP)
  bool gated = false;  // SwiGLU (up and gate) or GeLU
  const char *up, *gate, *act, *down;
  const char *down_dgrad, *down_wgrad, *act_bwd, *up_dgrad, *up_wgrad;
};
/// The dense MLP of `m` (ffn_hidden, its activation; op names mlp_*, swiglu / gelu).
MlpOps dense_mlp_ops(const ModelSpec& m);
/// The ops of MlpBlock::forward / backward for `o` (FLOPs 2 tokens h ffn per GEMM, / t).
void mlp_forward(BlockContext& c, int layer, int mb, Phase ph, const MlpOps& o);
void mlp_backward(BlockContext& c, int layer, int mb, BackwardPart part, const MlpOps& o);

class MlpBlock : public Block {
 public:
  void forward(BlockContext& c, int layer, int mb, Phase ph) const override;
  /// B: output-gradient gather (SP), mlp_down dgrad, activation backward, up (+ gate)
  /// dgrad and its TP reduction. W: mlp_down_wgrad, then mlp_up_wgrad (up and gate as one
  /// GEMM, after the SP re-gather).
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const override;
  /// Up (+ gate for SwiGLU) h x ffn and down ffn x h weights, sharded; with linear biases
  /// (flops.hpp rule) the up (+ gate) biases sharded and the down bias (h) replicated.
  BlockParams parameters(const ModelSpec& m) const override;
  /// mlp_up = 2 tokens h ffn, mlp_gate = the same for SwiGLU (0 for GeLU), mlp_down =
  /// 2 tokens ffn h.
  void forward_flops(const ModelSpec& m, double tokens, double s_kv, ForwardFlops& out) const override;
  /// Korthikanti 2022 Sec 4.1, generalised for ffn != 4h and SwiGLU: fc1's input 2sbh
  /// (outside the TP region); inside it GeLU: fc1's output (the GeLU input) 2sbf and the
  /// GeLU output (fc2's input) 2sbf (= 8sbh each for f = 4h); SwiGLU: fc1's output [up,
  /// gate] 4sbf, which Megatron's fused SwiGLU saves, and the SwiGLU output (fc2's input) 2sbf.
  void activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const override;
};

}  // namespace dtsim::blocks
