#pragma once
// Self-attention block: QKV projection (column-parallel), rotary embedding, the attention
// core (flash or unfused, MHA or GQA, with the context-parallel K/V ring), the output
// projection (row-parallel) and its TP reduction (Shoeybi 2019 Sec 3; Korthikanti 2022
// Sec 4). FLOPs are flops.hpp's layer_forward_flops, divided by t per rank.
#include "models/blocks/block.hpp"

namespace dtsim::blocks {

/// Bytes per attention-score element moved by unfused attention in forward: write QK^T
/// (2), softmax read (2) + write (2), dropout read (2) + mask write (1) + write (2), AV read
/// (2) = 13; the tensors Korthikanti 2022 Sec 4.1 lists for the attention core.
inline constexpr double kUnfusedScoreBytes = 13.0;

/// What the attention core of a layer works on, per TP rank: the query / key head size and
/// the value head size, and the widths (elements per token, local heads x head size) of Q,
/// K, V and the output. Dense attention (MHA / GQA): qk_head = v_head = head_dim, q = out =
/// heads head_dim / t, k = v = kv_heads head_dim / t. MLA (models/blocks/mla.hpp): after the
/// up-projections every head has its own K and V, qk_head = qk_nope + qk_rope, v_head =
/// v_head_dim (DeepSeek-V2, arXiv 2405.04434, Sec 2.1.2-2.1.3).
struct CoreShape {
  double qk_head = 0, v_head = 0;
  double q = 0, k = 0, v = 0, out = 0;
  /// Forward FLOPs of this rank: Q K^T and softmax(.) V (flops.hpp convention: causal
  /// attention counted in full).
  double scores_flops = 0, values_flops = 0;
  /// FlashAttention work of this layer relative to a causal layer's (BlockContext
  /// attn_fwd_work / attn_bwd_work): 1, or a sliding window's (window_work).
  double work = 1;
};

/// Keys each query of a sliding-window layer is counted with: min(window, s_kv) (the
/// counting convention of flops.hpp, which counts causal attention in full: s_kv keys).
double window_keys(const ModelSpec& m, double s_kv);
/// FlashAttention work of a local-attention layer of window w over a sequence of S, relative
/// to a causal layer's, each against its own counted FLOPs (S w counted pairs, window_keys):
///   sliding: a query at position i attends to min(i + 1, w) keys, sum_i = S w - w (w - 1) / 2,
///     i.e. 1 - (w - 1) / (2 S) of the counted pairs (the kernel skips the key blocks outside
///     the band as it skips those above the diagonal: Dao 2023, FlashAttention-2 Sec 3.1.1,
///     "local" attention of its window_size argument);
///   chunked: n = floor(S / w) full chunks and a last one of r = S - n w tokens, each causal,
///     n w (w + 1) / 2 + r (r + 1) / 2 pairs (a block-diagonal causal mask whose empty blocks a
///     block-sparse kernel skips: Dong et al. 2024, "Flex Attention: A Programming Model for
///     Generating Optimized Attention Kernels", arXiv 2412.05496, block masks);
/// each divided by the causal layer's fraction (compute_cost.hpp kFlashCausalWork). 1 when
/// w >= S.
double window_work(double window, double S, bool chunked = false);

/// The dense core of the context's model (heads, kv_heads, head_dim): its FLOPs from the
/// model (2 b s S q each, S = seq_len, or window_keys for a `windowed` layer).
CoreShape dense_core_shape(const BlockContext& c, bool windowed = false);

/// The attention core forward (softmax(Q K^T) V) of one layer, or its recomputation
/// (ph = Phase::recompute: Korthikanti 2022 Sec 5 selective recomputation). With CP the
/// remote K/V blocks arrive by a ring AllGather while the local block computes.
void attention_core_forward(BlockContext& c, const CoreShape& a, Phase ph, int layer, int mb);
/// Its backward (all B: it produces the Q, K, V gradients; it has no weights). With CP,
/// K/V circulate again and dK/dV are reduce-scattered back to their owners.
void attention_core_backward(BlockContext& c, const CoreShape& a, int layer, int mb);

class AttentionBlock : public Block {
 public:
  /// `windowed`: local (sliding-window) attention in this layer (model.attention.window).
  explicit AttentionBlock(bool windowed = false) : windowed_(windowed) {}
  void forward(BlockContext& c, int layer, int mb, Phase ph) const override;
  /// B: output-gradient gather (SP), out_proj dgrad, core backward, rope backward, QKV
  /// dgrad and its TP reduction. W: out_proj_wgrad, then qkv_wgrad (after the SP re-gather).
  void backward(BlockContext& c, int layer, int mb, BackwardPart part) const override;
  void selective_recompute(BlockContext& c, int layer, int mb) const override;
  /// QKV h x (q + 2 kv) and out_proj q x h weights (GQA-aware), sharded; with linear
  /// biases (flops.hpp rule) the QKV bias sharded and the out_proj bias (h) replicated.
  BlockParams parameters(const ModelSpec& m) const override;
  /// qkv = 2 tokens h (q + 2 kv), attention_scores = attention_values = 2 tokens s_kv q,
  /// out_proj = 2 tokens q h, with q = heads head_dim and kv = kv_heads head_dim (GQA).
  /// Dense causal attention counted in full (Narayanan 2021 Eq. 3, Korthikanti 2022 Eq. 7);
  /// a windowed layer counts window_keys keys instead of s_kv. With model.attention.sinks
  /// the per-head sink logits (GPT-OSS) add heads parameters and no counted FLOPs.
  void forward_flops(const ModelSpec& m, double tokens, double s_kv, ForwardFlops& out) const override;
  /// Korthikanti 2022 Sec 4.1, generalised for GQA (q = heads head_dim, kv = kv_heads
  /// head_dim): the QKV GEMMs' shared input 2sbh (outside the TP region); inside it Q 2sbq,
  /// K 2sb kv, V 2sb kv (the QK^T and attention-over-V operands), the output projection's
  /// input 2sbq; unless FlashAttention, the score term 5 a s s_kv b (softmax output 2,
  /// dropout mask 1, dropout output 2 bytes per score), which selective recomputation
  /// recomputes (Sec 5). FlashAttention's per-row softmax statistics (4 a s b, fp32) are
  /// neglected.
  void activation_terms(const ActivationShape& a, std::vector<ActivationTerm>& out) const override;
 private:
  bool windowed_ = false;
};

}  // namespace dtsim::blocks
