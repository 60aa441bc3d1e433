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
// Main-grad dtype (Training.main_grad) sets the grads line: fp32 = 4 B, bf16 = 2 B per
// parameter, in every convention (the plan reduces gradients of the same dtype). Its default
// follows the framework (models/experiment_io.cpp): fp32 for megatron (Megatron accumulates and
// reduces fp32 main grads in bf16 training), bf16 for deepspeed and zero-paper, which gives the
// published accountings above; an explicit main_grad overrides them (explain says so).
// DDP gradient buckets: Megatron's buckets are views into its contiguous grad buffer, so they
// are the grads line and add nothing. DeepSpeed copies gradients into a separate "ipg" bucket
// of reduce_bucket_size elements (default 5e8, deepspeed/runtime/zero/config.py and the
// DeepSpeedZeroOptimizer constructor, stage_1_and_2.py) in the 16-bit dtype, two of them when
// overlap_comm (our training.overlap_grad_reduce) double-buffers: counted in other_bytes.
// DeepSpeed's own estimator (estimate_zero2_model_states_mem_needs, stage_1_and_2.py) is
// 2P + 18P/N for ZeRO-2 without offload: 2 (16-bit params) + 18/N (2 16-bit grads + 4 fp32
// grads + 4 fp32 params + 8 Adam m, v); older releases printed 4P + 16P/N. Our deepspeed
// convention reproduces 2P + 18P/N as params + grads + optimizer + the fp32 gradient partition
// (step_transient_bytes); e.g. GPT-J 6B base model (5,844,393,984 parameters, as
// AutoModel.from_pretrained("EleutherAI/gpt-j-6B") counts them) on 4 GPUs: 35.38 GiB.
// ZeRO sharding over the gradient-reduction group, N = dp * cp ranks (ZeRO Sec 5, Table 1;
// Megatron shards its distributed optimizer over DP x CP): stage 1 shards the optimizer
// state, stage 2 also the gradients, stage 3 also the parameters. Megatron's distributed
// optimizer is zero_stage 1 (6 + 12/N B/param). Which states count as sharded is read from
// grad_sync_policy (models/plan.hpp), the fact the plan builder emits its DP collectives
// from: gradients are sharded only where every micro-batch's gradients are reduce-scattered
// in their own backward and the other shards freed (ZeRO-2 and ZeRO-3), so the memory a
// layout is granted is the memory of the communication it is timed with. ZeRO-2 then holds
// the 1/N gradient shard plus the buckets being reduced (DeepSpeed's ipg buckets below);
// Megatron has no ZeRO-2 in its distributed optimizer and validation refuses it.
#include <cstdint>
#include <vector>

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
/// As above with the main-grad dtype: grads 4 (fp32) or 2 (bf16) B per parameter.
BytesPerParameter bytes_per_parameter(Framework f, GradDtype main_grad);
/// Bytes per gradient element reduced over DP (the grads line before sharding):
/// bytes_per_parameter(t.framework, t.main_grad).grads.
double dp_grad_bytes_per_param(const Training& t);

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
/// As above with t.framework and t.main_grad (bytes_per_parameter(f, main_grad)).
ModelStateBytes model_state_bytes(double params, const Layout& l, const Training& t);
/// The same for a rank holding `dense_params` reduced over DP x CP and `expert_params`
/// (routed experts) reduced and sharded over the expert-data-parallel group of size
/// l.edp(): Megatron-Core's MoE-aware theoretical memory (megatron/training/theory_memory_usage.py
/// after NVIDIA/Megatron-LM PR 4687: 6 + 12/DP bytes per dense and 6 + 12/EDP per expert
/// parameter under the distributed optimizer).
ModelStateBytes model_state_bytes(double dense_params, double expert_params, const Layout& l, const Training& t);

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
/// Each term is declared by the block that keeps it (models/blocks/: Block::activation_terms,
/// "sequence" = kept whole, "tensor" = sharded); this returns their sum,
/// blocks::Layer::activation_bytes.
double layer_activation_bytes(const ModelSpec& m, double s, int64_t b, double s_kv, int64_t t,
                              bool sequence_parallel, Recompute r, bool flash_attention);
/// The activation bytes per layer of pipeline rank `stage` for one micro-batch under
/// recomputation `r`: layer_activation_bytes when its layers are all alike, else the mean
/// over its layers by kind (models/blocks/layer_kind.hpp), MoE layers at the load factor of
/// models/moe.hpp.
double stage_layer_activation_bytes(const Experiment& e, int64_t stage, Recompute r, bool flash_attention);
/// The same with every layer's GEMM inputs kept at `gemm_input_scale` times their BF16 bytes
/// (blocks::ActivationShape::gemm_input_scale).
double stage_layer_activation_bytes(const Experiment& e, int64_t stage, Recompute r, bool flash_attention,
                                    double gemm_input_scale);

/// Micro-batches whose activations stage `stage` of `pp` holds at the peak of 1F1B:
/// min(pp - stage, accumulation) (Narayanan 2021 Sec 2.2; Korthikanti 2022 Sec 4.2.3 Eq. 5).
int64_t inflight_microbatches(int64_t pp, int64_t stage, int64_t accumulation);

/// Korthikanti 2022 Sec 4.2.3: the interleaved 1F1B schedule with v model chunks per stage
/// makes the first stage hold activations of L(1 + (p-1)/(p v)) layers instead of L.
/// Returns 1 for v == 1 (plain 1F1B, no interleaving) or p == 1.
double interleaved_activation_factor(int64_t pp, int64_t virtual_stages);

/// What pipeline rank `stage` holds at its activation peak, in model chunks (one chunk = one
/// micro-batch through L/(p v) layers; v = 1 without interleaving):
///  - gpipe: all m micro-batches' forwards before any backward: chunks = m.
///  - 1f1b: warm-up min(p - r - 1, m) forwards, the peak is one more: chunks = min(p - r, m)
///    (Narayanan 2021 Sec 2.2.1; Korthikanti 2022 Sec 4.2.3).
///  - interleaved: Megatron-LM's warm-up (core/pipeline_parallel/schedules.py,
///    forward_backward_pipelining_with_interleaving): warmup = (p - r - 1) * 2 + (v - 1) * p,
///    capped at m v; chunks = min(warmup + 1, m v). On rank 0 with m v > warmup this is
///    p v + p - 1 chunks of L/(p v) layers = L (1 + (p-1)/(p v)) layers (Korthikanti Eq. 5 note).
///  first_chunk_microbatches: how many of those chunks are the rank's first model chunk (the
///  one that holds the embedding on rank 0); Megatron orders forwards in groups of p
///  micro-batches per chunk: forward k runs chunk (k mod p v) / p.
///  held_layers: the sum of the held chunks' own layer counts (models/pipeline_split.hpp;
///  chunks x chunk_layers when the rank's chunks are even, as without the split options).
///  combined_1f1b (training.overlap_moe_expert_parallel_comm) and every other schedule: the
///  rank's own order walked (models/schedules/; the combined 1F1B's extra warm-up forward
///  holds one more chunk, Step::paired).
struct PipelineInflight {
  int64_t warmup = 0;                    // forwards before the first backward
  int64_t chunks = 0;                    // chunks whose activations are held at the peak
  int64_t chunk_layers = 0;              // layers of the rank's largest chunk (L / (p v) by default)
  int64_t first_chunk_microbatches = 0;  // micro-batches of the first chunk among them
  int64_t held_layers = 0;               // layer activations held, in (micro-batch, layer) pairs
};
/// `layers` is model.layers. Without interleaving a chunk is the whole stage; chunks are
/// split by pipeline_split (models/pipeline_split.hpp: uneven with its options, and by
/// default without interleaving; interleaving by default needs p v | L).
/// Throws InputError for stage outside [0, pp), accumulation < 1, vp < 1, or a split that
/// pipeline_split refuses (by default: layers < pp, or interleaving with p v not dividing
/// `layers`).
PipelineInflight pipeline_inflight(const Layout& l, int64_t layers, int64_t stage, int64_t accumulation,
                                   bool combined_1f1b);

/// Activations of one rank of a stage at its peak, bytes.
struct ActivationBreakdown {
  /// Model chunks held at the peak (pipeline_inflight().chunks): micro-batches for GPipe and
  /// 1F1B, (micro-batch, virtual stage) pairs for interleaved 1F1B.
  int64_t inflight = 0;
  int64_t chunk_layers = 0;           // layers of the rank's largest chunk (stage layers / vp when even)
  int64_t held_layers = 0;            // pipeline_inflight().held_layers
  int64_t stage_layers = 0;           // layers of this pipeline rank (stage_layer_count)
  int64_t warmup = 0;                 // pipeline warm-up forwards of this rank
  double per_layer_bytes = 0;         // layer_activation_bytes for one micro-batch
  double layers_bytes = 0;            // held_layers x per_layer_bytes
  /// held_layers / stage layers: "micro-batches' worth" of a whole stage.
  double inflight_microbatches() const;
  /// During the backward of one micro-batch with recompute, one layer's recomputed tensors
  /// are live: full -> a whole layer's no-recompute activations minus its stored input;
  /// selective -> the score term of one layer (0 with FlashAttention).
  double recompute_working_bytes = 0;
  /// First stage: the 1-byte dropout mask of the embedding output, sbh per micro-batch of the
  /// first chunk (/t with SP) (Korthikanti Sec 4.3, "sbhp/t").
  double embedding_bytes = 0;
  /// Last stage, one micro-batch: final-norm input 2sbh + LM-head input 2sbh (/t with SP)
  /// + fp32 logits for the cross entropy 4 s b V / t (Korthikanti Sec 4.3: 4sbh/t (1+V/h)).
  double output_bytes = 0;
  /// The MTP depths on the stage holding the loss (model.mtp_layers): per depth its entry's
  /// inputs, one layer of the last layer's kind and its head's terms, for one micro-batch.
  double mtp_bytes = 0;
  double total() const { return layers_bytes + recompute_working_bytes + embedding_bytes + output_bytes + mtp_bytes; }
};
/// s = seq_len / cp, b = micro_batch, accumulation = training.accumulation(layout).
/// Throws InputError for non-positive seq_len/micro_batch, accumulation < 1, or a bad stage.
ActivationBreakdown stage_activations(const Experiment& e, int64_t stage);

/// Per-rank memory of pipeline stage `stage`:
///  params/grads/optimizer: model_state_bytes(stage_parameters_per_rank(...)).
///  activations: stage_activations(...).total().
///  other: stage_buffers(...).total().
///  peak = sum (conservative: DeepSpeed's fp32 gradient partition lives during the optimizer
///  step, when activations are already freed); capacity = hbm_bytes - hbm_reserve_bytes (the
///  reserve is the node preset's, topologies/nodes/README.md: CUDA context + NCCL buffers);
///  fits = peak <= capacity.
/// Throws InputError for impossible inputs (see stage_activations, model_state_bytes,
/// stage_parameters_per_rank).
MemoryBreakdown stage_memory(const Experiment& e, int64_t stage);

/// One figure of a stage's breakdown, bytes: model states = params + grads + optimizer,
/// activations, or the peak (what `dtsim validate` compares with published.memory).
double memory_quantity(const MemoryBreakdown& mb, MemoryQuantity q);

/// The buffers of other_bytes, bytes per rank.
struct StageBuffers {
  /// ZeRO-3 (dp * cp > 1), 16-bit, gathered whole over DP x CP (still TP-sharded): the
  /// layer being computed plus the prefetched next one, plus the stage's non-layer
  /// parameters, which stay gathered through the step (the embedding on the first stage,
  /// the final norm and LM head on the last; FSDP's root unit, models/plan.cpp).
  double zero3_gathered_bytes = 0;
  /// DeepSpeed's ipg gradient buckets (see the header comment): buffers x bucket elements x
  /// 2 B, bucket = training.grad_bucket / 2 B or the 5e8-element default; 2 buffers when
  /// overlap_grad_reduce and pp == 1 (DeepSpeed's pipeline engine allocates one), else 1;
  /// ZeRO-0 flattens at most the stage's gradients. 0 for megatron (views into the grads
  /// buffer) and zero_paper (Table 1 counts no buffers).
  double grad_bucket_bytes = 0;
  /// DeepSpeed's fp32 gradient partition during the optimizer step
  /// (ModelStateBytes::step_transient_bytes).
  double step_transient_bytes = 0;
  /// CUDA graphs' static buffers (training.cuda_graphs; Megatron-LM @d98e8a64):
  ///  - layers (Transformer Engine's make_graphed_callables, the per-layer graphs): one
  ///    static sample set per captured (layer, micro-batch), reused once that micro-batch's
  ///    backward is done, so as many as the stage's held (micro-batch, layer) pairs
  ///    (ActivationBreakdown::held_layers); each the bf16 hidden states
  ///    2 (s/cp)/(t with SP) b h bytes (transformer_engine/pytorch/module.py sample args,
  ///    megatron/core/transformer/cuda_graphs.py TECudaGraphHelper) plus the bool attention
  ///    mask b (s/cp) s bytes of a graphed attention (transformer_layer.py).
  ///  - full_iteration: StaticBufferLoader keeps every micro-batch's input batch
  ///    (megatron/core/full_cuda_graph.py): tokens, labels and position ids (int64) and the
  ///    fp32 loss mask, 28 b s bytes per micro-batch, all accumulation micro-batches.
  /// The activations inside the graphs live in the graphs' memory pool with their eager
  /// lifetimes (counted in activations, not here).
  double cuda_graph_bytes = 0;
  /// A low-precision recipe's quantized weight copies (models/precision.hpp), held through the
  /// step: the stage's low-precision GEMM weights (stage_quantized_weights) x the recipe's
  /// weight bytes, rowwise and columnwise (Transformer Engine's cached FP8 weight workspaces),
  /// or only the columnwise copy with fp8_param_gather (the model weights are the rowwise one).
  double quantized_weight_bytes = 0;
  double total() const {
    return zero3_gathered_bytes + grad_bucket_bytes + step_transient_bytes + cuda_graph_bytes + quantized_weight_bytes;
  }
};
StageBuffers stage_buffers(const Experiment& e, int64_t stage);

// ---- memory-only path, for sweeps (no plan is built; microseconds per layout) ----

/// stage_memory of every pipeline stage, in stage order. The experiment is used as given
/// (load_experiment has validated it); impossible inputs still throw InputError.
std::vector<MemoryBreakdown> memory_per_stage(const Experiment& e);
/// The stage with the largest peak_bytes (the first one on ties); its `fits` says whether
/// the layout fits at all.
struct PeakMemory {
  int64_t stage = 0;
  MemoryBreakdown memory;
};
PeakMemory peak_memory(const Experiment& e);

}  // namespace dtsim
