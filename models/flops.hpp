#pragma once
// FLOP counts and parameter counts of a decoder-only Transformer.
//
// Conventions (all counts are plain doubles / int64 element counts, no bytes here):
// - One multiply-add is 2 FLOPs: an (m x k) @ (k x n) GEMM costs 2 m k n FLOPs.
// - Only GEMMs (and the two attention batched GEMMs) are counted, as Narayanan et al. 2021
//   (arXiv 2104.04473) Sec 5.1 / Eq. 3 and Korthikanti et al. 2022 (arXiv 2205.05198)
//   Appendix A / Eq. 7-8 do; softmax, norms, activations, residuals are not counted.
// - Backward = 2 x forward (activation-gradient GEMM + weight-gradient GEMM).
// - Dense causal attention is counted in full (s x s_kv), as both papers do.
//
// Parameter counting rule (documented here, used everywhere):
// - GEMM weights: Q is h x h; K and V are h x (kv_heads * head_dim) each (GQA);
//   output projection h x h; MLP up h x ffn, gate h x ffn (SwiGLU only), down ffn x h.
// - Linear biases: a GPT-style block (activation == gelu) has a bias on every linear
//   layer (QKV, out proj, MLP up, MLP down) as GPT-2/GPT-3/Megatron GPT do; a Llama-style
//   block (activation == swiglu) has no linear biases (Touvron et al. 2023, Llama 2).
//   The rule is keyed on the activation, because ModelSpec has no explicit bias flag.
// - Norms: layernorm has weight + bias (2h), rmsnorm weight only (h); two per block,
//   plus one final norm before the LM head.
// - Input embedding V*h, plus max_pos*h for learned positions (rope has none).
// - LM head V*h when untied, none when tied to the input embedding.
#include <array>
#include <cstdint>

#include "models/blocks/layer_kind.hpp"
#include "models/experiment.hpp"

namespace dtsim {

/// One transformer layer, forward pass, WHOLE layer (not divided by TP), FLOPs.
struct ForwardFlops {
  double qkv = 0;               // 2 b s h (h + 2 kv_heads*head_dim)
  double attention_scores = 0;  // Q K^T: 2 b s s_kv (heads*head_dim)
  double attention_values = 0;  // softmax(.) V: 2 b s s_kv (heads*head_dim)
  double out_proj = 0;          // 2 b s (heads*head_dim) h
  double mlp_up = 0;            // 2 b s h ffn
  double mlp_gate = 0;          // 2 b s h ffn for SwiGLU, 0 for GeLU
  double mlp_down = 0;          // 2 b s ffn h
  // Mixture-of-experts layer (models/blocks/moe.hpp), model FLOPs at forced balance:
  double router = 0;            // gating GEMM: 2 b s h E (FP32 in Megatron-Core; counted here)
  double expert_up = 0;         // routed experts: 2 b s k h f_e (SwiGLU up)
  double expert_gate = 0;       // 2 b s k h f_e (SwiGLU gate)
  double expert_down = 0;       // 2 b s k f_e h
  double shared_up = 0;         // shared expert(s): 2 b s h f_s
  double shared_gate = 0;       // 2 b s h f_s
  double shared_down = 0;       // 2 b s f_s h
  // Multi-token prediction depth entry (models/blocks/mtp.hpp), not part of a layer:
  double mtp_eh_proj = 0;       // 2 b s (2h) h
  double total() const;
  /// Adds n x every term of `f` (n layers alike).
  void add(const ForwardFlops& f, double n);
};

/// Forward FLOPs of one layer for b sequences of s query tokens each, attending to s_kv
/// key tokens (s_kv = s without CP; with CP a rank holds s/cp queries against s keys).
/// Dense causal attention is counted in full, as Narayanan 2021 Eq. 3 and Korthikanti 2022
/// Eq. 7 do. GQA: K, V projections are kv_heads*head_dim wide. SwiGLU: mlp_gate is a
/// second h x ffn GEMM. For a GPT block (MHA, ffn = 4h, gelu) total() = 24 b s h^2 + 4 b s^2 h.
/// The sum of the terms the layer's blocks declare (models/blocks/ Block::forward_flops).
/// Throws InputError when b, s or s_kv is negative or the model has no heads/hidden.
ForwardFlops layer_forward_flops(const ModelSpec& m, int64_t b, int64_t s, int64_t s_kv);

/// The forward FLOPs of ALL layers, summed by term (layers differ in a MoE model: dense
/// first-k layers, MoE layers, local attention; models/blocks/layer.hpp layer_kind).
ForwardFlops layers_forward_flops(const ModelSpec& m, int64_t b, int64_t s, int64_t s_kv);
/// Layers of each kind (models/blocks/layer.hpp layer_kind) in the model.
std::array<int64_t, blocks::kLayerKinds> model_layer_kinds(const ModelSpec& m);

/// LM head (output projection to the vocabulary), forward: 2 b s h V FLOPs.
double lm_head_forward_flops(const ModelSpec& m, int64_t b, int64_t s);

/// Multi-token prediction (model.mtp_layers; models/blocks/mtp.hpp): the forward FLOPs of
/// the depths' transformer layers (each of the last decoder layer's kind), summed by term as
/// layers_forward_flops, with their entries' eh_proj (ForwardFlops::mtp_eh_proj). Their LM
/// heads are mtp_layers x lm_head_forward_flops. Megatron-LM counts the same
/// (training.py num_floating_point_operations: the MTP layers with the decoder's, "MTP eh
/// proj", and the logits x (mtp_num_layers + 1)). Zero without MTP.
ForwardFlops mtp_forward_flops(const ModelSpec& m, int64_t b, int64_t s, int64_t s_kv);

/// Model FLOPs of one optimizer step, whole cluster: 3 x forward (fwd + activation-grad +
/// weight-grad) of all layers and the LM head (and of the MTP depths, mtp_forward_flops,
/// with their LM heads), for `global_batch` sequences of `seq` tokens. No recompute
/// (Korthikanti 2022 Eq. 7 convention; for GPT blocks this equals
/// 72 B L s h^2 (1 + s/(6h) + V/(12hL)) exactly).
double model_flops_per_step(const ModelSpec& m, int64_t global_batch, int64_t seq);

/// Hardware FLOPs of one step: model FLOPs + recomputed forward work.
///  - full:      + one forward of every layer (not the LM head). For GPT blocks this is
///                Narayanan 2021 Eq. 3, 96 B s l h^2 (1 + s/(6h) + V/(16lh)), exactly.
///  - selective: + attention_scores + attention_values of every layer (one extra forward
///                of core attention, the recompute Korthikanti 2022 Sec 5 describes).
///                NOTE: Korthikanti Eq. 8 as printed, 72BLsh^2(1 + s/(3h) + V/(12hL)),
///                adds 12BLs^2h (three forward passes' worth of attention GEMMs) while
///                the text it is derived from adds one forward (4BLs^2h). We count the
///                one forward; Eq. 8 is larger by exactly 8 B L s^2 h (a test pins this).
///  - none:      + 0.
double hardware_flops_per_step(const ModelSpec& m, int64_t global_batch, int64_t seq, Recompute r);

/// Narayanan et al. 2021 Eq. 3 (full recompute, GPT): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
double narayanan_eq3_flops(int64_t B, int64_t s, int64_t l, int64_t h, int64_t V);
/// Korthikanti et al. 2022 Eq. 7 (model FLOPs, GPT): 72 B L s h^2 (1 + s/(6h) + V/(12 h L)).
double korthikanti_eq7_model_flops(int64_t B, int64_t s, int64_t L, int64_t h, int64_t V);
/// Korthikanti et al. 2022 Eq. 8 as printed (hardware FLOPs, selective recompute, GPT):
/// 72 B L s h^2 (1 + s/(3h) + V/(12 h L)). See hardware_flops_per_step for its relation
/// to our count.
double korthikanti_eq8_hardware_flops_selective(int64_t B, int64_t s, int64_t L, int64_t h, int64_t V);

/// True when the block has linear biases under the rule above (activation == gelu).
bool has_linear_biases(const ModelSpec& m);
/// Elements of one norm: 2h for layernorm (weight + bias), h for rmsnorm (weight).
int64_t norm_parameters(const ModelSpec& m);

/// Parameters (elements) of one transformer layer: QKV + out proj (GQA-aware), MLP (incl.
/// gate for SwiGLU), two norms, biases per the rule above. GPT: 12h^2 + 13h (Narayanan 2021
/// Sec 5.1). Llama-2 7B: 4h^2 + 3 h ffn + 2h = 202,383,360. The sum of the parameters the
/// layer's blocks declare (models/blocks/ Block::parameters), as layer_parameters_per_tp_rank.
int64_t layer_parameters(const ModelSpec& m);
/// Parameters (elements) of global layer `index`, the routed experts included (all E).
int64_t layer_parameters_at(const ModelSpec& m, int64_t index);
/// Parameters a token uses: total_parameters less the (1 - k/E) share of the routed experts
/// (the "activated parameters" of DeepSeek-V3 Table 1 / Qwen3 model cards).
int64_t active_parameters(const ModelSpec& m, int64_t seq_len);
/// Input embedding: V h, plus learned positions max_pos h (max_pos =
/// m.max_position_embeddings, or `seq_len_for_learned_positions` when that is 0).
int64_t embedding_parameters(const ModelSpec& m, int64_t seq_len_for_learned_positions);
/// Output layer: V h when untied, 0 when tied to the input embedding.
int64_t lm_head_parameters(const ModelSpec& m);
/// Whether the rank holding the loss keeps its own copy of the word embedding when it does
/// not hold the embedding (pp > 1): with tied weights (Megatron's copy for the LM head) and
/// with MTP, whose depths embed the shifted tokens (Megatron-Core language_module.py
/// setup_embeddings_and_output_layer: "we also need to maintain duplicated embedding weights
/// in mtp process stage"). Its gradient is summed with the first stage's
/// (embedding_grad_allreduce).
inline bool loss_stage_embeds(const ModelSpec& m) { return m.tied_embeddings || m.mtp_layers > 0; }
/// Parameters (elements) of the mtp_layers MTP depths' entries (models/blocks/mtp.hpp:
/// eh_proj, enorm, hnorm, final norm) on one TP rank; their layers count with the layers
/// (stage_layer_kinds).
double mtp_entry_parameters_per_rank(const ModelSpec& m, int64_t tp);
/// Whole model: L layers + embedding + final norm + LM head (a tied LM head counted once),
/// and the MTP depths (layers and entries; DeepSeek-V3's config.json: 671B + 14B of MTP).
/// GPT-3 175B (L=96, h=12288, V=51200, s=2048, tied) = Narayanan 2021 Sec 5.1
/// 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)) + 2h (the final layernorm, which that formula omits).
int64_t total_parameters(const ModelSpec& m, int64_t seq_len);
/// The same count as a double, summed without integer products, so that it can be checked
/// against limits::kMaxParameters (models/checked.hpp) before any 64-bit count is formed.
/// Throws InputError as total_parameters.
double total_parameters_f(const ModelSpec& m, int64_t seq_len);

/// Parameters (elements) of one transformer layer held by ONE tensor-parallel rank
/// (Megatron sharding, Shoeybi et al. 2019 Sec 3): GEMM weights / t; biases of
/// column-parallel layers (QKV, MLP up/gate) / t; biases of row-parallel layers (out proj,
/// MLP down) and the norms replicated. Returns a double because t need not divide evenly
/// in what-if studies.
double layer_parameters_per_tp_rank(const ModelSpec& m, int64_t tp);

/// Transformer layers held by pipeline stage `stage` over all its model chunks, as
/// models/pipeline_split.hpp splits them (rank_split). By default: L / pp when pp divides L;
/// otherwise every stage gets ceil(L / pp) and the missing layers are taken one each from
/// the first and last stages, then the second and second-to-last, ... (the stages that also
/// hold the embedding and the LM head), as Llama 3 does for 126 layers on PP16
/// (Dubey et al. 2024, "The Llama 3 Herd of Models", Sec 3.3.2: "reduce one Transformer
/// layer each from the first and the last stages"); with layout.vp, L / pp. Megatron-Core's
/// layout.* split options change it as pipeline_split documents. Throws InputError when
/// the split is impossible (by default pp > L) or stage is outside [0, pp).
int64_t stage_layer_count(const ModelSpec& m, const Layout& l, int64_t stage);
/// Index of the first layer of pipeline stage `stage`: the first layer of its first model
/// chunk that holds layers (without interleaving, the sum of the previous stages' counts).
int64_t stage_first_layer(const ModelSpec& m, const Layout& l, int64_t stage);

/// Parameters (elements) held by ONE rank of pipeline stage `stage` with layout `l`, the sum
/// over its model chunks (models/pipeline_split.hpp): its stage_layer_count layers sharded as
/// layer_parameters_per_tp_rank; the rank whose chunk holds the embedding (stage 0) also the
/// word embedding (vocab-parallel, V h / t) and the learned position embedding
/// (replicated over TP); the one whose chunk holds the loss (the last stage) the final norm
/// (replicated) and the LM head (V h / t), with MTP its depths (stage_layer_kinds, and
/// mtp_entry_parameters_per_rank); with tied embeddings or MTP on two ranks (pp > 1) the
/// last stage holds its own copy of the word embedding as Megatron does (with pp == 1 it is
/// shared, counted once; loss_stage_embeds). No ZeRO
/// sharding here. Throws InputError for stage outside [0, pp) or a non-positive tp/pp.
double stage_parameters_per_rank(const ModelSpec& m, const Layout& l, int64_t seq_len, int64_t stage);
/// Layers of each kind held by pipeline rank `stage` over its chunks, the MTP depths' layers
/// (model.mtp_layers, of the last layer's kind) included on the rank holding the loss:
/// Megatron-Core places them with the loss by default (multi_token_prediction.md, "all MTP
/// layers sit on the last pipeline stage"). Their parameters, gradients and ZeRO shards
/// follow the layers'.
std::array<int64_t, blocks::kLayerKinds> stage_layer_kinds(const ModelSpec& m, const Layout& l, int64_t stage);
/// The routed-expert part of stage_parameters_per_rank (elements on one rank: E / ep experts
/// of each MoE layer, each over etp ranks), whose gradients are reduced over the
/// expert-data-parallel group instead of DP x CP. 0 for a dense model.
double stage_expert_parameters_per_rank(const ModelSpec& m, const Layout& l, int64_t stage);

}  // namespace dtsim
