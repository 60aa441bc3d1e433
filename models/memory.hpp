#pragma once
// Per-rank memory of one pipeline stage: model states (params, grads, optimizer) with ZeRO
// sharding, activations (Korthikanti 2022 Table 2, generalised) and buffers. Bytes.
//
// Units: bytes (1 GB = 1e9 B as in ZeRO Table 1; Korthikanti's figure values are GiB = 2^30 B).
//
// Model-state accounting (bytes per parameter; Training.framework selects it):
//  - megatron:   2 (bf16 param) + 4 (fp32 main grad, Megatron accumulates and reduces
//                gradients in fp32 "main_grad" buffers) + 12 (fp32 master + Adam m + v)
//                = 18 B/param. Source: Megatron Core developer guide, "Distributed
//                Optimizer" (docs.nvidia.com/megatron-core/developer-guide/latest/
//                api-guide/dist_optimizer.html): "bf16 parameters, fp32 gradients:
//                non-distributed 18, distributed 6 + 12/d" bytes per parameter.
//  - zero_paper: 2 (fp16/bf16 param) + 2 (16-bit grad) + K = 12 (fp32 master, m, v)
//                = 16 B/param. Source: Rajbhandari et al. 2020 (ZeRO, arXiv 1910.02054)
//                Sec 3.1 and Table 1 (Pos: 4Psi + K Psi/Nd, Pos+g: 2Psi + (2+K)Psi/Nd,
//                Pos+g+p: (2+2+K)Psi/Nd). Nothing else is counted (a pure Table 1 model).
//  - deepspeed:  the same 2 + 2 + 12 and the same sharding; the difference is that
//                DeepSpeed's ZeRO optimizer upcasts this rank's gradient partition to fp32
//                for the optimizer step (deepspeed/runtime/zero/stage_1_and_2.py step():
//                `single_partition_of_fp32_groups[i].grad = single_grad_partition`, freed
//                after the step): + 4 B per owned parameter, reported as a transient in
//                other_bytes (4 P / N; with zero_stage 0 the "partition" is everything).
// ZeRO sharding over the gradient-reduction group, N = dp * cp ranks (ZeRO Sec 5, Table 1;
// Megatron shards its distributed optimizer over DP x CP): stage 1 shards the optimizer
// state, stage 2 also the gradients, stage 3 also the parameters. Megatron's distributed
// optimizer is zero_stage 1 (6 + 12/N B/param).
#include <cstdint>

#include "models/experiment.hpp"
#include "models/result.hpp"

namespace dtsim {

/// Bytes per parameter of each model state before sharding.
struct BytesPerParameter {
  double params = 0;
  double grads = 0;
  double optimizer = 0;
};
/// megatron 2/4/12, zero_paper 2/2/12, deepspeed 2/2/12 (see the header comment).
BytesPerParameter bytes_per_parameter(Framework f);

/// Model-state bytes of one rank holding `params` parameters (elements, after TP/PP
/// sharding), sharded by ZeRO stage `l.zero_stage` over N = l.dp * l.cp ranks.
struct ModelStateBytes {
  double params_bytes = 0;
  double grads_bytes = 0;
  double optimizer_bytes = 0;
  /// DeepSpeed's fp32 copy of the owned gradient partition during the optimizer step
  /// (0 for megatron and zero_paper). Not part of total().
  double step_transient_bytes = 0;
  double total() const { return params_bytes + grads_bytes + optimizer_bytes; }
};
/// E.g. ZeRO Table 1, 7.5B at Nd = 64, zero_paper: stage 0/1/2/3 -> 120 / 31.4 / 16.6 /
/// 1.88 GB. Throws InputError for params < 0, zero_stage outside 0..3 or dp, cp < 1.
ModelStateBytes model_state_bytes(double params, const Layout& l, Framework f);

/// Korthikanti et al. 2022 (arXiv 2205.05198) Table 2 closed forms, bytes of activations
/// per transformer layer per (tensor-parallel) rank, for a GPT block (16-bit activations,
/// 1-byte dropout masks, ffn = 4h, MHA, no FlashAttention):
///   none,  t=1 or TP only: sbh(10 + 24/t + 5as/(ht))   (Eq. 2; t=1 gives Eq. 1 sbh(34+5as/h))
///   none,  TP + SP:        sbh(34/t + 5as/(ht))        (Eq. 4)
///   selective, TP:         sbh(10 + 24/t)
///   selective, TP + SP:    34 sbh / t                  (Eq. 6)
///   full (either):         2 sbh                       (only the layer input)
double korthikanti_table2_layer_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t,
                                      bool sequence_parallel, Recompute r);

/// Bytes of activations one transformer layer keeps for its backward, per TP rank, for one
/// micro-batch of b sequences with s local query tokens attending to s_kv keys
/// (s = seq/cp and s_kv = seq with context parallelism). Generalises Table 2 by tensor size
/// (Korthikanti Sec 4.1 breakdown; h = hidden, f = ffn, kv = kv_heads*head_dim, a = heads):
///   kept whole on every TP rank (sharded only with SP): 2 norm inputs 4sbh, attention
///     input 2sbh, attention-output dropout mask sbh, MLP input 2sbh, MLP dropout mask sbh
///     = 10sbh;
///   sharded over TP: Q 2sbh, K and V 2sb*kv each, out-proj input 2sbh,
///     MLP inner tensors: gelu 4sbf (GeLU input + output), swiglu 6sbf (fc1 output = up and
///     gate, 2 x 2sbf, which Megatron's fused SwiGLU saves, plus the SwiGLU output 2sbf
///     that feeds fc2), and unless FlashAttention the score term 5 a s s_kv b (softmax
///     output 2, dropout mask 1, dropout output 2 bytes per score).
///   For a GPT block (kv = h, f = 4h, gelu) this is 10sbh + (24sbh + 5as^2b)/t = Table 2.
///   no SP: whole + sharded/t; SP: (whole + sharded)/t.
///   selective: drops the score term (FlashAttention already has none, so selective ==
///     none with FlashAttention). full: 2sbh, the layer input (2sbh/t with SP, as Megatron
///     checkpoints the sequence-sharded input).
/// Dropout masks are counted for every model (conservative for dropout-free models).
/// FlashAttention's per-row softmax statistics (4 a s b / t bytes, fp32) are neglected.
double layer_activation_bytes(const ModelSpec& m, double s, int64_t b, double s_kv, int64_t t,
                              bool sequence_parallel, Recompute r, bool flash_attention);

/// Micro-batches whose activations stage `stage` of `pp` holds at the peak of 1F1B:
/// min(pp - stage, accumulation) (Narayanan 2021 Sec 2.2; Korthikanti 2022 Sec 4.2.3 Eq. 5).
int64_t inflight_microbatches(int64_t pp, int64_t stage, int64_t accumulation);

/// Korthikanti 2022 Sec 4.2.3: the interleaved 1F1B schedule with v model chunks per stage
/// makes the first stage hold activations of L(1 + (p-1)/(p v)) layers instead of L.
/// Returns 1 for v == 1 (plain 1F1B, no interleaving) or p == 1.
/// Layout has no virtual-pipeline field yet; exposed for checks against the paper.
double interleaved_activation_factor(int64_t pp, int64_t virtual_stages);

/// Activations of one rank of a stage at its peak, bytes.
struct ActivationBreakdown {
  int64_t inflight = 0;               // micro-batches held (1F1B)
  double layers_bytes = 0;            // inflight x stage layers x layer_activation_bytes
  /// During the backward of one micro-batch with recompute, one layer's recomputed tensors
  /// are live: full -> a whole layer's no-recompute activations minus its stored input;
  /// selective -> the score term of one layer (0 with FlashAttention).
  double recompute_working_bytes = 0;
  /// First stage: the 1-byte dropout mask of the embedding output, sbh per micro-batch
  /// (/t with SP) (Korthikanti Sec 4.3, "sbhp/t").
  double embedding_bytes = 0;
  /// Last stage, one micro-batch: final-norm input 2sbh + LM-head input 2sbh (/t with SP)
  /// + fp32 logits for the cross entropy 4 s b V / t (Korthikanti Sec 4.3: 4sbh/t (1+V/h)).
  double output_bytes = 0;
  double total() const { return layers_bytes + recompute_working_bytes + embedding_bytes + output_bytes; }
};
/// s = seq_len / cp, b = micro_batch, accumulation = training.accumulation(layout).
/// Throws InputError for non-positive seq_len/micro_batch, accumulation < 1, or a bad stage.
ActivationBreakdown stage_activations(const Experiment& e, int64_t stage);

/// Per-rank memory of pipeline stage `stage`:
///  params/grads/optimizer: model_state_bytes(stage_parameters_per_rank(...)).
///  activations: stage_activations(...).total().
///  other: ZeRO-3 -> two gathered layers' 16-bit params (current + prefetch, TP-sharded,
///    whole over the DP x CP group); deepspeed -> the fp32 gradient-partition transient.
///    DP gradient buckets live inside grads (Megatron's contiguous grad buffer).
///  peak = sum; capacity = hbm_bytes - hbm_reserve_bytes; fits = peak <= capacity.
/// Throws InputError for impossible inputs (see stage_activations, model_state_bytes,
/// stage_parameters_per_rank).
MemoryBreakdown stage_memory(const Experiment& e, int64_t stage);

}  // namespace dtsim
